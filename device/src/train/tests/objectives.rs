//! Every objective moves the head differently from plain cross-entropy on the same data, seed
//! and batches: a method that silently fell back to cross-entropy fails here.

use super::*;
use fedge_wire::StableSchedule;

/// `‖a − b‖ / ‖b‖` over the head's part of two deltas.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let gap: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let norm: f32 = b.iter().map(|y| y * y).sum();
    (gap / norm).sqrt()
}

#[test]
fn every_objective_moves_the_head_differently_from_cross_entropy() {
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let data = two_blobs();
    let device = training_device(Backend::Flex);
    let base = TrainParams {
        local_epochs: 1,
        batch_size: 8,
        learning_rate: 0.1,
        ..TrainParams::default()
    };
    let head_delta = |params: &TrainParams, inputs: RoundInputs| {
        let layout = ModelLayout::new(config.clone(), params.objective.carries_generator());
        // The same head for every objective (the generator, when there is one, after it).
        let mut global = config.init_flat(5);
        global.extend(layout.init_flat(5)[config.num_params()..].iter().copied());
        let job = TrainJob::new(&config, &global, &data, params, &device)
            .with_inputs(inputs)
            .with_seed(9);
        let out = train_local(&job, &mut LocalState::default()).unwrap();
        (out.delta[..config.num_params()].to_vec(), out.steps)
    };
    let (ce, ce_steps) = head_delta(&base, RoundInputs::default());
    assert_eq!(ce_steps, 5);

    let prox = TrainParams {
        objective: Objective::FedProx,
        prox_mu: 1.0,
        ..base.clone()
    };
    // A nonzero global insight for FedDIM's pull.
    let insight: Vec<f32> = (0..2 * 8 * 2).map(|i| (i % 5) as f32 * 0.1).collect();
    let feddim = TrainParams {
        objective: Objective::FedDim,
        insight_lambda: 1.0,
        ..base.clone()
    };
    // Stable-FedADG over the same five batches, all on L_S (E0 = 5, E1 = 0): only the sample
    // weights differ from cross-entropy's uniform mean; and with its adversarial batches.
    let weights_only = TrainParams {
        objective: Objective::StableFedAdg,
        stable_schedule: StableSchedule::Epochs,
        warmup_batches: 5,
        adversarial_batches: 0,
        ..base.clone()
    };
    let adversarial = TrainParams {
        warmup_batches: 2,
        adversarial_batches: 3,
        ..weights_only.clone()
    };
    // Without its sample weights and its adversarial batches, it is cross-entropy itself.
    let unweighted = TrainParams {
        objective: Objective::FedAdg,
        ..weights_only.clone()
    };
    let (plain, _) = head_delta(&unweighted, RoundInputs::default());
    let gap = relative_gap(&plain, &ce);
    assert!(gap < 1e-5, "uniform weights, no adversarial batch: {gap:e}");
    let views = blob_views(&data);
    let fedddl = TrainParams {
        objective: Objective::FedDdl,
        ..base.clone()
    };
    let cases: [(&str, TrainParams, RoundInputs, f32); 6] = [
        ("fedprox", prox, RoundInputs::default(), 1e-3),
        (
            "feddim",
            feddim,
            RoundInputs {
                insight: Some(&insight),
                ..RoundInputs::default()
            },
            1e-2,
        ),
        (
            "stable-fedadg, weights only",
            weights_only,
            RoundInputs::default(),
            1e-5,
        ),
        (
            "stable-fedadg, adversarial",
            adversarial.clone(),
            RoundInputs::default(),
            1e-2,
        ),
        (
            "fedadg (no sample weights), adversarial",
            TrainParams {
                objective: Objective::FedAdg,
                ..adversarial
            },
            RoundInputs::default(),
            1e-2,
        ),
        (
            "fedddl",
            fedddl,
            RoundInputs {
                views: Some(&views),
                ..RoundInputs::default()
            },
            1e-2,
        ),
    ];
    for (name, params, inputs, least) in cases {
        let (delta, steps) = head_delta(&params, inputs);
        assert_eq!(steps, ce_steps, "{name}: the same batches");
        let gap = relative_gap(&delta, &ce);
        eprintln!("{name}: relative gap to cross-entropy {gap:.2e}");
        assert!(gap > least, "{name}: {gap:e} ≤ {least:e}");
    }
}

