//! `fedge bench-head`: local head training speed of the Burn CPU backends, side by side.
//!
//! Trains the same head (same features, same seed, same hyper-parameters) on each backend and
//! reports samples per second and the ratio to the first backend.

use std::time::Instant;

use fedge_edge::{FeatureSet, train_head};
use fedge_models::{Backend, HeadConfig, training_device};
use fedge_wire::TrainParams;
use rand::{Rng, SeedableRng};

/// One backend's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeadBench {
    /// Backend name.
    pub backend: &'static str,
    /// Training samples processed per second (median of the repeats).
    pub samples_per_s: f64,
    /// Final loss, to show the backends computed the same thing.
    pub final_loss: f32,
}

/// `samples` random features in 0..1 with random labels, for timing.
pub fn random_features(head: &HeadConfig, samples: usize, rng: &mut impl Rng) -> FeatureSet {
    FeatureSet {
        dim: head.features,
        features: (0..samples * head.features)
            .map(|_| rng.random_range(0.0f32..1.0))
            .collect(),
        labels: (0..samples)
            .map(|_| rng.random_range(0..head.classes as u32))
            .collect(),
    }
}

/// Times `epochs` epochs over `samples` random samples, `repeats` times per backend.
pub fn run(
    head: &HeadConfig,
    samples: usize,
    epochs: u32,
    batch: u32,
    repeats: usize,
    backends: &[Backend],
) -> Vec<HeadBench> {
    let data = random_features(head, samples, &mut rand::rngs::StdRng::seed_from_u64(7));
    let params = TrainParams {
        local_epochs: epochs,
        batch_size: batch,
        ..TrainParams::default()
    };
    let global = head.init_flat(1);
    backends
        .iter()
        .map(|&backend| {
            let device = training_device(backend);
            // One untimed warm-up run.
            let _ = train_head(head, &global, &data, &params, 0, &device);
            let mut rates = Vec::new();
            let mut final_loss = f32::NAN;
            for _ in 0..repeats.max(1) {
                let start = Instant::now();
                let outcome = train_head(head, &global, &data, &params, 0, &device);
                let seconds = start.elapsed().as_secs_f64();
                final_loss = outcome.map(|o| o.last_epoch_loss).unwrap_or(f32::NAN);
                rates.push((samples * epochs as usize) as f64 / seconds);
            }
            rates.sort_by(|a, b| a.total_cmp(b));
            HeadBench {
                backend: backend.name(),
                samples_per_s: rates[rates.len() / 2],
                final_loss,
            }
        })
        .collect()
}
