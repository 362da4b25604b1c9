//! Rolling upgrades: a device of the previous protocol version shares rounds with devices of
//! this one while the window is open, and is turned away once it closed.

use fedge_wire::previous;
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

/// `update` of `tests`, framed as a device of the previous protocol frames it.
fn old_update(client: &str, round: u64) -> Vec<u8> {
    let Ok(Message::ClientUpdate(update)) = fedge_wire::decode(&super::tests::update(
        client,
        round,
        [0.5, 0.0, 0.0, 0.0],
        5,
    )) else {
        panic!("an update");
    };
    previous::encode(&Message::ClientUpdate(update))
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
        ..config()
    };
    let mut m = Rounds::new(three, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    m.handle_edge_status("new-a", &status("new-a", Some(PROTOCOL_VERSION)), 0);
    m.handle_edge_status("new-b", &status("new-b", Some(PROTOCOL_VERSION)), 0);
    m.handle_edge_status("old", &status("old", Some(PREVIOUS_PROTOCOL_VERSION)), 0);
    let out = drain(&mut m);
    let frame = &task_frames(&out)[0];
    // Written in the previous version, which the old device reads.
    assert_eq!(frame[4], PREVIOUS_PROTOCOL_VERSION);
    assert!(matches!(previous::decode(frame), Ok(Message::RoundTask(_))));
    assert_eq!(tasks(&out)[0].selected, ["new-a", "new-b", "old"]);
    assert_eq!(m.downlink_version(), PREVIOUS_PROTOCOL_VERSION);
    let versions = m.device_protocols();
    assert_eq!(versions.get(&PREVIOUS_PROTOCOL_VERSION), Some(&1));
    assert_eq!(versions.get(&PROTOCOL_VERSION), Some(&2));
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
        ..config()
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
        previous::decode(frame),
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
fn a_federation_that_trains_a_tail_selects_no_device_of_the_previous_version() {
    let tail = fedge_wire::layout::TailConfig {
        input: [1, 1, 1],
        channels: 2,
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0; 4],
        activation: fedge_wire::layout::TailActivation::Relu,
        pooling: fedge_wire::layout::TailPooling::GlobalAverage,
    };
    let head = fedge_wire::HeadConfig::new(2, 2)
        .with_hidden(1)
        .with_tail(tail);
    let params = vec![0.0; head.num_params()];
    let with_tail = RoundConfig {
        min_clients: 2,
        min_updates: 2,
        head: Some(head),
        ..config()
    };
    let mut m = Rounds::new(with_tail, Box::new(crate::strategy::FedAvg), params);
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
