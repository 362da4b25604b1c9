//! The round machine's guards: device keys (forged, unknown, unsigned and replayed updates)
//! and norm bounds.

use super::tests::{M, config, drain, reports, update};
use std::sync::Arc;

use fedge_wire::DeviceKey;

use super::*;
use crate::strategy::FedAvg;

pub(super) fn key(byte: u8) -> DeviceKey {
    DeviceKey::from_bytes([byte; fedge_wire::KEY_LEN])
}

fn keyed_config() -> RoundConfig {
    let keys: DeviceKeys = [("a".to_owned(), key(1)), ("b".to_owned(), key(2))].into();
    RoundConfig {
        auth: Some(Arc::new(keys)),
        ..config()
    }
}

pub(super) fn sealed(signer: &str, key: &DeviceKey, frame: Vec<u8>) -> Vec<u8> {
    fedge_wire::seal(frame, &[(signer, key)])
}

pub(super) fn rejected(outputs: &[Output]) -> Vec<(String, &'static str)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Rejected { client, reason, .. } => Some((client.clone(), reason.name())),
            _ => None,
        })
        .collect()
}

pub(super) fn keyed_machine() -> Rounds {
    let mut m = Rounds::new(keyed_config(), Box::new(FedAvg), vec![0.0; M]);
    for c in ["a", "b", "mallory"] {
        m.handle_client_status(c, true, 0);
    }
    m
}

