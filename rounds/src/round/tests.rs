//! Tests of the round state machine, with simulated time and no broker.

use fedge_wire::{ClientUpdate, RoundTask, TensorF32};

use super::*;
use crate::strategy::FedAvg;
use fedge_wire::{Chunk, LocalMetrics};

pub(super) const M: usize = 4;

pub(super) fn machine(clients: &[&str], config: RoundConfig) -> Rounds {
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    for c in clients {
        m.handle_client_status(c, true, 0);
    }
    m
}

pub(super) fn config() -> RoundConfig {
    RoundConfig {
        rounds: 2,
        min_clients: 2,
        min_updates: 2,
        round_timeout_ms: 1_000,
        ..RoundConfig::default()
    }
}

pub(super) fn update(client: &str, round: u64, delta: [f32; M], n: u32) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 0,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: n,
        delta: TensorF32::from_slice(&delta),
        metrics: LocalMetrics {
            val_accuracy: 0.5,
            val_samples: 10,
            ..LocalMetrics::default()
        },
        class_stats: None,
        prototypes: None,
    }))
}

pub(super) fn drain(m: &mut Rounds) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

pub(super) fn tasks(outputs: &[Output]) -> Vec<RoundTask> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::PublishTask { frame, .. } => match fedge_wire::decode(frame) {
                Ok(Message::RoundTask(t)) => Some(t),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

pub(super) fn reports(outputs: &[Output]) -> Vec<RoundReport> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::RoundEnded(r) => Some(r.as_ref().clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn waits_for_min_clients_then_publishes_round_one_with_current_params() {
    let mut m = Rounds::new(config(), Box::new(FedAvg), vec![1.0, 2.0, 3.0, 4.0]);
    m.handle_client_status("a", true, 0);
    assert_eq!(m.phase(), Phase::Waiting);
    assert!(tasks(&drain(&mut m)).is_empty());
    m.handle_client_status("b", true, 5);
    let t = tasks(&drain(&mut m));
    assert_eq!(t.len(), 1);
    assert_eq!(
        (t[0].round, t[0].selected.clone()),
        (1, vec!["a".to_string(), "b".to_string()])
    );
    assert_eq!(t[0].params.to_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(m.poll_timeout(), Some(1_005));
}

#[test]
fn round_closes_when_all_selected_reported_and_applies_fedavg() {
    let mut m = machine(&["a", "b"], config());
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [1.0, 0.0, 0.0, 0.0], 1), 10);
    assert_eq!(m.reported(), 1);
    m.handle_packet("b", &update("b", 1, [0.0, 4.0, 0.0, 0.0], 3), 20);
    let out = drain(&mut m);
    let r = reports(&out);
    assert_eq!(r.len(), 1);
    assert!(r[0].aggregated);
    assert_eq!(r[0].duration_ms, 20);
    assert_eq!(m.params(), &[0.25, 3.0, 0.0, 0.0]);
    let next = tasks(&out);
    assert_eq!(next[0].round, 2);
    assert_eq!(next[0].params.to_vec(), vec![0.25, 3.0, 0.0, 0.0]);
}

#[test]
fn finishes_after_the_configured_rounds() {
    let mut m = machine(&["a", "b"], config());
    for round in 1..=2 {
        for c in ["a", "b"] {
            m.handle_packet(c, &update(c, round, [1.0; M], 1), round * 100);
        }
    }
    let out = drain(&mut m);
    assert_eq!(m.phase(), Phase::Finished);
    assert!(out.contains(&Output::Finished));
    assert_eq!(m.params(), &[2.0; M]);
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn bad_updates_are_rejected_counted_and_leave_the_model_untouched() {
    let mut m = machine(&["a", "b"], config());
    drain(&mut m);
    m.handle_packet("a", b"garbage bytes", 1);
    m.handle_packet("a", &update("a", 7, [1.0; M], 1), 2);
    m.handle_packet("a", &update("b", 1, [1.0; M], 1), 3);
    m.handle_packet("a", &update("a", 1, [f32::NAN, 0.0, 0.0, 0.0], 1), 4);
    m.handle_packet("c", &update("c", 1, [1.0; M], 1), 5);
    let short = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 0,
        round: 1,
        client_id: "a".into(),
        seq: 1,
        num_samples: 1,
        delta: TensorF32::from_slice(&[1.0]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }));
    m.handle_packet("a", &short, 6);
    m.handle_packet("a", &update("a", 1, [1.0; M], 0), 7);
    let mut corrupted = update("a", 1, [1.0; M], 1);
    let mid = corrupted.len() / 2;
    corrupted[mid] ^= 0x40;
    m.handle_packet("a", &corrupted, 8);
    let counts: Vec<(&str, u64)> = m.rejected_total().iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(
        counts,
        vec![
            ("client_mismatch", 1),
            ("malformed", 2),
            ("no_samples", 1),
            ("non_finite", 1),
            ("not_selected", 1),
            ("shape", 1),
            ("wrong_round", 1)
        ]
    );
    assert_eq!(m.params(), &[0.0; M]);
    assert_eq!(m.reported(), 0);
    // The round goes on: valid updates still close it.
    m.handle_packet("a", &update("a", 1, [1.0; M], 1), 9);
    m.handle_packet("a", &update("a", 1, [5.0; M], 1), 9);
    assert_eq!(m.rejected_total()["duplicate"], 1);
    m.handle_packet("b", &update("b", 1, [3.0; M], 1), 10);
    assert_eq!(m.params(), &[2.0; M]);
}

