//! `fedge bench feddim`: what FedDIM costs, side by side with plain cross-entropy.
//!
//! - Bytes of the insight part of one update, as encoded on the wire: the compact class
//!   statistics fedge sends (K counts + K×H means) against the full K×H×K class-mean tensor.
//! - Local training time with and without the insight term, same head, data, seed and
//!   optimiser, on the default backend.

use std::time::Instant;

use fedge_device::{RoundInputs, TrainJob, train_head};
use fedge_models::{Backend, HeadConfig, training_device};
use fedge_wire::{ClassStats, Objective, TensorF32, TrainParams};
use rand::{Rng, SeedableRng};

/// Encoded sizes for one (K, H).
#[derive(Debug, Clone, serde::Serialize)]
pub struct InsightBytes {
    /// Classes.
    pub classes: usize,
    /// Projector width.
    pub hidden: usize,
    /// Bytes of fedge's `ClassStats` (postcard).
    pub compact: usize,
    /// Bytes of the full K×H×K tensor in the same codec.
    pub full: usize,
}

/// Wire sizes of the insight part for `(classes, hidden)`.
pub fn insight_bytes(classes: usize, hidden: usize) -> InsightBytes {
    let stats = Some(ClassStats {
        counts: vec![1000; classes],
        means: TensorF32::from_slice(&vec![0.5; classes * hidden]),
    });
    let full = Some(TensorF32::from_slice(&vec![
        0.5;
        classes * hidden * classes
    ]));
    InsightBytes {
        classes,
        hidden,
        compact: postcard::to_allocvec(&stats).map_or(0, |v| v.len()),
        full: postcard::to_allocvec(&full).map_or(0, |v| v.len()),
    }
}

/// Training time with and without the insight term.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InsightTiming {
    /// Seconds per epoch, cross-entropy (median).
    pub ce_epoch_s: f64,
    /// Seconds per epoch, FedDIM with a global Ī (median).
    pub feddim_epoch_s: f64,
}

/// Times `epochs` epochs over `samples` random samples, `repeats` times each way.
pub fn timing(
    head: &HeadConfig,
    samples: usize,
    epochs: u32,
    batch: u32,
    repeats: usize,
    backend: Backend,
) -> InsightTiming {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let data = crate::bench::head::random_features(head, samples, &mut rng);
    let insight: Vec<f32> = (0..head.classes * head.hidden * head.classes)
        .map(|_| rng.random_range(-0.1f32..0.1))
        .collect();
    let global = head.init_flat(1);
    let device = training_device(backend);
    let run = |objective: Objective| {
        let params = TrainParams {
            objective,
            local_epochs: epochs,
            batch_size: batch,
            feature_norm: fedge_wire::FeatureNorm::None,
            ..TrainParams::default()
        };
        let start = Instant::now();
        let _ = train_head(
            &TrainJob::new(head, &global, &data, &params, &device).with_inputs(RoundInputs {
                insight: Some(&insight),
                ..RoundInputs::default()
            }),
        );
        start.elapsed().as_secs_f64() / epochs as f64
    };
    // Warm up, then alternate the two so that machine noise hits both alike.
    run(Objective::CrossEntropy);
    run(Objective::FedDim);
    let (mut ce, mut dim) = (Vec::new(), Vec::new());
    for _ in 0..repeats.max(1) {
        ce.push(run(Objective::CrossEntropy));
        dim.push(run(Objective::FedDim));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ce_epoch_s, feddim_epoch_s) = (median(ce), median(dim));
    InsightTiming {
        ce_epoch_s,
        feddim_epoch_s,
    }
}