#[test]
fn unknown_devices_are_never_selected() {
    let mut m = keyed_machine();
    let out = drain(&mut m);
    assert_eq!(rejected(&out), vec![("mallory".into(), "unknown_device")]);
    assert_eq!(m.online().iter().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(m.selected(), 2);
}

#[test]
fn each_selected_device_can_check_its_own_task_tag_and_no_other() {
    let mut m = keyed_machine();
    let out = drain(&mut m);
    let frame = out
        .iter()
        .find_map(|o| match o {
            Output::PublishTask { frame, .. } => Some(frame.clone()),
            _ => None,
        })
        .unwrap();
    let Ok(Message::Sealed(sealed)) = fedge_wire::decode(&frame) else {
        panic!("the task is not sealed");
    };
    for (client, k) in [("a", key(1)), ("b", key(2))] {
        let inner = sealed.open(client, &k).unwrap();
        let Ok(Message::RoundTask(task)) = fedge_wire::decode(inner) else {
            panic!("no task inside");
        };
        assert_eq!(task.round, 1);
    }
    assert_eq!(
        sealed.open("a", &key(2)),
        Err(fedge_wire::AuthError::BadTag)
    );
    assert_eq!(
        sealed.open("mallory", &key(3)),
        Err(fedge_wire::AuthError::NoTag)
    );
}

#[test]
fn forged_unsigned_and_unknown_updates_are_rejected_and_change_nothing() {
    let mut m = keyed_machine();
    drain(&mut m);
    let good = |c: &str| update(c, 1, [1.0; M], 1);
    // Plain frame, tag made with another device's key, tag under another device's name,
    // a flipped bit in the tagged bytes, an unknown device.
    m.handle_packet("a", &good("a"), 1);
    m.handle_packet("a", &sealed("a", &key(2), good("a")), 2);
    m.handle_packet("a", &sealed("b", &key(2), good("a")), 3);
    let mut tampered = fedge_wire::Sealed::new(good("a"), &[("a", &key(1))]);
    let last = tampered.inner.len() - 9;
    tampered.inner[last] ^= 0x40;
    m.handle_packet("a", &fedge_wire::encode(&Message::Sealed(tampered)), 4);
    m.handle_packet("mallory", &sealed("mallory", &key(3), good("mallory")), 5);
    let out = drain(&mut m);
    assert_eq!(
        rejected(&out),
        vec![
            ("a".into(), "unauthenticated"),
            ("a".into(), "bad_tag"),
            ("a".into(), "bad_tag"),
            ("a".into(), "bad_tag"),
            ("mallory".into(), "unknown_device"),
        ]
    );
    assert_eq!(m.reported(), 0);
    assert_eq!(m.params(), &[0.0; M]);
    let totals = m.rejected_total();
    assert_eq!(
        (
            totals["bad_tag"],
            totals["unauthenticated"],
            totals["unknown_device"]
        ),
        (3, 1, 2)
    );
}

#[test]
fn signed_updates_aggregate_and_a_replay_is_a_duplicate_then_stale() {
    let mut m = keyed_machine();
    drain(&mut m);
    let a1 = sealed("a", &key(1), update("a", 1, [1.0, 0.0, 0.0, 0.0], 1));
    m.handle_packet("a", &a1, 1);
    m.handle_packet("a", &a1, 2);
    let b1 = sealed("b", &key(2), update("b", 1, [0.0, 1.0, 0.0, 0.0], 1));
    m.handle_packet("b", &b1, 3);
    let out = drain(&mut m);
    assert_eq!(rejected(&out), vec![("a".into(), "duplicate")]);
    assert!(reports(&out)[0].aggregated);
    assert_eq!(m.params(), &[0.5, 0.5, 0.0, 0.0]);
    // Round 2 is open: the same signed bytes are stale now.
    m.handle_packet("a", &a1, 4);
    assert_eq!(rejected(&drain(&mut m)), vec![("a".into(), "wrong_round")]);
    assert_eq!(m.params(), &[0.5, 0.5, 0.0, 0.0]);
}

#[test]
fn signed_updates_survive_chunking() {
    let mut m = keyed_machine();
    drain(&mut m);
    for (c, k) in [("a", key(1)), ("b", key(2))] {
        let frame = sealed(c, &k, update(c, 1, [2.0; M], 1));
        for chunk in fedge_wire::split_into_tagged_chunks(frame, 7, 60, Some((c, &k))) {
            m.handle_packet(c, &chunk, 1);
        }
    }
    let out = drain(&mut m);
    assert!(rejected(&out).is_empty(), "{:?}", rejected(&out));
    assert_eq!(m.params(), &[2.0; M]);
}

#[test]
fn norm_bounds_reject_on_arrival_and_scale_outliers_down_at_the_close() {
    let config = RoundConfig {
        min_clients: 4,
        min_updates: 2,
        max_update_norm: 50.0,
        max_norm_ratio: 5.0,
        ..config()
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    for c in ["a", "b", "c", "d"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [1.0, 0.0, 0.0, 0.0], 1), 1);
    m.handle_packet("b", &update("b", 1, [0.0, 2.0, 0.0, 0.0], 1), 2);
    // Above the absolute bound: rejected at once.
    m.handle_packet("c", &update("c", 1, [60.0, 0.0, 0.0, 0.0], 1), 3);
    assert_eq!(m.reported(), 2);
    // Under the absolute bound but 20 against the others' median 1.5: scaled down to 5 × 1.5
    // at the close, and still counted.
    m.handle_packet("c", &update("c", 1, [0.0, 0.0, 20.0, 0.0], 1), 4);
    m.handle_packet("d", &update("d", 1, [0.0, 0.0, 0.0, 1.5], 1), 5);
    let out = drain(&mut m);
    assert_eq!(rejected(&out), vec![("c".into(), "norm")]);
    let report = &reports(&out)[0];
    assert_eq!(report.reported, ["a", "b", "c", "d"]);
    assert_eq!(report.rejected["norm"], 1);
    assert_eq!(
        report.norm_clipped,
        [NormClip {
            client: "c".into(),
            norm: 20.0,
            bound: 7.5
        }]
    );
    assert_eq!(m.params(), &[0.25, 0.5, 7.5 / 4.0, 1.5 / 4.0]);
}

/// Runs rounds of `deltas` (one per client, each round the same) with the default ratio and
/// returns the reports.
fn rounds_of(deltas: &[(&str, [f32; M])], rounds: u64) -> Vec<RoundReport> {
    let config = RoundConfig {
        min_clients: deltas.len(),
        min_updates: deltas.len(),
        ..config()
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    for (c, _) in deltas {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    let mut out = Vec::new();
    for round in 1..=rounds {
        for (i, (c, delta)) in deltas.iter().enumerate() {
            m.handle_packet(c, &update(c, round, *delta, 1), round * 10 + i as u64);
        }
        out.extend(reports(&drain(&mut m)));
    }
    out
}

#[test]
fn two_very_different_honest_sites_both_count() {
    // Site b's data differ most: its delta is 30 times a's. The rule this replaced dropped it
    // (above 10 × the lower median, a's own norm) in every round; now it counts, held to
    // 10 × a's norm, and nothing is rejected.
    let reports = rounds_of(
        &[("a", [0.1, 0.0, 0.0, 0.0]), ("b", [0.0, 3.0, 0.0, 0.0])],
        3,
    );
    for report in &reports {
        assert_eq!(report.reported, ["a", "b"]);
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        assert_eq!(report.norm_clipped.len(), 1);
        assert_eq!(report.norm_clipped[0].client, "b");
        assert!((report.norm_clipped[0].bound - 1.0).abs() < 1e-6);
    }
    // Within the ratio, nobody is touched.
    let calm = rounds_of(
        &[("a", [1.0, 0.0, 0.0, 0.0]), ("b", [0.0, 3.0, 0.0, 0.0])],
        1,
    );
    assert!(calm[0].norm_clipped.is_empty());
}

#[test]
fn a_converged_device_does_not_set_the_bound_for_the_others() {
    // Three devices, one converged (near-zero delta): the lower median was its norm, and the
    // site whose data changed was dropped round after round. The median of the others is
    // now what a delta is compared with: c (norm 4) against median(0.001, 1) ≈ 0.5 passes.
    let reports = rounds_of(
        &[
            ("a", [0.001, 0.0, 0.0, 0.0]),
            ("b", [0.0, 1.0, 0.0, 0.0]),
            ("c", [0.0, 0.0, 4.0, 0.0]),
        ],
        2,
    );
    for report in &reports {
        assert_eq!(report.reported, ["a", "b", "c"]);
        assert!(report.norm_clipped.is_empty(), "{:?}", report.norm_clipped);
    }
    // A hostile delta among honest ones moves the model by at most ratio × their median.
    let reports = rounds_of(
        &[
            ("a", [1.0, 0.0, 0.0, 0.0]),
            ("b", [0.0, 1.0, 0.0, 0.0]),
            ("x", [0.0, 0.0, 1e6, 0.0]),
        ],
        1,
    );
    let clip = &reports[0].norm_clipped;
    assert_eq!((clip.len(), clip[0].client.as_str()), (1, "x"));
    assert_eq!(clip[0].bound, 10.0);
}

mod arbitrary_input {
    use super::*;
    use proptest::prelude::{ProptestConfig, any, prop, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as Gen;

    /// A payload from the network: random bytes, a valid frame with a few bytes changed, or
    /// random bytes inside a well-formed chunk (so they reach reassembly and the decoders).
    fn payload() -> impl Gen<Value = Vec<u8>> {
        let valid = sealed("a", &key(1), update("a", 1, [1.0; M], 1));
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6).prop_map(
                move |edits| {
                    let mut bytes = valid.clone();
                    for (at, value) in edits {
                        let i = at.index(bytes.len());
                        bytes[i] ^= value.max(1);
                    }
                    bytes
                }
            ),
            (0u32..3, 1u32..4, prop::collection::vec(any::<u8>(), 1..200)).prop_map(
                |(index, count, data)| {
                    fedge_wire::encode(&Message::Chunk(fedge_wire::Chunk {
                        message_id: 1,
                        index: index.min(count - 1),
                        count,
                        total_len: 400,
                        data,
                        tag: None,
                    }))
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn no_input_from_the_network_panics_or_touches_the_model(
            packets in prop::collection::vec((0usize..3, payload()), 1..12),
            keyed in any::<bool>(),
        ) {
            let mut m = if keyed {
                keyed_machine()
            } else {
                let mut m = Rounds::new(config(), Box::new(FedAvg), vec![0.0; M]);
                m.handle_client_status("a", true, 0);
                m.handle_client_status("b", true, 0);
                m
            };
            drain(&mut m);
            for (t, (who, bytes)) in packets.iter().enumerate() {
                m.handle_packet(["a", "b", "mallory"][*who], bytes, t as u64 * 10);
            }
            m.handle_timeout(60_000);
            m.handle_timeout(120_000);
            drain(&mut m);
            prop_assert_eq!(m.params(), &[0.0; M]);
        }
    }
}
