//! Hand-computed SGD steps and objective checks for the trainer.

use super::*;
use fedge_models::{Backend, HeadModules, training_device};

/// Mean cross-entropy of the head `flat` on `data`, in f64, written out by hand.
fn loss(config: &HeadConfig, flat: &[f64], data: &FeatureSet) -> f64 {
    let (f, h, k) = (config.features, config.hidden, config.classes);
    let fedge_wire::HeadTensors { w1, b1, w, b } = config.split(flat).unwrap();
    let mut total = 0.0;
    for (x, &y) in data.features.chunks(f).zip(&data.labels) {
        let z: Vec<f64> = (0..h)
            .map(|j| (b1[j] + (0..f).map(|i| x[i] as f64 * w1[i * h + j]).sum::<f64>()).max(0.0))
            .collect();
        let o: Vec<f64> = (0..k)
            .map(|c| b[c] + (0..h).map(|j| z[j] * w[j * k + c]).sum::<f64>())
            .collect();
        let max = o.iter().cloned().fold(f64::MIN, f64::max);
        let lse = max + o.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        total += lse - o[y as usize];
    }
    total / data.len() as f64
}

/// Central-difference gradient of [`loss`].
fn grad(config: &HeadConfig, flat: &[f64], data: &FeatureSet) -> Vec<f64> {
    let eps = 1e-6;
    (0..flat.len())
        .map(|i| {
            let (mut up, mut down) = (flat.to_vec(), flat.to_vec());
            up[i] += eps;
            down[i] -= eps;
            (loss(config, &up, data) - loss(config, &down, data)) / (2.0 * eps)
        })
        .collect()
}

/// The defaults on the backbone's features as they are: the hand computations below use raw
/// features (site normalisation has its own tests).
fn raw() -> TrainParams {
    TrainParams {
        feature_norm: fedge_wire::FeatureNorm::None,
        ..TrainParams::default()
    }
}

fn tiny() -> (HeadConfig, Vec<f32>, FeatureSet) {
    let config = HeadConfig::new(3, 2).with_hidden(2);
    // Pre-activations stay far from the ReLU kink, so finite differences are exact enough.
    let global = vec![
        0.5, -0.3, 0.8, 0.4, -0.2, 0.6, 0.3, 0.2, 0.7, -0.5, -0.4, 0.9, 0.1, -0.1,
    ];
    let data = FeatureSet {
        dim: 3,
        features: vec![1.0, 0.5, 2.0, 1.0, 0.5, 2.0],
        labels: vec![1, 1],
    };
    (config, global, data)
}

/// Cross-entropy plus λ times FedDIM's insight term, with every per-sample `H×K` insight
/// matrix written out (no expansion), in f64.
fn feddim_loss(
    config: &HeadConfig,
    flat: &[f64],
    data: &FeatureSet,
    insight: &[f64],
    lambda: f64,
) -> f64 {
    let (f, h, k) = (config.features, config.hidden, config.classes);
    let w = &flat[f * h + h..f * h + h + h * k];
    let mut total = 0.0;
    for (x, &y) in data.features.chunks(f).zip(&data.labels) {
        let z: Vec<f64> = (0..h)
            .map(|j| {
                (flat[f * h + j] + (0..f).map(|i| x[i] as f64 * flat[i * h + j]).sum::<f64>())
                    .max(0.0)
            })
            .collect();
        let target = &insight[y as usize * h * k..(y as usize + 1) * h * k];
        let mut matrix = vec![0.0; h * k];
        for j in 0..h {
            for c in 0..k {
                matrix[j * k + c] = w[j * k + c] * z[j];
            }
        }
        total += matrix
            .iter()
            .zip(target)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>();
    }
    loss(config, flat, data) + lambda * total / data.len() as f64
}

