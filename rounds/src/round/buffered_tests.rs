//! Buffered mode (FedBuff) in the round machine, with simulated time and no broker.

use super::restart_tests::{keep, log_of};
use super::tests::{M, drain, reports, tasks, update};
use super::*;
use crate::buffer::AggregationConfig;
use crate::strategy::{FedAvg, ServerMomentum};

/// Buffered settings; the first version opens once `min_clients` are online.
fn buffered(buffer_size: usize, concurrency: usize, max_staleness: u64) -> RoundConfig {
    RoundConfig {
        rounds: 0,
        min_clients: 1,
        round_timeout_ms: 60_000,
        journal: true,
        aggregation: AggregationConfig::buffered(buffer_size, concurrency, max_staleness),
        ..RoundConfig::default()
    }
}

fn delta(client: &str, round: u64) -> [f32; M] {
    let c = client.as_bytes()[1] as f32;
    std::array::from_fn(|i| (c * 0.01 + round as f32 * 0.1) * (i as f32 - 1.5))
}

fn online(m: &mut Rounds, clients: &[&str], now_ms: u64) {
    for c in clients {
        m.handle_client_status(c, true, now_ms);
    }
}

fn send(m: &mut Rounds, client: &str, round: u64, now_ms: u64) {
    m.handle_packet(
        client,
        &update(client, round, delta(client, round), 10),
        now_ms,
    );
}

#[test]
fn a_version_every_k_updates_with_stale_ones_weighted_by_one_over_root_one_plus_s() {
    let mut config = RoundConfig {
        min_clients: 3,
        ..buffered(2, 0, 4)
    };
    // FedBuff as published: the samples alone weigh an update.
    config.aggregation.participation = crate::buffer::ParticipationWeight::None;
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2", "d3"], 0);
    let first = tasks(&drain(&mut m));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].selected, ["d1", "d2", "d3"]);
    assert_eq!(first[0].deadline_ms, 0, "a buffered task has no deadline");
    send(&mut m, "d1", 1, 10);
    assert_eq!(m.round(), 1, "half a buffer publishes nothing");
    send(&mut m, "d2", 1, 20);
    let out = drain(&mut m);
    let report = &reports(&out)[0];
    assert_eq!((report.round, report.staleness.clone()), (1, vec![2]));
    assert!(
        report.failures.is_empty(),
        "d3 is still training, not failing"
    );
    // Version 2 goes to the free devices only: d3 still trains version 1.
    let second = tasks(&out);
    assert_eq!(second[0].selected, ["d1", "d2"]);
    let v1 = m.params().to_vec();
    // d3's update, one version late, and d1's fresh one fill version 2's buffer.
    send(&mut m, "d3", 1, 30);
    send(&mut m, "d1", 2, 40);
    let report = reports(&drain(&mut m)).remove(0);
    assert_eq!(report.staleness, vec![1, 1]);
    let w = std::f32::consts::FRAC_1_SQRT_2;
    let (late, fresh) = (delta("d3", 1), delta("d1", 2));
    for (i, (got, before)) in m.params().iter().zip(&v1).enumerate() {
        let expected = before + (w * late[i] + fresh[i]) / 2.0;
        assert!((got - expected).abs() < 1e-6, "{i}: {got} vs {expected}");
    }
    assert_eq!(m.staleness_histogram(), &[3, 1]);
}

