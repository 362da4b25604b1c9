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
    update_of(client, round, 2, features)
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

/// `n` rows of each class around `(centre, centre)` and `(centre + 4, centre + 3)`, spread ±1.
fn rows_at(centre: f32, n: usize) -> (Vec<[f32; 2]>, Vec<u32>) {
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for i in 0..n {
        let e = if i % 2 == 0 { 1.0 } else { -1.0 };
        rows.push([centre + e, centre - e]);
        labels.push(0);
        rows.push([centre + 4.0 + e, centre + 3.0 - e]);
        labels.push(1);
    }
    (rows, labels)
}

fn summary_at(centre: f32) -> FeatureSummary {
    let (rows, labels) = rows_at(centre, 6);
    summary(&rows, &labels)
}

fn three_devices() -> Rounds {
    let three = RoundConfig {
        min_clients: 3,
        min_updates: 3,
        ..pooling()
    };
    let mut m = Rounds::new(three, Box::new(crate::strategy::FedAvg), vec![0.0; 7]);
    for c in ["x", "y", "z"] {
        m.handle_client_status(c, true, 0);
    }
    m
}

fn update_of(client: &str, round: u64, samples: u32, features: Option<FeatureSummary>) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        run: 0,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: samples,
        delta: TensorF32::from_slice(&[0.0; 7]),
        metrics: Default::default(),
        class_stats: None,
        prototypes: None,
        features,
    }))
}

#[test]
fn the_devices_summaries_are_pooled_into_the_next_task_and_the_release() {
    let mut m = three_devices();
    let first = tasks(&drain(&mut m)).remove(0);
    assert_eq!(first.pooled, None, "no device has sent a summary yet");
    let parts = [summary_at(0.0), summary_at(1.0), summary_at(2.0)];
    for (c, part) in ["x", "y", "z"].iter().zip(&parts) {
        m.handle_packet(c, &update_of(c, 1, 12, Some(part.clone())), 1);
    }
    let out = drain(&mut m);
    let pooled = releases(&out)[0]
        .pooled
        .clone()
        .expect("the release carries the pool");
    // Honest devices near one another: every count, and exactly the merge of their rows.
    let whole = FeatureSummary::merge(parts.iter()).unwrap();
    assert_eq!(pooled.counts, vec![18.0, 18.0]);
    assert!(
        close(&pooled.means.to_vec(), &whole.means.to_vec()),
        "{pooled:?}"
    );
    assert!(
        close(&pooled.within.to_vec(), &whole.within.to_vec()),
        "{pooled:?}"
    );
    // The task carries it in the task codec (f16 by default), as it does the head.
    let sent = tasks(&out)[0]
        .pooled
        .clone()
        .expect("round 2 carries the pool");
    assert_eq!(sent, pooled.recoded(fedge_wire::Codec::F16));
    // Round 2: only two devices send one, too few for any class: the pool only decays.
    m.handle_packet("x", &update_of("x", 2, 12, Some(summary_at(0.0))), 2);
    m.handle_packet("y", &update_of("y", 2, 12, Some(summary_at(1.0))), 2);
    m.handle_packet("z", &update_of("z", 2, 12, None), 2);
    let out = drain(&mut m);
    assert_eq!(
        reports(&out)[0].reported.len(),
        3,
        "a device without one still counts"
    );
    let next = m.pooled().cloned().unwrap();
    assert_eq!(
        next.counts, pooled.counts,
        "no class had three devices: unchanged"
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
fn one_hostile_summary_moves_the_pool_by_a_bounded_amount() {
    // Round 1 with a hostile device among three: every value 1e5 (within the value bound, no
    // pool yet to compare with), claiming all its samples.
    let mut m = three_devices();
    drain(&mut m);
    let hostile = FeatureSummary {
        means: TensorF32::new(vec![2, 2], &[1e5; 4]).unwrap(),
        within: TensorF32::from_slice(&[1e5, 1e5]),
        ..summary_at(0.0)
    };
    m.handle_packet("x", &update_of("x", 1, 12, Some(summary_at(0.0))), 1);
    m.handle_packet("y", &update_of("y", 1, 12, Some(summary_at(1.0))), 1);
    m.handle_packet("z", &update_of("z", 1, 12, Some(hostile)), 1);
    drain(&mut m);
    let pool = m.pooled().cloned().unwrap();
    // Its means clipped to the devices' median (at most 0.5 from the honest pair's merge)
    // ± 4 × 1.48 MAD (MAD 1): with a third of the rows, it moves a class mean by at most
    // (0.5 + 5.9) / 3 from the honest devices' merge; its spread to 4 × the median one.
    let honest = FeatureSummary::merge([summary_at(0.0), summary_at(1.0)].iter()).unwrap();
    for (v, h) in pool.means.values().zip(honest.means.values()) {
        assert!((v - h).abs() < 2.2, "{v} against {h}: {pool:?}");
    }
    assert!(pool.within.values().all(|w| w < 16.0), "{pool:?}");
    // Round 2: now out of the band around the pool, the same summary is refused as
    // `features`, and so is a 1e9 one (beyond the value bound); the pool does not move.
    for huge in [1e5f32, 1e9] {
        let summary = FeatureSummary {
            means: TensorF32::new(vec![2, 2], &[huge; 4]).unwrap(),
            ..summary_at(0.0)
        };
        m.handle_packet("z", &update_of("z", 2, 12, Some(summary)), 2);
    }
    assert_eq!(
        m.rejected_total().get("features"),
        Some(&2),
        "{:?}",
        m.rejected_total()
    );
    // A class of fewer than five rows is never sent by a device: refused too.
    let single = summary(&[[0.5, 0.5]], &[0]);
    m.handle_packet("y", &update_of("y", 2, 12, Some(single)), 2);
    assert_eq!(m.rejected_total().get("features"), Some(&3));
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

#[test]
fn a_release_carries_the_pool_its_head_was_trained_with_not_the_one_folded_since() {
    let mut m = three_devices();
    drain(&mut m);
    for (c, centre) in [("x", 0.0), ("y", 1.0), ("z", 2.0)] {
        m.handle_packet(c, &update_of(c, 1, 12, Some(summary_at(centre))), 1);
    }
    let out = drain(&mut m);
    let sent = tasks(&out)[0]
        .pooled
        .clone()
        .expect("round 2 carries the pool");
    // Round 2's devices standardise with `sent`; their summaries move the pool on.
    for (c, centre) in [("x", 0.5), ("y", 1.5), ("z", 2.5)] {
        m.handle_packet(c, &update_of(c, 2, 12, Some(summary_at(centre))), 2);
    }
    let out = drain(&mut m);
    assert_eq!(reports(&out)[0].reported.len(), 3);
    let folded = m.pooled().cloned().unwrap();
    assert_ne!(
        folded.recoded(fedge_wire::Codec::F16),
        sent,
        "the pool moved"
    );
    let released = releases(&out)[0].pooled.clone().expect("a pool");
    assert_eq!(
        released, sent,
        "round 2's head serves with what it trained with"
    );
    // The next task carries the pool folded since.
    let next = tasks(&out)[0].pooled.clone().unwrap();
    assert_eq!(next, folded.recoded(fedge_wire::Codec::F16));
}
