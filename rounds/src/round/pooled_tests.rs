//! The federation's pooled feature summary: devices' summaries merged exactly into the next
//! task and the release, decayed across rounds, kept in the checkpoint, a bad one refused.

use fedge_wire::{ClientUpdate, FeatureNorm, FeatureSummary, HeadConfig, TensorF32, TrainParams};

use super::release_tests::releases;
use super::tests::{config, drain, reports, tasks};
use super::*;

/// A head of 2 features, 1 hidden unit, 2 classes: 2 + 1 + 2 + 2 = 7 values.
fn pooling() -> RoundConfig {
    RoundConfig {
        classes: vec!["a".into(), "b".into()],
        head: Some(HeadConfig::new(2, 2).with_hidden(1)),
        train: TrainParams {
            feature_norm: FeatureNorm::Balanced,
            ..TrainParams::default()
        },
        rounds: 3,
        ..config()
    }
}

fn summary(rows: &[[f32; 2]], labels: &[u32]) -> FeatureSummary {
    FeatureSummary::of_rows(2, 2, rows.iter().map(|r| &r[..]), labels).unwrap()
}

fn update(client: &str, round: u64, features: Option<FeatureSummary>) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        run: 0,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: 2,
        delta: TensorF32::from_slice(&[0.0; 7]),
        metrics: Default::default(),
        class_stats: None,
        prototypes: None,
        features,
    }))
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

#[test]
fn the_devices_summaries_are_pooled_into_the_next_task_and_the_release() {
    let mut m = Rounds::new(pooling(), Box::new(crate::strategy::FedAvg), vec![0.0; 7]);
    for c in ["x", "y"] {
        m.handle_client_status(c, true, 0);
    }
    let first = tasks(&drain(&mut m)).remove(0);
    assert_eq!(first.pooled, None, "no device has sent a summary yet");
    let (rows_x, rows_y) = ([[0.0, 1.0], [4.0, 3.0]], [[2.0, 1.0], [6.0, 5.0]]);
    m.handle_packet("x", &update("x", 1, Some(summary(&rows_x, &[0, 1]))), 1);
    m.handle_packet("y", &update("y", 1, Some(summary(&rows_y, &[0, 0]))), 1);
    let out = drain(&mut m);
    let whole = summary(&[rows_x[0], rows_x[1], rows_y[0], rows_y[1]], &[0, 1, 0, 0]);
    let pooled = releases(&out)[0]
        .pooled
        .clone()
        .expect("the release carries the pool");
    assert_eq!(pooled.counts, whole.counts);
    assert!(close(&pooled.means.to_vec(), &whole.means.to_vec()));
    assert!(close(&pooled.within.to_vec(), &whole.within.to_vec()));
    // The task carries it in the task codec (f16 by default), as it does the head.
    let sent = tasks(&out)[0]
        .pooled
        .clone()
        .expect("round 2 carries the pool");
    assert_eq!(sent, pooled.recoded(fedge_wire::Codec::F16));
    // Round 2: only `x` sends one; the pool keeps 0.8 of round 1's weight.
    m.handle_packet("x", &update("x", 2, Some(summary(&rows_x, &[0, 1]))), 2);
    m.handle_packet("y", &update("y", 2, None), 2);
    let out = drain(&mut m);
    assert_eq!(
        reports(&out)[0].reported.len(),
        2,
        "a device without one still counts"
    );
    let next = m.pooled().cloned().unwrap();
    let expected: Vec<f64> = (whole.counts.iter())
        .zip([1.0, 1.0])
        .map(|(c, x)| 0.8 * c + x)
        .collect();
    assert!(
        next.counts
            .iter()
            .zip(&expected)
            .all(|(a, b)| (a - b).abs() < 1e-9)
    );
    // Kept across a restart.
    let saved = m.checkpoint();
    assert_eq!(saved.pooled.as_ref(), Some(&next));
    let resumed = Rounds::resume(
        pooling(),
        Box::new(crate::strategy::FedAvg),
        saved.clone(),
        7,
    )
    .unwrap();
    assert_eq!(resumed.pooled(), Some(&next));
    // A pool of another head's size does not resume.
    let wide = RoundConfig {
        // 1·2 + 2 + 2·1 + 1 = 7 values too, but one feature.
        head: Some(HeadConfig::new(1, 1).with_hidden(2)),
        ..pooling()
    };
    let wrong = Rounds::resume(wide, Box::new(crate::strategy::FedAvg), saved, 7);
    assert!(
        matches!(wrong, Err(ResumeError::Pooled(_))),
        "{:?}",
        wrong.err()
    );
}

#[test]
fn a_summary_that_does_not_fit_is_refused_and_leaves_the_pool_alone() {
    let three = RoundConfig {
        min_clients: 3,
        min_updates: 3,
        ..pooling()
    };
    let mut m = Rounds::new(three, Box::new(crate::strategy::FedAvg), vec![0.0; 7]);
    for c in ["x", "y", "z"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    let three_features =
        FeatureSummary::of_rows(3, 2, [[1.0f32, 2.0, 3.0]].iter().map(|r| &r[..]), &[0]);
    let huge = FeatureSummary {
        means: TensorF32::new(vec![2, 2], &[1e30, 0.0, 0.0, 0.0]).unwrap(),
        ..summary(&[[0.0, 0.0]], &[1])
    };
    let inflated = summary(&[[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], &[0, 1, 1]);
    m.handle_packet("x", &update("x", 1, three_features), 1);
    m.handle_packet("y", &update("y", 1, Some(huge)), 1);
    m.handle_packet("z", &update("z", 1, Some(inflated)), 1);
    assert_eq!(
        m.rejected_total().get("features"),
        Some(&3),
        "{:?}",
        m.rejected_total()
    );
    assert_eq!(m.pooled(), None);
}
