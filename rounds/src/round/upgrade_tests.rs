//! Rolling upgrades: a device of the previous protocol version shares rounds with devices of
//! this one while the window is open, and is turned away once it closed.

use fedge_wire::previous as v8;
use fedge_wire::{EdgeStatus, PREVIOUS_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::tests::{config, drain, reports, tasks};
use super::*;

fn status(client: &str, protocol: Option<u8>) -> EdgeStatus {
    EdgeStatus {
        client_id: client.into(),
        online: true,
        protocol,
        ..EdgeStatus::default()
    }
}

/// `update` of `tests`, framed as a device of protocol 8 frames it.
fn old_update(client: &str, round: u64) -> Vec<u8> {
    let Ok(Message::ClientUpdate(update)) = fedge_wire::decode(&super::tests::update(
        client,
        round,
        [0.5, 0.0, 0.0, 0.0],
        5,
    )) else {
        panic!("an update");
    };
    v8::encode(&Message::ClientUpdate(update))
}

/// The tests' configuration without pooled features, which devices of the previous version
/// cannot take part in.
fn not_pooling() -> RoundConfig {
    RoundConfig {
        train: fedge_wire::TrainParams {
            feature_norm: fedge_wire::FeatureNorm::None,
            ..fedge_wire::TrainParams::default()
        },
        ..config()
    }
}

fn task_frames(outputs: &[Output]) -> Vec<Vec<u8>> {
    (outputs.iter())
        .filter_map(|o| match o {
            Output::PublishTask { frame, .. } => Some(frame.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_old_device_trains_beside_new_ones_while_the_window_is_open() {
    let three = RoundConfig {
        min_clients: 3,
        min_updates: 3,
        rounds: 3,
        backbone: "digits-conv".into(),
        backbone_sha256: Some([4; 32]),
        ..not_pooling()
    };
    let mut m = Rounds::new(three, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    m.handle_edge_status("new-a", &status("new-a", Some(PROTOCOL_VERSION)), 0);
    m.handle_edge_status("new-b", &status("new-b", Some(PROTOCOL_VERSION)), 0);
    m.handle_edge_status("old", &status("old", Some(PREVIOUS_PROTOCOL_VERSION)), 0);
    let out = drain(&mut m);
    let frame = &task_frames(&out)[0];
    // Written in protocol 8, which the old device reads, and which carries no pooled summary.
    assert_eq!(frame[4], PREVIOUS_PROTOCOL_VERSION);
    assert!(matches!(v8::decode(frame), Ok(Message::RoundTask(_))));
    assert_eq!(tasks(&out)[0].pooled, None);
    assert_eq!(tasks(&out)[0].selected, ["new-a", "new-b", "old"]);
    assert_eq!(m.downlink_version(), PREVIOUS_PROTOCOL_VERSION);
    let versions = m.device_protocols();
    assert_eq!(versions.get(&8), Some(&1));
    assert_eq!(versions.get(&9), Some(&2));
    m.handle_packet("old", &old_update("old", 1), 5);
    for c in ["new-a", "new-b"] {
        let update = super::tests::update(c, 1, [0.5, 0.0, 0.0, 0.0], 5);
        m.handle_packet(c, &update, 5);
    }
    let out = drain(&mut m);
    assert_eq!(reports(&out)[0].reported.len(), 3, "{:?}", reports(&out));
    assert!(m.rejected_total().is_empty(), "{:?}", m.rejected_total());

    // The window closes during round 2: the old device's update is refused as `version`,
    // and no later round selects it.
    m.set_previous_protocol(false);
    assert!(!m.previous_protocol_accepted());
    for c in ["new-a", "new-b"] {
        let update = super::tests::update(c, 2, [0.5, 0.0, 0.0, 0.0], 5);
        m.handle_packet(c, &update, 10);
    }
    m.handle_packet("old", &old_update("old", 2), 10);
    assert_eq!(m.rejected_total().get("version"), Some(&1));
    m.handle_timeout(2_000);
    let out = drain(&mut m);
    assert!(
        tasks(&out)
            .iter()
            .all(|t| !t.selected.contains(&"old".into())),
        "no later round selects the old device"
    );
}

#[test]
fn a_closed_window_selects_no_old_device_and_writes_this_version() {
    let two = RoundConfig {
        min_clients: 2,
        min_updates: 2,
        backbone: "digits-conv".into(),
        backbone_sha256: Some([4; 32]),
        ..not_pooling()
    };
    let mut m = Rounds::new(two, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    m.set_previous_protocol(false);
    m.handle_edge_status("new-a", &status("new-a", Some(PROTOCOL_VERSION)), 0);
    m.handle_edge_status("old", &status("old", Some(PREVIOUS_PROTOCOL_VERSION)), 0);
    assert!(
        tasks(&drain(&mut m)).is_empty(),
        "one device this version: no quorum"
    );
    m.handle_edge_status("new-b", &status("new-b", Some(PROTOCOL_VERSION)), 0);
    let out = drain(&mut m);
    let task = &tasks(&out)[0];
    assert_eq!(task.selected, ["new-a", "new-b"]);
    assert_eq!(task.backbone.as_ref().map(|b| b.sha256), Some([4; 32]));
    let frame = &task_frames(&out)[0];
    assert_eq!(frame[4], PROTOCOL_VERSION);
    assert_eq!(
        v8::decode(frame),
        Err(fedge_wire::DecodeError::UnsupportedVersion(
            PROTOCOL_VERSION
        ))
    );
    m.handle_packet("old", &old_update("old", 1), 5);
    assert_eq!(m.rejected_total().get("version"), Some(&1));
    // Opened again (the operator moved `previous_until`): the old device may be selected.
    m.set_previous_protocol(true);
    assert_eq!(m.downlink_version(), PREVIOUS_PROTOCOL_VERSION);
}

#[test]
fn a_federation_that_pools_features_selects_no_device_of_the_previous_version() {
    let pooling = RoundConfig {
        min_clients: 2,
        min_updates: 2,
        train: fedge_wire::TrainParams {
            feature_norm: fedge_wire::FeatureNorm::Balanced,
            ..fedge_wire::TrainParams::default()
        },
        ..config()
    };
    let mut m = Rounds::new(pooling, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    assert!(m.previous_protocol_accepted(), "the window is open");
    m.handle_edge_status("old", &status("old", Some(PREVIOUS_PROTOCOL_VERSION)), 0);
    m.handle_edge_status("new-a", &status("new-a", Some(PROTOCOL_VERSION)), 0);
    assert!(
        tasks(&drain(&mut m)).is_empty(),
        "the old device does not count"
    );
    m.handle_edge_status("new-b", &status("new-b", Some(PROTOCOL_VERSION)), 0);
    let out = drain(&mut m);
    assert_eq!(tasks(&out)[0].selected, ["new-a", "new-b"]);
    assert_eq!(task_frames(&out)[0][4], PROTOCOL_VERSION);
    assert_eq!(m.downlink_version(), PROTOCOL_VERSION);
}