#[test]
fn late_update_for_a_closed_round_is_rejected() {
    let mut m = machine(&["a", "b"], config());
    m.handle_packet("a", &update("a", 1, [1.0; M], 1), 1);
    m.handle_packet("b", &update("b", 1, [1.0; M], 1), 2);
    m.handle_packet("a", &update("a", 1, [9.0; M], 1), 3);
    assert_eq!(m.rejected_total()["wrong_round"], 1);
    assert_eq!(m.params(), &[1.0; M]);
}

#[test]
fn deadline_with_quorum_aggregates_what_arrived() {
    let mut m = machine(
        &["a", "b", "c"],
        RoundConfig {
            min_clients: 3,
            ..config()
        },
    );
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [2.0; M], 1), 10);
    m.handle_packet("b", &update("b", 1, [4.0; M], 1), 20);
    m.handle_timeout(999);
    assert_eq!(m.round(), 1);
    m.handle_timeout(1_000);
    let r = reports(&drain(&mut m));
    assert_eq!(r[0].reported, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(m.params(), &[3.0; M]);
    assert_eq!(m.round(), 2);
}

#[test]
fn below_quorum_the_deadline_is_extended_once_then_the_round_is_abandoned() {
    let mut m = machine(&["a", "b"], config());
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [2.0; M], 1), 10);
    m.handle_timeout(1_000);
    assert_eq!((m.round(), m.poll_timeout()), (1, Some(2_000)));
    m.handle_timeout(2_000);
    let out = drain(&mut m);
    let r = reports(&out);
    assert!(!r[0].aggregated);
    assert_eq!(m.params(), &[0.0; M]);
    // A new round re-samples; abandoned rounds do not count towards `rounds`.
    assert_eq!(tasks(&out)[0].round, 2);
    assert_eq!(m.phase(), Phase::Training);
}

#[test]
fn chunked_update_is_reassembled_in_any_order() {
    let mut m = Rounds::new(config(), Box::new(FedAvg), vec![0.0; 64]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    let frame = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 0,
        round: 1,
        client_id: "a".into(),
        seq: 1,
        num_samples: 2,
        delta: TensorF32::from_slice(&[1.5; 64]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }));
    let mut pieces = fedge_wire::split_into_chunks(frame, 42, 109);
    assert!(pieces.len() >= 3, "{} pieces", pieces.len());
    pieces.reverse();
    for p in &pieces {
        m.handle_packet("a", p, 5);
    }
    assert_eq!(m.reported(), 1);
    // A chunk naming a different total length than its siblings is a bad chunk.
    let bad = fedge_wire::encode(&Message::Chunk(Chunk {
        message_id: 7,
        index: 5,
        count: 2,
        total_len: 10,
        data: vec![1],
        tag: None,
    }));
    m.handle_packet("b", &bad, 6);
    assert_eq!(m.rejected_total().get("bad_chunk"), Some(&1));
}

