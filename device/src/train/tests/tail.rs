//! Training with the backbone's trainable tail: the built-in digits-conv's last convolution
//! block, read from its ONNX file, on its cut's activations.

use super::*;
use fedge_models::Tail;
use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};

/// Two classes of 8×8 images (a bright top half or a bright bottom half, with texture), as the
/// whole backbone's features and as its cut's activations.
fn rows(tail: &Tail) -> (FeatureSet, FeatureSet) {
    let card = digits_conv_card();
    let origin = std::path::Path::new("digits-conv.onnx");
    let whole = fedge_models::Backbone::from_bytes(card.clone(), DIGITS_CONV_ONNX, origin).unwrap();
    let cut =
        fedge_models::Backbone::from_bytes(tail.cut_card(&card), DIGITS_CONV_ONNX, origin).unwrap();
    let n = 24;
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for i in 0..n {
        let class = (i % 2) as u32;
        for p in 0..64 {
            let top = p < 32;
            let lit = top == (class == 0);
            images.push(if lit {
                12.0 + ((i * 7 + p) % 5) as f32
            } else {
                ((i + p) % 3) as f32
            });
        }
        labels.push(class);
    }
    let set = |features: Vec<f32>, dim| FeatureSet {
        dim,
        features,
        labels: labels.clone(),
    };
    (
        set(whole.features(&images, 8).unwrap(), 512),
        set(cut.features(&images, 8).unwrap(), 256),
    )
}

#[test]
fn a_head_with_the_tail_starts_where_the_frozen_backbone_is_and_moves_the_tail() {
    let tail = Tail::read(&digits_conv_card(), DIGITS_CONV_ONNX, None).unwrap();
    let (features, activations) = rows(&tail);
    let plain = HeadConfig::new(512, 2).with_hidden(8);
    let with_tail = plain.clone().with_tail(tail.config);
    let params = TrainParams {
        local_epochs: 1,
        batch_size: 64,
        learning_rate: 0.05,
        ..raw()
    };
    let device = training_device(Backend::Flex);
    let global = with_tail.init_flat(3);
    let head_global = &global[with_tail.tail_params()..];
    assert_eq!(head_global, plain.init_flat(3).as_slice());
    // The received model scores the same: zero offsets are the backbone's own block.
    let frozen = accuracy(&plain, head_global, &features).unwrap();
    let through = accuracy_with(&with_tail, &global, Some(&tail), &activations).unwrap();
    assert_eq!(frozen, through);
    // One step on one batch: the same loss and the same head step as on the frozen features
    // (the tail is the backbone's block until it moves), and the tail moves too.
    let head_only = train_head(&TrainJob::new(
        &plain,
        head_global,
        &features,
        &params,
        &device,
    ))
    .unwrap();
    let job = TrainJob::new(&with_tail, &global, &activations, &params, &device);
    let out = train_head(&job.with_tail(Some(&tail))).unwrap();
    assert!(
        (out.last_epoch_loss - head_only.last_epoch_loss).abs() < 1e-5,
        "{} vs {}",
        out.last_epoch_loss,
        head_only.last_epoch_loss
    );
    let (tail_step, head_step) = out.delta.split_at(with_tail.tail_params());
    let gap = head_step
        .iter()
        .zip(&head_only.delta)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(gap < 1e-5, "head step {gap:e} away from the frozen one");
    let moved = tail_step.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(moved > 1e-4, "the tail's offsets moved by {moved:e}");
    // A second epoch trains on moved features: the head no longer follows the frozen run.
    let two = TrainParams {
        local_epochs: 2,
        ..params.clone()
    };
    let frozen_two = train_head(&TrainJob::new(
        &plain,
        head_global,
        &features,
        &two,
        &device,
    ))
    .unwrap();
    let job = TrainJob::new(&with_tail, &global, &activations, &two, &device);
    let out_two = train_head(&job.with_tail(Some(&tail))).unwrap();
    assert_ne!(
        &out_two.delta[with_tail.tail_params()..],
        frozen_two.delta.as_slice()
    );
    // Without the backbone's weights a device cannot train or score a tail.
    let job = TrainJob::new(&with_tail, &global, &activations, &params, &device);
    let err = train_head(&job).unwrap_err();
    assert!(err.to_string().contains("trainable tail"), "{err}");
    assert!(accuracy(&with_tail, &global, &activations).is_err());
}

#[test]
fn a_task_that_standardises_features_is_refused_by_a_device_training_the_tail() {
    let tail = Tail::read(&digits_conv_card(), DIGITS_CONV_ONNX, None).unwrap();
    let (_, activations) = rows(&tail);
    let head = HeadConfig::new(512, 2)
        .with_hidden(8)
        .with_tail(tail.config);
    let data = crate::train::DeviceData::new(
        std::sync::Arc::new(activations.clone()),
        std::sync::Arc::new(activations),
        None,
    );
    let device = training_device(Backend::Flex);
    let trainer = crate::train::Trainer {
        head: &head,
        device: &device,
        seed: 1,
        client_id: "cam",
        threads: 1,
        cancel: None,
        tail: Some(&tail),
    };
    let task = |feature_norm| fedge_wire::RoundTask {
        federation: "f".into(),
        run: 1,
        round: 1,
        selected: vec!["cam".into()],
        classes: vec!["a".into(), "b".into()],
        params: fedge_wire::TensorF32::from_slice(&head.init_flat(3)),
        train: TrainParams {
            local_epochs: 1,
            batch_size: 64,
            feature_norm,
            ..raw()
        },
        deadline_ms: 0,
        insight: None,
        prototypes: None,
        backbone: None,
        pooled: None,
    };
    let refused = crate::train::run_round(
        &data,
        &task(fedge_wire::FeatureNorm::Site),
        &trainer,
        &mut LocalState::default(),
    );
    let Err(TrainError::TailWithNorm(norm)) = refused.result else {
        panic!("not refused: {:?}", refused.result.map(|o| o.steps));
    };
    assert_eq!(norm, fedge_wire::FeatureNorm::Site);
    let trained = crate::train::run_round(
        &data,
        &task(fedge_wire::FeatureNorm::None),
        &trainer,
        &mut LocalState::default(),
    );
    let outcome = trained.result.unwrap();
    assert_eq!(outcome.delta.len(), head.num_params());
}
