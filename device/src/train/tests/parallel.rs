//! Large batches split across threads give the one-thread step, within float rounding.

use super::super::parallel::shards;
use super::*;
use fedge_wire::Objective;
use rand::{Rng, SeedableRng};

/// A head large enough that a batch of 256 is split in two: 256 × 256 × 128 multiply–adds.
fn wide() -> (HeadConfig, Vec<f32>, FeatureSet) {
    let config = HeadConfig::new(256, 10).with_hidden(128);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let data = FeatureSet {
        dim: 256,
        features: (0..512 * 256)
            .map(|_| rng.random_range(0.0f32..1.0))
            .collect(),
        labels: (0..512).map(|_| rng.random_range(0..10u32)).collect(),
    };
    let global = config.init_flat(3);
    (config, global, data)
}

fn trained(objective: Objective, threads: usize) -> TrainOutcome {
    let (config, global, data) = wide();
    let params = TrainParams {
        objective,
        prox_mu: 0.5,
        batch_size: 256,
        local_epochs: 2,
        ..raw()
    };
    let device = training_device(Backend::default());
    let job = TrainJob::new(&config, &global, &data, &params, &device)
        .with_seed(4)
        .with_threads(threads);
    train_head(&job).unwrap()
}

#[test]
fn a_split_batch_takes_the_same_step_as_one_thread() {
    assert_eq!(shards(256, 256, 128, 2), 2, "the test's batches are split");
    assert_eq!(shards(256, 256, 128, 1), 1);
    assert_eq!(
        shards(32, 512, 64, 2),
        1,
        "a small batch stays on one thread"
    );
    assert_eq!(shards(8, 4096, 4096, 8), 1, "at least 8 rows a shard");
    for objective in [Objective::CrossEntropy, Objective::FedProx] {
        let one = trained(objective, 1);
        let two = trained(objective, 2);
        assert_eq!(one.steps, two.steps);
        let moved: f32 = one.delta.iter().map(|d| d.abs()).sum();
        let apart = one
            .delta
            .iter()
            .zip(&two.delta)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // Four steps moved the head by far more than the shards' rounding moved it apart.
        assert!(moved > 1.0, "{objective:?}: moved {moved}");
        assert!(apart < 1e-4, "{objective:?}: two threads differ by {apart}");
        let loss_gap = (one.last_epoch_loss - two.last_epoch_loss).abs();
        assert!(
            loss_gap < 1e-4,
            "{objective:?}: losses differ by {loss_gap}"
        );
    }
}