#[test]
fn sampling_respects_fraction_and_minimum_and_is_seeded() {
    let clients: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = clients.iter().map(|s| s.as_str()).collect();
    let cfg = RoundConfig {
        fraction: 0.3,
        min_clients: 2,
        ..config()
    };
    let mut one = machine(&refs, cfg.clone());
    let mut two = machine(&refs, cfg);
    let (t1, t2) = (tasks(&drain(&mut one)), tasks(&drain(&mut two)));
    // min_clients = 2 starts round 1 with 2 online; by then only c0 and c1 are online.
    assert_eq!(t1[0].selected, vec!["c0".to_string(), "c1".to_string()]);
    assert_eq!(t1, t2);
    // Once everyone is online, the fraction decides: ceil(0.3 * 10) = 3 per round.
    for c in ["c0", "c1"] {
        one.handle_packet(c, &update(c, 1, [1.0; M], 1), 10);
    }
    let t = tasks(&drain(&mut one));
    assert_eq!(t[0].round, 2);
    assert_eq!(t[0].selected.len(), 3);
}

#[test]
fn clients_joining_are_selected_next_round_and_offline_ones_are_not() {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 3,
            min_updates: 1,
            ..config()
        },
    );
    m.handle_client_status("c", true, 1);
    m.handle_packet("a", &update("a", 1, [1.0; M], 1), 2);
    m.handle_packet("b", &update("b", 1, [1.0; M], 1), 3);
    m.handle_client_status("c", false, 4);
    m.handle_packet("a", &update("a", 2, [1.0; M], 1), 5);
    m.handle_packet("b", &update("b", 2, [1.0; M], 1), 6);
    assert_eq!(
        m.round(),
        3,
        "round 2 closes without waiting for c, which went offline"
    );
    m.handle_timeout(1_003);
    let t = tasks(&drain(&mut m));
    let selected: Vec<Vec<String>> = t.iter().map(|t| t.selected.clone()).collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        selected,
        vec![s(&["a", "b"]), s(&["a", "b", "c"]), s(&["a", "b"])]
    );
}

fn fedomg_with_momentum() -> Box<dyn Strategy> {
    crate::strategy::StrategyConfig {
        strategy: crate::strategy::StrategyKind::Fedomg,
        server_momentum: 0.5,
        ..Default::default()
    }
    .build()
    .unwrap()
}

/// Plays `rounds` rounds in which "a" and "b" send fixed, different deltas.
fn play(m: &mut Rounds, first: u64, rounds: u64) -> Vec<RoundReport> {
    let mut out = Vec::new();
    for round in first..first + rounds {
        m.handle_packet(
            "b",
            &update("b", round, [0.0, 1.0, 0.5, 0.1], 30),
            round * 10,
        );
        m.handle_packet(
            "a",
            &update("a", round, [1.0, 0.0, 0.5, -0.2], 10),
            round * 10,
        );
        out.extend(reports(&drain(m)));
    }
    out
}

