//! Hostile senders against the round machine, without a broker: what one device (keyed or
//! not) can do to a round and to the model, and what it cannot.

use super::guard_tests::{key, keyed_machine, rejected, sealed};
use super::tests::{M, config, drain, reports, update};

use fedge_wire::{ClientUpdate, LocalMetrics, TensorF32};

use super::*;
use crate::strategy::{Aggregated, Failure, FedAvg};

fn machine(clients: &[&str], config: RoundConfig) -> Rounds {
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    for c in clients {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    m
}

fn three() -> RoundConfig {
    RoundConfig {
        min_clients: 3,
        ..config()
    }
}

#[test]
fn a_huge_delta_with_a_huge_sample_count_is_refused_and_the_model_stays_finite() {
    let mut m = machine(&["a", "b", "mallory"], three());
    m.handle_packet("a", &update("a", 1, [1.0, 0.0, 0.0, 0.0], 10), 1);
    m.handle_packet("b", &update("b", 1, [0.0, 1.0, 0.0, 0.0], 10), 2);
    m.handle_packet("mallory", &update("mallory", 1, [1e30; M], u32::MAX), 3);
    m.handle_timeout(config().round_timeout_ms);
    let out = drain(&mut m);
    assert_eq!(rejected(&out), vec![("mallory".into(), "norm")]);
    assert!(reports(&out)[0].aggregated);
    assert_eq!(m.params(), &[0.5, 0.5, 0.0, 0.0]);
}

#[test]
fn a_claimed_sample_count_is_cut_to_ten_times_the_rounds_lower_median() {
    let mut m = machine(&["a", "b", "mallory"], three());
    m.handle_packet("a", &update("a", 1, [1.0, 0.0, 0.0, 0.0], 10), 1);
    m.handle_packet("b", &update("b", 1, [0.0, 1.0, 0.0, 0.0], 10), 2);
    m.handle_packet(
        "mallory",
        &update("mallory", 1, [0.0, 0.0, 3.0, 0.0], u32::MAX),
        3,
    );
    let out = drain(&mut m);
    let report = &reports(&out)[0];
    assert_eq!(report.capped, ["mallory"]);
    // Weights 10, 10 and 100 (not 4 billion): mallory moves the model by 300/120, not by 3.
    let want = [10.0 / 120.0, 10.0 / 120.0, 300.0 / 120.0, 0.0];
    for (got, want) in m.params().iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{:?}", m.params());
    }
}

#[test]
fn with_two_updates_the_longer_one_cannot_raise_the_norm_bound() {
    let mut m = machine(&["a", "mallory"], config());
    m.handle_packet("a", &update("a", 1, [1.0, 0.0, 0.0, 0.0], 10), 1);
    m.handle_packet(
        "mallory",
        &update("mallory", 1, [0.0, 0.0, 1e6, 0.0], 10),
        2,
    );
    let out = drain(&mut m);
    assert!(rejected(&out).is_empty());
    let report = &reports(&out)[0];
    // Its bound is set by a's norm alone: scaled down to 10 × 1, it moves the model by 5
    // (FedAvg of two equal weights), not by 500,000.
    assert_eq!(report.norm_clipped.len(), 1);
    assert_eq!(report.norm_clipped[0].bound, 10.0);
    assert_eq!(m.params(), &[0.5, 0.0, 5.0, 0.0]);
}

#[test]
fn values_beyond_the_magnitude_bound_are_refused_on_arrival() {
    let mut m = machine(&["a", "b"], config());
    m.handle_packet("a", &update("a", 1, [2e9, 0.0, 0.0, 0.0], 10), 1);
    m.handle_packet("b", &update("b", 1, [f32::NAN, 0.0, 0.0, 0.0], 10), 2);
    let reasons: Vec<&str> = rejected(&drain(&mut m))
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(reasons, ["norm", "non_finite"]);
}