#[test]
fn beyond_max_staleness_an_update_is_refused_as_stale_and_its_device_is_free_again() {
    let config = RoundConfig {
        min_clients: 2,
        ..buffered(1, 0, 1)
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2"], 0);
    drain(&mut m);
    // d1 answers three versions while d2 trains version 1.
    for (round, t) in [(1, 10), (2, 20), (3, 30)] {
        send(&mut m, "d1", round, t);
    }
    assert_eq!(m.round(), 4);
    // Version 1 fell out of max_staleness at version 3, which d2 was given and trains next.
    assert_eq!(m.in_flight().round_of("d2"), Some(3));
    drain(&mut m);
    send(&mut m, "d2", 1, 40);
    let rejected: Vec<_> = drain(&mut m)
        .into_iter()
        .filter_map(|o| match o {
            Output::Rejected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, [Rejection::Stale]);
    assert_eq!(m.rejected_total().get("stale"), Some(&1));
    send(&mut m, "d2", 3, 50);
    assert_eq!(
        m.round(),
        5,
        "d2's answer to version 3 filled version 4's buffer"
    );
}

#[test]
fn concurrency_bounds_the_devices_training_and_slots_free_by_timeout() {
    let mut config = buffered(2, 2, 5);
    config.round_timeout_ms = 1_000;
    config.min_clients = 4;
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2", "d3", "d4"], 0);
    let first = tasks(&drain(&mut m));
    assert_eq!(first[0].selected.len(), 2);
    // Nobody answers: after the timeout, two others are given the task too.
    m.handle_timeout(m.poll_timeout().unwrap());
    let topped = tasks(&drain(&mut m));
    assert_eq!(topped[0].selected.len(), 4);
    assert_eq!(m.in_flight().len(), 4);
    // A timed-out device's update still counts.
    let late = first[0].selected[0].clone();
    send(&mut m, &late, 1, 5_000);
    assert_eq!(m.reported(), 1);
}

#[test]
fn an_update_from_a_device_given_no_task_is_refused_and_counts_nothing() {
    let config = RoundConfig {
        min_clients: 2,
        ..buffered(2, 1, 5)
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2"], 0);
    let given = tasks(&drain(&mut m))[0].selected.clone();
    let other = if given[0] == "d1" { "d2" } else { "d1" };
    send(&mut m, other, 1, 10);
    send(&mut m, &given[0], 2, 10);
    assert_eq!(m.reported(), 0);
    assert_eq!(m.rejected_total().get("not_selected"), Some(&1));
    assert_eq!(m.rejected_total().get("wrong_round"), Some(&1));
}

const DEVICES: [&str; 5] = ["d1", "d2", "d3", "d4", "d5"];

/// The arrivals of the restart test: (client, round it answers, time).
const ARRIVALS: [(&str, u64, u64); 9] = [
    ("d1", 1, 10),
    ("d2", 1, 20),
    ("d3", 1, 30),
    ("d4", 1, 40),
    ("d5", 2, 2_100),
    ("d1", 2, 2_200),
    ("d2", 2, 2_300),
    ("d3", 2, 2_400),
    ("d1", 3, 2_500),
];

fn momentum() -> Box<dyn Strategy> {
    Box::new(ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap())
}

#[test]
fn killed_with_a_half_full_buffer_the_machine_resumes_it_and_ends_bit_for_bit_like_an_uninterrupted_one()
 {
    let config = RoundConfig {
        rounds: 3,
        min_clients: 4,
        ..buffered(3, 0, 2)
    };
    let run = |kill_after: Option<usize>| {
        let mut m = Rounds::new(config.clone(), momentum(), vec![0.0; M]);
        let (mut journal, mut checkpoint) = (Vec::new(), None);
        online(&mut m, &["d1", "d2", "d3", "d4"], 0);
        keep(&mut m, &mut journal, &mut checkpoint);
        for (i, &(client, round, t)) in ARRIVALS.iter().enumerate() {
            if t == 2_100 {
                // d5 comes online mid-buffer and is given the open version by a top-up.
                m.handle_client_status("d5", true, 1_000);
                m.handle_timeout(1_000 + TOP_UP_DELAY_MS);
                keep(&mut m, &mut journal, &mut checkpoint);
            }
            send(&mut m, client, round, t);
            keep(&mut m, &mut journal, &mut checkpoint);
            if Some(i) == kill_after {
                let saved = checkpoint.clone().expect("a version was checkpointed");
                m = Rounds::resume(config.clone(), momentum(), saved, M).unwrap();
                let restored = m.restore_round(log_of(&journal), t + 1);
                assert!(restored.is_some_and(|(_, held)| held > 0), "{restored:?}");
                let devices = if t < 1_000 {
                    &DEVICES[..4]
                } else {
                    &DEVICES[..]
                };
                online(&mut m, devices, t + 1);
                keep(&mut m, &mut journal, &mut checkpoint);
            }
        }
        assert_eq!(
            m.phase(),
            Phase::Finished,
            "{:?} {:?}",
            m.round(),
            m.rejected_total()
        );
        (m.params().to_vec(), m.staleness_histogram().to_vec())
    };
    let reference = run(None);
    assert_eq!(reference.1, [6, 3], "three updates arrived a version late");
    // Killed with version 2's buffer holding d4's late update and d5's (given version 2 by a
    // top-up, which only the journal's `Selected` record remembers), with version 3's holding
    // d2's late one, and with two of version 3's three in.
    for kill_after in [4, 6, 7] {
        let resumed = run(Some(kill_after));
        let bits = |p: &[f32]| p.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&resumed.0),
            bits(&reference.0),
            "killed after arrival {kill_after}"
        );
    }
}

#[test]
fn with_interval_weighting_a_device_answering_every_other_version_weighs_twice() {
    let config = RoundConfig {
        min_clients: 3,
        ..buffered(2, 0, 4)
    };
    assert_eq!(
        config.aggregation.participation,
        crate::buffer::ParticipationWeight::Interval
    );
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2", "d3"], 0);
    drain(&mut m);
    // Version 1: d1 and d2; version 2: d1 again and d3 (its first, one version late).
    send(&mut m, "d1", 1, 10);
    send(&mut m, "d2", 1, 20);
    let v1 = m.params().to_vec();
    send(&mut m, "d1", 2, 30);
    send(&mut m, "d3", 1, 40);
    assert_eq!(m.round(), 3);
    // d1 counted in version 1 (interval 1: weight 10); d3's first update took two versions
    // (weight 20) and is one version stale (1/√2).
    let w = std::f32::consts::FRAC_1_SQRT_2;
    let (fresh, late) = (delta("d1", 2), delta("d3", 1));
    for (i, (got, before)) in m.params().iter().zip(&v1).enumerate() {
        let expected = before + (10.0 * fresh[i] + 20.0 * w * late[i]) / 30.0;
        assert!((got - expected).abs() < 1e-6, "{i}: {got} vs {expected}");
    }
}

#[test]
fn with_every_device_gone_a_version_stays_open_without_a_deadline() {
    let mut m = Rounds::new(buffered(1, 0, 10), Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1"], 0);
    m.handle_timeout(2_000);
    m.handle_client_status("d1", false, 3_000);
    m.handle_timeout(4_000);
    assert_eq!(
        (m.deadline_ms(), m.poll_timeout()),
        (None, None),
        "nothing to wait for"
    );
    // Its update, made while away, still finds version 1 open when it is back.
    m.handle_client_status("d1", true, 9_000);
    send(&mut m, "d1", 1, 9_001);
    assert_eq!((m.round(), m.aggregated_rounds()), (2, 1));
    // min_clients gates only the first version: version 2 is open with d1 alone.
    m.handle_client_status("d1", false, 9_002);
    assert_eq!(m.phase(), Phase::Training);
}

#[test]
fn a_new_run_frees_every_device_still_training_the_old_one() {
    let config = RoundConfig {
        rounds: 1,
        min_clients: 2,
        ..buffered(1, 0, 10)
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    online(&mut m, &["d1", "d2"], 0);
    send(&mut m, "d1", 1, 10);
    assert_eq!(m.phase(), Phase::Finished);
    assert!(m.in_flight().contains("d2"), "d2 still trains version 1");
    m.apply_control(&fedge_wire::control::Command::NewRun { rounds: 2 }, 20);
    assert_eq!(m.phase(), Phase::Training);
    let task = tasks(&drain(&mut m)).pop().unwrap();
    assert_eq!(task.selected, ["d1", "d2"], "both free in the new run");
}
