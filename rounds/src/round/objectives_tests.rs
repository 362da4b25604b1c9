//! The objectives' server sides in the round machine: FedDIM's insight rebuilt from the
//! devices' class means, FedDDL's prototypes averaged by count, each sent with the next task.

use fedge_wire::{ClientUpdate, TensorF32};

use super::tests::{M, config, drain, machine, tasks, update};
use super::*;
use crate::objectives::feddim::InsightConfig;
use crate::strategy::FedAvg;
use fedge_wire::LocalMetrics;

pub(super) fn feddim_update(
    client: &str,
    round: u64,
    delta: [f32; M],
    counts: [u32; 2],
    means: [f32; 2],
) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 0,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: 4,
        delta: TensorF32::from_slice(&delta),
        metrics: LocalMetrics::default(),
        class_stats: Some(fedge_wire::ClassStats {
            counts: counts.to_vec(),
            means: TensorF32::from_slice(&means),
        }),
        prototypes: None,
    }))
}

#[test]
fn feddim_rebuilds_insight_from_class_means_and_sends_it_with_the_next_task() {
    // Read as a head with H = 1, K = 2: W = params[0..2], b = params[2..4].
    let config = RoundConfig {
        insight: Some(InsightConfig {
            hidden: 1,
            classes: 2,
            momentum: 0.5,
        }),
        rounds: 3,
        ..config()
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![1.0, 2.0, 0.0, 0.0]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    assert_eq!(
        tasks(&drain(&mut m))[0].insight,
        None,
        "no Ī before the first round"
    );
    // An update without class statistics is rejected.
    m.handle_packet("a", &update("a", 1, [0.0; M], 1), 1);
    assert_eq!(m.rejected_total().get("insight"), Some(&1));
    // a: W_a = [1, 2] + [1, 0] = [2, 2], z̄ = [0.5 (class 0), 3 (class 1)];
    // b: W_b = [1, 2] + [0, 2] = [1, 4], z̄ = [2 (class 0)], never saw class 1.
    m.handle_packet(
        "a",
        &feddim_update("a", 1, [1.0, 0.0, 0.0, 0.0], [3, 1], [0.5, 3.0]),
        2,
    );
    m.handle_packet(
        "b",
        &feddim_update("b", 1, [0.0, 2.0, 0.0, 0.0], [3, 0], [2.0, 0.0]),
        3,
    );
    let outputs = drain(&mut m);
    // Class 0: mean of [2·0.5, 2·0.5] and [1·2, 4·2] = [1.5, 4.5]; class 1: only a: [6, 6].
    assert_eq!(m.insight(), Some(&[1.5, 4.5, 6.0, 6.0][..]));
    let next = &tasks(&outputs)[0];
    let sent = next.insight.as_ref().unwrap();
    assert_eq!(sent.shape(), &[2, 1, 2]);
    assert_eq!(sent.to_vec(), vec![1.5, 4.5, 6.0, 6.0]);
    // Round 2: only class 0 seen; momentum 0.5 moves class 0, class 1 keeps its value.
    let global = m.params().to_vec();
    assert_eq!(global, vec![1.5, 3.0, 0.0, 0.0]);
    m.handle_packet(
        "a",
        &feddim_update("a", 2, [0.5, 1.0, 0.0, 0.0], [3, 0], [1.0, 0.0]),
        4,
    );
    m.handle_packet(
        "b",
        &feddim_update("b", 2, [0.5, 1.0, 0.0, 0.0], [3, 0], [1.0, 0.0]),
        5,
    );
    drain(&mut m);
    // Both W = [2, 4], z̄_0 = 1 → Ī_round(0) = [2, 4]; Ī(0) = 0.5·[1.5, 4.5] + 0.5·[2, 4].
    let insight = m.insight().unwrap();
    assert_eq!(&insight[..2], &[1.75, 4.25]);
    assert_eq!(
        &insight[2..],
        &[6.0, 6.0],
        "nobody saw class 1: it keeps its value"
    );
    let saved = m.checkpoint();
    assert_eq!(saved.insight, insight.to_vec());
}

fn fedddl_update(client: &str, round: u64, counts: [u32; 2], means: [f32; 2]) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 0,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: 4,
        delta: TensorF32::from_slice(&[0.5; M]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: Some(fedge_wire::ClassStats {
            counts: counts.to_vec(),
            means: TensorF32::from_slice(&means),
        }),
    }))
}

#[test]
fn fedddl_averages_prototypes_by_count_and_sends_them_with_the_next_task() {
    let config = RoundConfig {
        prototypes: Some(crate::objectives::fedddl::PrototypeConfig {
            hidden: 1,
            classes: 2,
        }),
        ..config()
    };
    let mut m = machine(&["a", "b"], config);
    m.start(0);
    assert_eq!(tasks(&drain(&mut m))[0].prototypes, None, "none at first");
    // Without prototypes, or with the wrong shape, or not finite: rejected, nothing applied.
    m.handle_packet("a", &update("a", 1, [0.0; M], 1), 1);
    m.handle_packet("a", &fedddl_update("a", 1, [1, 1], [f32::NAN, 0.0]), 2);
    assert_eq!(m.rejected_total().get("prototypes"), Some(&1));
    assert_eq!(m.rejected_total().get("non_finite"), Some(&1));
    // a: class 0 from 1 sample at 2.0, class 1 from 3 at 4.0; b: class 0 from 3 at 6.0.
    m.handle_packet("a", &fedddl_update("a", 1, [1, 3], [2.0, 4.0]), 3);
    m.handle_packet("b", &fedddl_update("b", 1, [3, 0], [6.0, 0.0]), 4);
    let outputs = drain(&mut m);
    assert_eq!(m.prototypes(), Some(&[5.0, 4.0][..]));
    let next = &tasks(&outputs)[0];
    let sent = next.prototypes.as_ref().unwrap();
    assert_eq!(
        (sent.shape(), sent.to_vec()),
        (&[2u32, 1][..], vec![5.0, 4.0])
    );
    assert_eq!(m.checkpoint().prototypes, vec![5.0, 4.0]);
}