#[test]
fn an_update_from_another_run_is_a_replay() {
    let mut m = machine(&["a", "b"], RoundConfig { run: 5, ..config() });
    // `update` answers run 0: captured in another federation, or before a fresh start.
    m.handle_packet("a", &update("a", 1, [1.0; M], 10), 1);
    assert_eq!(rejected(&drain(&mut m)), vec![("a".into(), "replay")]);
    let mut m = machine(&["a", "b"], RoundConfig { run: 5, ..config() });
    let mut genuine = ClientUpdate {
        features: None,
        run: 5,
        round: 1,
        client_id: "a".into(),
        seq: 1,
        num_samples: 10,
        delta: TensorF32::from_slice(&[1.0; M]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    };
    m.handle_packet(
        "a",
        &fedge_wire::encode(&Message::ClientUpdate(genuine.clone())),
        1,
    );
    genuine.client_id = "b".into();
    m.handle_packet("b", &fedge_wire::encode(&Message::ClientUpdate(genuine)), 2);
    assert!(reports(&drain(&mut m))[0].aggregated);
}

/// `frame` as two chunks of message `id` (the test updates are too small for the packet
/// limits `split_into_chunks` allows), tagged by `signer` when given.
fn chunks(frame: Vec<u8>, id: u64, signer: Option<(&str, &fedge_wire::DeviceKey)>) -> Vec<Vec<u8>> {
    let half = frame.len() / 2;
    [&frame[..half], &frame[half..]]
        .iter()
        .enumerate()
        .map(|(index, data)| {
            let mut chunk = fedge_wire::Chunk {
                message_id: id,
                index: index as u32,
                count: 2,
                total_len: frame.len() as u32,
                data: data.to_vec(),
                tag: None,
            };
            if let Some((device, key)) = signer {
                chunk.tag = Some(key.chunk_tag(device, &chunk));
            }
            fedge_wire::encode(&Message::Chunk(chunk))
        })
        .collect()
}

#[test]
fn a_chunk_flood_evicts_nobody_elses_partial_update() {
    let mut m = machine(&["a", "b", "mallory"], three());
    let a = chunks(update("a", 1, [1.0; M], 10), 1, None);
    let b = chunks(update("b", 1, [3.0; M], 10), 1, None);
    m.handle_packet("a", &a[0], 1);
    m.handle_packet("b", &b[0], 1);
    // Selected or not, a sender's thousand streams only ever evict its own.
    for (sender, id) in (0..1000u64).flat_map(|i| [("mallory", i), ("eve", i)]) {
        let stream = chunks(update(sender, 1, [0.5; M], 10), 100 + id, None);
        m.handle_packet(sender, &stream[0], 2);
    }
    for piece in a.iter().skip(1).chain(b.iter().skip(1)) {
        let who = if a.contains(piece) { "a" } else { "b" };
        m.handle_packet(who, piece, 3);
    }
    assert_eq!(m.reported(), 2);
    let out = drain(&mut m);
    let eve = rejected(&out)
        .iter()
        .filter(|(c, r)| c == "eve" && *r == "not_selected")
        .count();
    assert_eq!(eve, 1000);
}

#[test]
fn forged_chunks_on_a_devices_stream_are_refused_before_reassembly() {
    let mut m = keyed_machine();
    drain(&mut m);
    let genuine = sealed("a", &key(1), update("a", 1, [2.0; M], 1));
    let pieces = chunks(genuine, 7, Some(("a", &key(1))));
    // Mallory knows the message id and sends different bytes under every index first:
    // untagged, then tagged with her own key.
    let forged = chunks(sealed("a", &key(9), update("a", 1, [9.0; M], 1)), 7, None);
    let signed = chunks(
        sealed("a", &key(9), update("a", 1, [9.0; M], 1)),
        7,
        Some(("a", &key(9))),
    );
    for piece in forged.iter().chain(&signed) {
        m.handle_packet("a", piece, 1);
    }
    for piece in &pieces {
        m.handle_packet("a", piece, 2);
    }
    let b = sealed("b", &key(2), update("b", 1, [2.0; M], 1));
    for piece in chunks(b, 3, Some(("b", &key(2)))) {
        m.handle_packet("b", &piece, 3);
    }
    let out = drain(&mut m);
    let reasons: std::collections::BTreeSet<&str> =
        rejected(&out).into_iter().map(|(_, r)| r).collect();
    assert_eq!(reasons, ["bad_chunk_tag", "unauthenticated"].into());
    assert!(reports(&out)[0].aggregated);
    assert_eq!(m.params(), &[2.0; M]);
}

/// A strategy whose aggregate overflows: what a bug or a colluding majority could produce.
struct Overflowing;

impl crate::strategy::Strategy for Overflowing {
    fn name(&self) -> &str {
        "fedavg"
    }

    fn aggregate(&mut self, global: &[f32], _: &RoundUpdates, _: &[Failure]) -> Aggregated {
        Aggregated {
            params: global.iter().map(|_| f32::INFINITY).collect(),
            report: Default::default(),
        }
    }
}

use crate::updates::RoundUpdates;

#[test]
fn a_non_finite_aggregate_is_never_applied_nor_checkpointed() {
    let mut m = Rounds::new(config(), Box::new(Overflowing), vec![0.25; M]);
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [1.0; M], 10), 1);
    m.handle_packet("b", &update("b", 1, [1.0; M], 10), 2);
    let report = &reports(&drain(&mut m))[0];
    assert_eq!(
        (report.aggregated, report.abandoned),
        (false, Some("non_finite_aggregate"))
    );
    assert_eq!(m.params(), &[0.25; M]);
    assert_eq!(m.checkpoint().params, vec![0.25; M]);
    assert_eq!(m.aggregated_rounds(), 0);
}