#[test]
fn feddim_loss_and_gradient_match_a_direct_computation() {
    let config = HeadConfig::new(3, 3).with_hidden(2);
    let global: Vec<f32> = vec![
        0.5, -0.3, 0.8, 0.4, -0.2, 0.6, 0.3, 0.2, // W1 [3, 2], b1 [2]
        0.7, -0.5, 0.2, -0.4, 0.9, 0.3, // W [2, 3]
        0.1, -0.1, 0.05, // b [3]
    ];
    let data = FeatureSet {
        dim: 3,
        features: vec![1.0, 0.5, 2.0, 0.3, 1.5, 1.0, 2.0, 0.2, 0.9],
        labels: vec![1, 0, 2],
    };
    let insight: Vec<f32> = (0..3 * 2 * 3)
        .map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.4)
        .collect();
    let lambda = 0.7;
    // One full-batch SGD step without momentum or decay: θ' = θ − lr·∇L.
    let params = TrainParams {
        objective: Objective::FedDim,
        insight_lambda: lambda,
        local_epochs: 1,
        batch_size: 3,
        learning_rate: 1e-3,
        momentum: 0.0,
        weight_decay: 0.0,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let out = train_head(
        &TrainJob::new(&config, &global, &data, &params, &device).with_inputs(RoundInputs {
            insight: Some(&insight),
            ..RoundInputs::default()
        }),
    )
    .unwrap();
    let theta: Vec<f64> = global.iter().map(|v| *v as f64).collect();
    let ibar: Vec<f64> = insight.iter().map(|v| *v as f64).collect();
    let direct = feddim_loss(&config, &theta, &data, &ibar, lambda as f64);
    assert!(
        (out.last_epoch_loss as f64 - direct).abs() < 1e-5 * direct,
        "{} vs {direct}",
        out.last_epoch_loss
    );
    let eps = 1e-6;
    for i in 0..theta.len() {
        let (mut up, mut down) = (theta.clone(), theta.clone());
        up[i] += eps;
        down[i] -= eps;
        let numeric = (feddim_loss(&config, &up, &data, &ibar, lambda as f64)
            - feddim_loss(&config, &down, &data, &ibar, lambda as f64))
            / (2.0 * eps);
        let burn = (global[i] - out.params[i]) as f64 / 1e-3;
        assert!(
            (burn - numeric).abs() < 2e-3 * numeric.abs().max(1.0),
            "∂θ{i}: {burn} vs {numeric}"
        );
    }
    // The class statistics describe the trained head: counts per class, finite means.
    let (counts, means) = out.class_stats.unwrap();
    assert_eq!(counts, vec![1, 1, 1]);
    assert_eq!(means.len(), 3 * 2);
    // Without Ī (first round) the objective is plain cross-entropy.
    let first = train_head(&TrainJob::new(&config, &global, &data, &params, &device)).unwrap();
    let ce = loss(&config, &theta, &data);
    assert!((first.last_epoch_loss as f64 - ce).abs() < 1e-5 * ce);
    let short = train_head(
        &TrainJob::new(&config, &global, &data, &params, &device).with_inputs(RoundInputs {
            insight: Some(&insight[1..]),
            ..RoundInputs::default()
        }),
    );
    assert!(matches!(short, Err(TrainError::Params(_))));
}

