//! Round tasks in the round's codec: f16 by default, f32 in lossless mode, the coordinator's
//! model kept in f32.

use fedge_wire::{Codec, TrainParams};

use super::tests::{M, config, drain, feddim_update, tasks, update};
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