#[test]
fn an_update_whose_journal_record_failed_does_not_count() {
    let mut m = machine(
        &["a", "b", "c"],
        RoundConfig {
            journal: true,
            ..three()
        },
    );
    m.handle_packet("a", &update("a", 1, [1.0; M], 10), 1);
    m.handle_packet("b", &update("b", 1, [3.0; M], 10), 2);
    m.handle_journal_failure(1, "b", "disk full".into());
    assert_eq!(m.reported(), 1);
    // The device sends it again once the disk has room.
    m.handle_packet("b", &update("b", 1, [3.0; M], 10), 3);
    m.handle_packet("c", &update("c", 1, [5.0; M], 10), 4);
    let out = drain(&mut m);
    assert_eq!(rejected(&out), vec![("b".into(), "storage")]);
    assert_eq!(m.params(), &[3.0; M]);
}

#[test]
fn a_thousand_rejections_of_one_client_are_one_failure_entry() {
    let mut m = machine(&["a", "b"], config());
    for t in 0..1000 {
        m.handle_packet("a", b"junk", t);
    }
    m.handle_packet("b", &update("b", 1, [1.0; M], 10), 1_001);
    // Below the quorum of two: extended once, then abandoned.
    m.handle_timeout(10 * config().round_timeout_ms);
    m.handle_timeout(20 * config().round_timeout_ms);
    let out = drain(&mut m);
    let report = reports(&out).pop().unwrap();
    assert_eq!(report.rejected["malformed"], 1000);
    assert_eq!(report.failures.len(), 1);
}

fn status(client: &str, online: bool, at: &str, key: Option<&fedge_wire::DeviceKey>) -> EdgeStatus {
    let mut status = EdgeStatus {
        client_id: client.into(),
        online,
        updated_at: at.into(),
        ..EdgeStatus::default()
    };
    if let Some(key) = key {
        status.sign("fedge", key);
    }
    status
}

use fedge_wire::EdgeStatus;

#[test]
fn with_keys_only_a_devices_own_fresh_status_moves_it_online_or_offline() {
    let mut m = keyed_machine();
    drain(&mut m);
    let selected = m.selected();
    // Forged: unsigned, or signed with another key; a replayed older "online".
    m.handle_edge_status("a", &status("a", false, "2026-01-01T00:00:01Z", None), 1);
    m.handle_edge_status(
        "a",
        &status("a", false, "2026-01-01T00:00:02Z", Some(&key(2))),
        2,
    );
    let genuine = status("b", true, "2026-01-01T00:00:05Z", Some(&key(2)));
    m.handle_edge_status("b", &genuine, 3);
    // The same document again, as the broker hands it to a reconnecting coordinator: no
    // rejection (each reconnect counted one replay per device).
    m.handle_edge_status("b", &genuine, 3);
    m.handle_edge_status(
        "b",
        &status("b", true, "2026-01-01T00:00:04Z", Some(&key(2))),
        4,
    );
    let reasons: Vec<&str> = rejected(&drain(&mut m))
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(reasons, ["unauthenticated", "bad_status_tag", "replay"]);
    assert!(m.online().contains("a") && m.online().contains("b"));
    assert_eq!(m.selected(), selected);
    // The device's own offline status (its Last Will, older than its last online) counts.
    m.handle_edge_status(
        "a",
        &status("a", false, "2025-12-31T23:00:00Z", Some(&key(1))),
        5,
    );
    assert!(!m.online().contains("a"));
}
