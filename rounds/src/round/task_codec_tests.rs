//! Round tasks in the round's codec: f16 by default, f32 in lossless mode, the coordinator's
//! model kept in f32; updates held in the codec they came in.

use fedge_wire::{ClientUpdate, Codec, LocalMetrics, TensorF32, TrainParams};

use super::objectives_tests::feddim_update;
use super::tests::{M, config, drain, tasks, update};
use super::*;
use crate::objectives::feddim::InsightConfig;
use crate::strategy::FedAvg;

/// 1 + 2⁻¹⁴ is below f16's resolution at 1 (2⁻¹⁰): f16 carries it as 1.
const FINE: f32 = 1.0 + 1.0 / 16_384.0;

fn with_codec(codec: Codec, rounds: u64) -> RoundConfig {
    RoundConfig {
        train: TrainParams {
            update_codec: codec,
            ..TrainParams::default()
        },
        rounds,
        ..config()
    }
}

#[test]
fn tasks_travel_in_f16_unless_updates_are_lossless() {
    for (codec, task_codec, sent) in [
        (Codec::F32, Codec::F32, FINE),
        (Codec::F16, Codec::F16, 1.0),
        (Codec::Int8, Codec::F16, 1.0),
    ] {
        let mut m = Rounds::new(
            with_codec(codec, 2),
            Box::new(FedAvg),
            vec![FINE, 2.0, 0.5, 0.0],
        );
        m.handle_client_status("a", true, 0);
        m.handle_client_status("b", true, 0);
        let task = tasks(&drain(&mut m)).remove(0);
        assert_eq!(task.params.codec(), task_codec, "updates in {codec}");
        assert_eq!(task.params.to_vec(), vec![sent, 2.0, 0.5, 0.0]);
    }
}

#[test]
fn the_coordinator_keeps_its_model_in_f32_so_small_steps_add_up() {
    // Ten rounds of a step below f16's resolution: the task rounds it away every time, the
    // coordinator's model does not.
    let step = 1.0 / 16_384.0;
    let mut m = Rounds::new(with_codec(Codec::F16, 10), Box::new(FedAvg), vec![1.0; M]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    drain(&mut m);
    for round in 1..=10 {
        m.handle_packet(
            "a",
            &update("a", round, [step, 0.0, 0.0, 0.0], 1),
            round * 10,
        );
        m.handle_packet(
            "b",
            &update("b", round, [step, 0.0, 0.0, 0.0], 1),
            round * 10 + 1,
        );
        drain(&mut m);
    }
    assert_eq!(m.params()[0], 1.0 + 10.0 * step);
}

#[test]
fn feddim_rebuilds_classifiers_from_the_parameters_the_task_carried() {
    // A head with H = 1, K = 2: W = params[0..2]. W[0] = 1 + 2⁻¹⁴ travels as 1 in f16, so the
    // client's classifier is [1, 2] + delta, not [FINE, 2] + delta.
    let config = RoundConfig {
        insight: Some(InsightConfig {
            hidden: 1,
            classes: 2,
            momentum: 0.5,
        }),
        ..with_codec(Codec::F16, 2)
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![FINE, 2.0, 0.0, 0.0]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    drain(&mut m);
    for (client, t) in [("a", 1), ("b", 2)] {
        m.handle_packet(
            client,
            &feddim_update(client, 1, [1.0, 0.0, 0.0, 0.0], [2, 0], [0.5, 0.0]),
            t,
        );
    }
    drain(&mut m);
    // W = [2, 2], z̄_0 = 0.5: Ī(0) = [1, 1], exactly; with the f32 model it would be 1 + 2⁻¹⁵.
    assert_eq!(&m.insight().unwrap()[..2], &[1.0, 1.0]);
}

/// A round's updates from three clients, sent in `codec`, against the round machine with
/// `strategy`; the model after one round and the arena's bytes with two held (the third
/// closes the round).
fn one_round(
    strategy: Box<dyn crate::strategy::Strategy>,
    codec: Codec,
    m: usize,
) -> (Vec<f32>, usize) {
    let config = RoundConfig {
        min_clients: 3,
        min_updates: 3,
        ..with_codec(Codec::F16, 1)
    };
    let start: Vec<f32> = (0..m).map(|j| (j % 13) as f32 * 0.1).collect();
    let mut machine = Rounds::new(config, strategy, start);
    for c in ["a", "b", "c"] {
        machine.handle_client_status(c, true, 0);
    }
    drain(&mut machine);
    let mut bytes = 0;
    for (u, client) in ["c", "a", "b"].into_iter().enumerate() {
        // Values f16 rounds: the f32 copy below is of the rounded values, so both machines
        // aggregate the same numbers and only their storage differs.
        let raw: Vec<f32> = (0..m)
            .map(|j| ((u * 31 + j * 17) % 101) as f32 / 707.0 - 0.07)
            .collect();
        let halves = TensorF32::from_slice_with(&raw, Codec::F16);
        let delta = match codec {
            Codec::F16 => halves,
            _ => TensorF32::from_slice(&halves.to_vec()),
        };
        let frame = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
            features: None,
            run: 0,
            round: 1,
            client_id: client.into(),
            seq: 1,
            num_samples: 10 + u as u32,
            delta,
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        }));
        machine.handle_packet(client, &frame, 10 + u as u64);
        if let Some(open) = &machine.open {
            bytes = open.accepted.arena_bytes();
        }
    }
    drain(&mut machine);
    (machine.params().to_vec(), bytes)
}

#[test]
fn f16_updates_take_half_the_arena_and_give_the_same_model_bit_for_bit() {
    use crate::strategy::robust::RobustRule;
    use crate::strategy::{FedOmg, Robust};
    let m = 1_001;
    let strategies: [fn() -> Box<dyn crate::strategy::Strategy>; 3] = [
        || Box::new(FedAvg),
        || Box::new(FedOmg::default()),
        || Box::new(Robust::new(Box::new(FedAvg), RobustRule::Median)),
    ];
    for strategy in strategies {
        let (held_f16, f16_bytes) = one_round(strategy(), Codec::F16, m);
        let (held_f32, f32_bytes) = one_round(strategy(), Codec::F32, m);
        let name = strategy().name().to_string();
        assert_eq!(f16_bytes, 2 * m.div_ceil(2) * 4, "{name}");
        assert_eq!(f32_bytes, 2 * m * 4, "{name}");
        let start: Vec<f32> = (0..m).map(|j| (j % 13) as f32 * 0.1).collect();
        assert!(held_f16 != start, "{name} moved the model");
        let same = held_f16
            .iter()
            .zip(&held_f32)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name}: f16 and f32 arenas aggregate differently");
    }
}