#[test]
fn fedddl_joint_loss_is_the_real_plus_the_counterfactual_cross_entropy() {
    // One batch holding every row, one epoch: the reported loss is L_J at the global head.
    let (config, global, data) = tiny();
    let counterfactual = FeatureSet {
        features: vec![0.2, 1.5, -0.5, 2.0, 0.1, 0.3],
        ..data.clone()
    };
    let views = DdlViews {
        counterfactuals: vec![counterfactual.clone()],
        objects: data.clone(),
    };
    let params = TrainParams {
        objective: Objective::FedDdl,
        batch_size: 8,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let inputs = RoundInputs {
        views: Some(&views),
        ..RoundInputs::default()
    };
    let job = TrainJob::new(&config, &global, &data, &params, &device).with_inputs(inputs);
    let out = train_local(&job, &mut LocalState::default()).unwrap();
    let flat: Vec<f64> = global.iter().map(|&v| f64::from(v)).collect();
    let expected = loss(&config, &flat, &data) + loss(&config, &flat, &counterfactual);
    assert!(
        (f64::from(out.last_epoch_loss) - expected).abs() < 1e-5,
        "L_J {} vs CE(real) + CE(counterfactual) {expected}",
        out.last_epoch_loss
    );
}

#[test]
fn with_site_normalisation_a_site_seen_by_another_sensor_trains_the_same_head() {
    // The same rows through a brighter, stronger sensor (2x + 10 on every feature): standardised
    // with each site's own statistics they are the same rows, so the same head comes out.
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let data = two_blobs();
    let shifted = FeatureSet {
        features: data.features.iter().map(|v| 2.0 * v + 10.0).collect(),
        ..data.clone()
    };
    let device = training_device(Backend::Flex);
    let global = config.init_flat(3);
    let site = TrainParams {
        feature_norm: fedge_wire::FeatureNorm::Site,
        ..TrainParams::default()
    };
    let run = |set: &FeatureSet, params: &TrainParams| {
        let job = TrainJob::new(&config, &global, set, params, &device).with_seed(4);
        train_local(&job, &mut LocalState::default()).unwrap().delta
    };
    let (a, b) = (run(&data, &site), run(&shifted, &site));
    assert!(relative_gap(&a, &b) < 1e-3, "{}", relative_gap(&a, &b));
    // Without it the sensor changes everything; and given statistics are the ones used.
    let plain = raw();
    assert!(relative_gap(&run(&data, &plain), &run(&shifted, &plain)) > 0.1);
    let stats = crate::site_norm::stats_of(&[&data]).unwrap();
    let job = TrainJob::new(&config, &global, &shifted, &site, &device)
        .with_seed(4)
        .with_stats(Some(&stats));
    let wrong = train_local(&job, &mut LocalState::default()).unwrap().delta;
    assert!(relative_gap(&wrong, &a) > 0.1, "another site's statistics");
}

#[test]
fn fedddl_without_counterfactuals_trains_deb_alone() {
    // `[fedddl] counterfactuals = 0`: the real rows' cross-entropy, then the pull towards the
    // global prototypes once there are some; neither the doubled L_J nor plain cross-entropy.
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let global = config.init_flat(4);
    let data = two_blobs();
    let full = blob_views(&data);
    let deb = DdlViews {
        counterfactuals: vec![],
        objects: full.objects.clone(),
    };
    let params = TrainParams {
        objective: Objective::FedDdl,
        local_epochs: 1,
        batch_size: 8,
        learning_rate: 0.05,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let run = |params: &TrainParams, inputs: RoundInputs| {
        let job = TrainJob::new(&config, &global, &data, params, &device).with_inputs(inputs);
        train_local(&job.with_seed(1), &mut LocalState::default()).unwrap()
    };
    let ce_params = TrainParams {
        objective: Objective::CrossEntropy,
        ..params.clone()
    };
    let ce = run(&ce_params, RoundInputs::default());
    let views = |v| RoundInputs {
        views: Some(v),
        ..RoundInputs::default()
    };
    let first = run(&params, views(&deb));
    let gap = relative_gap(&first.delta, &ce.delta);
    assert!(gap < 1e-6, "no prototypes yet: cross-entropy ({gap:e})");
    let u = first.prototypes.clone().unwrap().1;
    let pulled = run(
        &params,
        RoundInputs {
            prototypes: Some(&u),
            ..views(&deb)
        },
    );
    let joint = run(
        &params,
        RoundInputs {
            prototypes: Some(&u),
            ..views(&full)
        },
    );
    let (to_ce, to_joint) = (
        relative_gap(&pulled.delta, &ce.delta),
        relative_gap(&pulled.delta, &joint.delta),
    );
    eprintln!("DEB alone: gap to cross-entropy {to_ce:.2e}, to DEC + DEB {to_joint:.2e}");
    assert!(to_ce > 1e-3 && to_joint > 1e-3, "{to_ce:e} {to_joint:e}");
}