#[test]
fn fedomg_reports_gamma_per_client_and_momentum() {
    let config = RoundConfig {
        rounds: 3,
        ..config()
    };
    let mut m = Rounds::new(config, fedomg_with_momentum(), vec![0.0; M]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    let r = play(&mut m, 1, 1);
    let aggregation = r[0].aggregation.as_ref().unwrap();
    assert_eq!(aggregation.gamma.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert!((aggregation.gamma.values().sum::<f64>() - 1.0).abs() < 1e-9);
    assert_eq!(aggregation.solver.as_deref(), Some("reference"));
    assert!(aggregation.momentum_norm.unwrap() > 0.0);
    assert_eq!(r[0].reported, ["a", "b"], "client order, not arrival order");
}

#[test]
fn a_resumed_machine_continues_exactly_like_an_uninterrupted_one() {
    let config = RoundConfig {
        rounds: 4,
        ..config()
    };
    let start = |m: &mut Rounds| {
        m.handle_client_status("a", true, 0);
        m.handle_client_status("b", true, 0);
    };
    let mut straight = Rounds::new(config.clone(), fedomg_with_momentum(), vec![0.0; M]);
    start(&mut straight);
    play(&mut straight, 1, 4);

    let mut first = Rounds::new(config.clone(), fedomg_with_momentum(), vec![0.0; M]);
    start(&mut first);
    play(&mut first, 1, 2);
    let saved = first.checkpoint();
    assert!(saved.strategy_state.contains_key("server_momentum"));
    // The file format keeps the momentum buffer exactly (the checkpoint format's own tests), so
    // the value the machine hands out is what a restart reads back.
    let mut resumed =
        Rounds::resume(config.clone(), fedomg_with_momentum(), saved.clone(), M).unwrap();
    start(&mut resumed);
    let t = tasks(&drain(&mut resumed));
    assert_eq!(t[0].round, 3, "resumes at the next round");
    play(&mut resumed, 3, 2);
    assert_eq!(resumed.params(), straight.params());
    assert_eq!(resumed.phase(), Phase::Finished);

    let other = Rounds::resume(config.clone(), Box::new(FedAvg), saved.clone(), M);
    assert!(other.err().unwrap().to_string().contains("fedomg+momentum"));
    let wrong_size = Rounds::resume(config, fedomg_with_momentum(), saved, M + 1);
    assert!(matches!(
        wrong_size.err().unwrap(),
        ResumeError::Params { .. }
    ));
}

#[test]
fn updates_beyond_the_memory_budget_are_rejected_and_the_round_goes_on() {
    let config = RoundConfig {
        rounds: 1,
        min_updates: 1,
        update_memory_bytes: M * 4,
        ..config()
    };
    let mut m = machine(&["a", "b"], config);
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [1.0; M], 1), 1);
    m.handle_packet("b", &update("b", 1, [3.0; M], 1), 2);
    assert_eq!(m.rejected_total().get("memory_budget"), Some(&1));
    m.handle_timeout(1_000);
    let r = reports(&drain(&mut m));
    assert!(r[0].aggregated);
    assert_eq!(m.params(), &[1.0; M]);
}

#[test]
fn a_round_beyond_the_memory_budget_spills_and_aggregates_as_in_memory() {
    let budget = RoundConfig {
        rounds: 2,
        min_clients: 3,
        min_updates: 3,
        update_memory_bytes: M * 4,
        ..config()
    };
    let unlimited = RoundConfig {
        update_memory_bytes: usize::MAX,
        ..budget.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut spilled = Rounds::new(budget, Box::new(FedAvg), vec![0.0; M]);
    spilled.set_spill(crate::updates::spill::SpillFile::create(dir.path(), 1 << 20).unwrap());
    for c in ["a", "b", "c"] {
        spilled.handle_client_status(c, true, 0);
    }
    let mut in_memory = machine(&["a", "b", "c"], unlimited);
    let mut used_spill = Vec::new();
    for m in [&mut spilled, &mut in_memory] {
        let mut r = Vec::new();
        for round in 1..=2u64 {
            let x = round as f32;
            m.handle_packet("c", &update("c", round, [0.5 * x; M], 3), 10 * round);
            used_spill.push(m.round_spilled());
            m.handle_packet("a", &update("a", round, [1.0; M], 1), 10 * round + 1);
            m.handle_packet("b", &update("b", round, [-2.0 * x; M], 2), 10 * round + 2);
            r.extend(reports(&drain(m)));
        }
        assert_eq!(r.len(), 2, "{:?}", m.rejected_total());
        assert!(
            r.iter().all(|r| r.aggregated && r.reported.len() == 3),
            "{r:?}"
        );
    }
    assert_eq!(used_spill, [true, true, false, false]);
    assert!(spilled.rejected_total().is_empty());
    assert_eq!(spilled.params(), in_memory.params());
    assert_ne!(spilled.params(), &[0.0; M]);
}