#[test]
fn two_sgd_steps_follow_pytorch_momentum_and_weight_decay() {
    let (config, global, data) = tiny();
    let params = TrainParams {
        local_epochs: 1,
        batch_size: 1,
        learning_rate: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let out =
        train_head(&TrainJob::new(&config, &global, &data, &params, &device).with_seed(3)).unwrap();
    assert_eq!(out.steps, 2);
    // By hand: d = g + wd·θ; buf = d on the first step, then buf = 0.9·buf + d; θ -= lr·buf.
    let one = FeatureSet {
        dim: 3,
        features: data.features[..3].to_vec(),
        labels: vec![1],
    };
    let mut theta: Vec<f64> = global.iter().map(|v| *v as f64).collect();
    let mut buf = vec![0.0; theta.len()];
    for step in 0..2 {
        let g = grad(&config, &theta, &one);
        for i in 0..theta.len() {
            let d = g[i] + 0.01 * theta[i];
            buf[i] = if step == 0 { d } else { 0.9 * buf[i] + d };
            theta[i] -= 0.1 * buf[i];
        }
    }
    for (got, want) in out.params.iter().zip(&theta) {
        assert!((*got as f64 - want).abs() < 1e-4, "got {got}, want {want}");
    }
    for ((d, p), g) in out.delta.iter().zip(&out.params).zip(&global) {
        assert!((d - (p - g)).abs() < 1e-7);
    }
}

#[test]
fn fedprox_keeps_the_local_head_closer_to_the_global_one() {
    let (config, global, data) = tiny();
    let device = training_device(Backend::Flex);
    let ce = TrainParams {
        local_epochs: 20,
        batch_size: 2,
        learning_rate: 0.1,
        ..TrainParams::default()
    };
    let prox = TrainParams {
        objective: Objective::FedProx,
        prox_mu: 5.0,
        ..ce.clone()
    };
    let norm = |d: &[f32]| d.iter().map(|v| v * v).sum::<f32>().sqrt();
    let free = train_head(&TrainJob::new(&config, &global, &data, &ce, &device)).unwrap();
    let held = train_head(&TrainJob::new(&config, &global, &data, &prox, &device)).unwrap();
    assert!(
        norm(&held.delta) < 0.5 * norm(&free.delta),
        "{} vs {}",
        norm(&held.delta),
        norm(&free.delta)
    );
    assert!(held.last_epoch_loss.is_finite());
}

#[test]
fn training_learns_separable_data_and_is_deterministic_for_a_seed() {
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let features: Vec<f32> = (0..64)
        .flat_map(|i| {
            if i % 2 == 0 {
                [1.0, 0.2, 0.0, 0.1]
            } else {
                [0.0, 0.1, 1.0, 0.3]
            }
        })
        .collect();
    let labels: Vec<u32> = (0..64).map(|i| i % 2).collect();
    let data = FeatureSet {
        dim: 4,
        features,
        labels,
    };
    let global = config.init_flat(5);
    let params = TrainParams {
        local_epochs: 5,
        batch_size: 8,
        learning_rate: 0.1,
        ..TrainParams::default()
    };
    let device = training_device(Backend::Flex);
    let a =
        train_head(&TrainJob::new(&config, &global, &data, &params, &device).with_seed(1)).unwrap();
    let b =
        train_head(&TrainJob::new(&config, &global, &data, &params, &device).with_seed(1)).unwrap();
    assert_eq!(a, b);
    assert_eq!(accuracy(&config, &a.params, &data).unwrap(), 1.0);
    assert!(a.last_epoch_loss < 0.3, "{}", a.last_epoch_loss);
}

/// Two classes in 4 features, 40 samples: class 0 near (1, 0, ·, ·), class 1 near (0, 1, ·, ·).
fn two_blobs() -> FeatureSet {
    let features = (0..40)
        .flat_map(|i| {
            let wobble = (i % 7) as f32 * 0.05;
            if i % 2 == 0 {
                [1.0 + wobble, 0.1, wobble, 0.3]
            } else {
                [0.1, 1.0 - wobble, 0.2, wobble]
            }
        })
        .collect();
    FeatureSet {
        dim: 4,
        features,
        labels: (0..40).map(|i| i % 2).collect(),
    }
}

/// FedDDL's views of [`two_blobs`]: object-only features are the informative half;
/// counterfactuals are the objects on another "background" (the last two features swapped
/// between classes).
fn blob_views(data: &FeatureSet) -> DdlViews {
    let view = |f: fn(&[f32]) -> [f32; 4]| FeatureSet {
        features: data.features.chunks(4).flat_map(f).collect(),
        ..data.clone()
    };
    DdlViews {
        counterfactuals: vec![view(|r| [r[0], r[1], r[3], r[2]])],
        objects: view(|r| [r[0], r[1], 0.0, 0.0]),
    }
}

#[test]
fn stable_fedadg_trains_head_and_generator_and_keeps_the_discriminator() {
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let layout = ModelLayout::new(config.clone(), true);
    let global = layout.init_flat(3);
    let data = two_blobs();
    let params = TrainParams {
        objective: Objective::StableFedAdg,
        local_epochs: 3,
        batch_size: 8,
        learning_rate: 0.1,
        stable_schedule: fedge_wire::StableSchedule::Paper,
        ..TrainParams::default()
    };
    let device = training_device(Backend::Flex);
    let mut state = LocalState::default();
    let inputs = RoundInputs::default();
    let first = train_local(
        &TrainJob::new(&config, &global, &data, &params, &device)
            .with_inputs(inputs)
            .with_seed(1),
        &mut state,
    )
    .unwrap();
    assert_eq!(first.delta.len(), layout.num_params());
    assert_eq!(first.steps, 8, "E0 + E1 = 3 + 5, whatever the epochs");
    let moved = |part: &[f32]| part.iter().map(|d| d * d).sum::<f32>().sqrt();
    assert!(moved(layout.head_part(&first.delta)) > 0.0);
    assert!(moved(layout.generator_part(&first.delta)) > 0.0, "G trains");
    let disc = state.discriminator.clone().expect("D kept on the device");
    let adversarial = AdversarialConfig::for_head(&config);
    assert_eq!(disc.len(), adversarial.discriminator_params());
    assert!(
        state
            .memory
            .as_ref()
            .is_some_and(|m| m.filled() == 64 && m.logits.len() == 128),
        "8 batches of 8 rows fill 64 distinct slots"
    );
    // The next round continues from the kept discriminator and changes it again.
    let second = train_local(
        &TrainJob::new(&config, &first.params, &data, &params, &device)
            .with_inputs(inputs)
            .with_seed(2),
        &mut state,
    )
    .unwrap();
    assert_ne!(state.discriminator.as_ref(), Some(&disc));
    assert_eq!(state.memory.as_ref().map(|m| m.filled()), Some(128));
    assert!(accuracy(&config, layout.head_part(&second.params), &data).unwrap() > 0.9);
    // A vector without the generator does not fit a Stable-FedADG round.
    let short = train_local(
        &TrainJob::new(
            &config,
            &global[..config.num_params()],
            &data,
            &params,
            &device,
        )
        .with_inputs(inputs)
        .with_seed(1),
        &mut LocalState::default(),
    );
    assert!(matches!(short, Err(TrainError::Layout(_))));
}

#[test]
fn fedddl_sends_object_prototypes_of_the_global_head_and_uses_the_global_ones() {
    let config = HeadConfig::new(4, 2).with_hidden(8);
    let global = config.init_flat(4);
    let data = two_blobs();
    let views = blob_views(&data);
    let objects = views.objects.clone();
    let params = TrainParams {
        objective: Objective::FedDdl,
        local_epochs: 1,
        batch_size: 8,
        learning_rate: 0.05,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let mut state = LocalState::default();
    let first_round = RoundInputs {
        views: Some(&views),
        ..RoundInputs::default()
    };
    let out = train_local(
        &TrainJob::new(&config, &global, &data, &params, &device)
            .with_inputs(first_round)
            .with_seed(1),
        &mut state,
    )
    .unwrap();
    let head = config.from_flat(&global, &device).unwrap();
    let expected = class_stats(&head, 2, &objects, &device);
    assert_eq!(
        out.prototypes.as_ref(),
        Some(&expected),
        "under the global head"
    );
    assert!(out.class_stats.is_none());
    // L_J doubles the cross-entropy of the first batch at the start: the loss differs from
    // plain cross-entropy, and the global prototypes add L_CR on top.
    let ce = train_head(
        &TrainJob::new(
            &config,
            &global,
            &data,
            &TrainParams {
                objective: Objective::CrossEntropy,
                ..params.clone()
            },
            &device,
        )
        .with_seed(1),
    )
    .unwrap();
    assert!(
        out.last_epoch_loss > ce.last_epoch_loss * 1.5,
        "{} vs {}",
        out.last_epoch_loss,
        ce.last_epoch_loss
    );
    let u = expected.1.clone();
    let with_prototypes = RoundInputs {
        prototypes: Some(&u),
        ..first_round
    };
    let pulled = train_local(
        &TrainJob::new(&config, &global, &data, &params, &device)
            .with_inputs(with_prototypes)
            .with_seed(1),
        &mut state,
    )
    .unwrap();
    assert!(
        pulled.last_epoch_loss > out.last_epoch_loss,
        "L_CR adds to the loss"
    );
    assert_eq!(
        pulled.prototypes, out.prototypes,
        "prototypes use the global head"
    );
    // Wrong prototype size, views that do not match, or no views: errors.
    let short = RoundInputs {
        prototypes: Some(&u[1..]),
        ..first_round
    };
    assert!(matches!(
        train_local(
            &TrainJob::new(&config, &global, &data, &params, &device)
                .with_inputs(short)
                .with_seed(1),
            &mut state
        ),
        Err(TrainError::Params(_))
    ));
    let fewer = views.rows(&[0, 1, 2]);
    let mismatched = RoundInputs {
        views: Some(&fewer),
        ..RoundInputs::default()
    };
    assert!(matches!(
        train_local(
            &TrainJob::new(&config, &global, &data, &params, &device)
                .with_inputs(mismatched)
                .with_seed(1),
            &mut state
        ),
        Err(TrainError::Params(_))
    ));
    let err = train_local(
        &TrainJob::new(&config, &global, &data, &params, &device).with_seed(1),
        &mut state,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("boxes.csv"), "{err}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let (config, global, data) = tiny();
    let device = training_device(Backend::Flex);
    let params = TrainParams::default();
    let bad_label = FeatureSet {
        labels: vec![1, 7],
        ..data.clone()
    };
    assert!(matches!(
        train_head(&TrainJob::new(
            &config, &global, &bad_label, &params, &device
        )),
        Err(TrainError::Label { label: 7, .. })
    ));
    assert!(matches!(
        train_head(&TrainJob::new(
            &config,
            &global[..3],
            &data,
            &params,
            &device
        )),
        Err(TrainError::Layout(_))
    ));
    assert!(matches!(
        train_head(&TrainJob::new(
            &config,
            &global,
            &FeatureSet::default(),
            &params,
            &device
        )),
        Err(TrainError::Empty)
    ));
    let zero_batch = TrainParams {
        batch_size: 0,
        ..params
    };
    assert!(matches!(
        train_head(&TrainJob::new(
            &config,
            &global,
            &data,
            &zero_batch,
            &device
        )),
        Err(TrainError::Params(_))
    ));
}

#[test]
fn a_cancelled_job_stops_before_its_next_batch() {
    let (head, data) = (HeadConfig::new(4, 2).with_hidden(8), two_blobs());
    let device = training_device(Backend::Flex);
    let global = ModelLayout::new(head.clone(), false).init_flat(1);
    let params = TrainParams::default();
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let job = TrainJob::new(&head, &global, &data, &params, &device).with_cancel(&cancel);
    assert!(matches!(
        train_local(&job, &mut LocalState::default()),
        Err(TrainError::Cancelled(0))
    ));
    let stable = TrainParams {
        objective: Objective::StableFedAdg,
        ..TrainParams::default()
    };
    let layout = ModelLayout::new(head.clone(), true);
    let global = layout.init_flat(1);
    let job = TrainJob::new(&head, &global, &data, &stable, &device).with_cancel(&cancel);
    assert!(matches!(
        train_local(&job, &mut LocalState::default()),
        Err(TrainError::Cancelled(0))
    ));
}

#[test]
fn devices_sharing_a_seed_draw_differently_each_round() {
    use super::round_seed;
    let a = round_seed(7, 3, "cam-1");
    assert_eq!(a, round_seed(7, 3, "cam-1"));
    assert_ne!(a, round_seed(7, 3, "cam-2"));
    assert_ne!(a, round_seed(7, 4, "cam-1"));
    assert_ne!(a, round_seed(8, 3, "cam-1"));
}

mod objectives;
mod parallel;
mod tail;

#[test]
fn a_device_whose_profile_says_another_width_trains_the_federations_head() {
    use crate::train::{DeviceData, Trainer, run_round};
    use std::sync::Arc;
    let (_, _, data) = tiny();
    let profile = HeadConfig::new(3, 2).with_hidden(2);
    let federation = HeadConfig::new(3, 2).with_hidden(5);
    let device = training_device(Backend::Flex);
    let trainer = Trainer {
        head: &profile,
        device: &device,
        seed: 1,
        client_id: "cam-1",
        threads: 1,
        cancel: None,
        tail: None,
    };
    let rows = DeviceData::new(Arc::new(data.clone()), Arc::new(data.rows(&[])), None);
    let task = |params: Vec<f32>| fedge_wire::RoundTask {
        federation: "f".into(),
        run: 1,
        round: 1,
        selected: vec!["cam-1".into()],
        classes: vec!["a".into(), "b".into()],
        params: fedge_wire::TensorF32::from_slice(&params),
        train: raw(),
        deadline_ms: 1_000,
        insight: None,
        prototypes: None,
        backbone: None,
        pooled: None,
    };
    let global = federation.init_flat(3);
    let outcome = run_round(
        &rows,
        &task(global.clone()),
        &trainer,
        &mut LocalState::default(),
    );
    let trained = outcome.result.expect("trains with the federation's width");
    assert_eq!(trained.delta.len(), global.len());
    assert!(trained.delta.iter().any(|d| *d != 0.0));
    // A vector no width fits is still refused by its length.
    let odd = run_round(
        &rows,
        &task(vec![0.1; 7]),
        &trainer,
        &mut LocalState::default(),
    );
    assert!(odd.result.is_err());
}

#[test]
fn a_task_whose_pooled_summary_does_not_fit_the_head_fails_the_round_without_a_panic() {
    use crate::train::{DeviceData, Trainer, run_round};
    use fedge_wire::{FeatureNorm, FeatureSummary, TensorF32};
    use std::sync::Arc;
    let (head, global, data) = tiny();
    let device = training_device(Backend::Flex);
    let trainer = Trainer {
        head: &head,
        device: &device,
        seed: 1,
        client_id: "cam-1",
        threads: 1,
        cancel: None,
        tail: None,
    };
    let rows = DeviceData::new(Arc::new(data.clone()), Arc::new(data.rows(&[])), None);
    // Two classes of three features: six class means.
    let good = crate::site_norm::summary_of(&data, 2).unwrap();
    let short = FeatureSummary {
        means: TensorF32::from_slice(&[0.5; 5]),
        ..good.clone()
    };
    let mut means = good.means.to_vec();
    means[4] = f32::NAN;
    let nan = FeatureSummary {
        means: TensorF32::new(vec![2, 3], &means).unwrap(),
        ..good.clone()
    };
    let narrow = crate::site_norm::summary_of(
        &FeatureSet {
            dim: 2,
            features: vec![1.0, 0.5, 2.0, 1.0],
            labels: vec![0, 1],
        },
        2,
    )
    .unwrap();
    for (bad, norm) in [
        (short, FeatureNorm::Balanced),
        (nan, FeatureNorm::Pooled),
        (narrow, FeatureNorm::Pooled),
    ] {
        let task = fedge_wire::RoundTask {
            federation: "f".into(),
            run: 1,
            round: 1,
            selected: vec!["cam-1".into()],
            classes: vec!["a".into(), "b".into()],
            params: TensorF32::from_slice(&global),
            train: TrainParams {
                feature_norm: norm,
                ..raw()
            },
            deadline_ms: 1_000,
            insight: None,
            prototypes: None,
            backbone: None,
            pooled: Some(bad),
        };
        let outcome = run_round(&rows, &task, &trainer, &mut LocalState::default());
        let error = outcome.result.expect_err("refused").to_string();
        assert!(error.contains("pooled feature statistics"), "{error}");
    }
}
