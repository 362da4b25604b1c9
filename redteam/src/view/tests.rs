use fedge_wire::{
    ClientUpdate, Codec, LocalMetrics, Message, RoundTask, TensorF32, Topics, TrainParams,
};

use super::*;

fn topics() -> Topics {
    Topics::new("lab").unwrap()
}

fn task_frame(round: u64, selected: &[&str], params: usize) -> Vec<u8> {
    fedge_wire::encode(&Message::RoundTask(RoundTask {
        pooled: None,
        federation: "lab".into(),
        run: 77,
        round,
        selected: selected.iter().map(|s| s.to_string()).collect(),
        classes: fedge_wire::numbered_classes(2),
        params: TensorF32::from_slice(&vec![0.5; params]),
        train: TrainParams::default(),
        deadline_ms: 1000,
        insight: None,
        prototypes: None,
        backbone: None,
    }))
}

fn update_frame(client: &str, round: u64, seq: u64, params: usize) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run: 77,
        round,
        client_id: client.into(),
        seq,
        num_samples: 10,
        delta: TensorF32::from_slice_with(&vec![0.1; params], Codec::F32),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }))
}

#[test]
fn a_chunked_task_is_reassembled_captured_and_announced_once() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let frame = task_frame(4, &["site-0", "mallory-nan"], 3000);
    let pieces = fedge_wire::split_into_chunks(frame, 4, 4096);
    assert!(pieces.len() > 1);
    let n = pieces.len();
    for (i, piece) in pieces.iter().enumerate() {
        let opened = view.absorb(&format!("{}/{i}", t.round_task()), piece, 10);
        assert_eq!(opened, i + 1 == n, "piece {i}");
    }
    let task = view.task.clone().unwrap();
    assert_eq!((task.round, task.params, task.run), (4, 3000, 77));
    assert_eq!(view.tasks[&4].len(), n);
    assert_eq!(view.selected_real(), vec!["site-0".to_string()]);
    // The same task again (a reconnect) is no new round; an older one is captured only.
    for (i, piece) in pieces.iter().enumerate() {
        assert!(!view.absorb(&format!("{}/{i}", t.round_task()), piece, 20));
    }
    assert!(!view.absorb(&t.round_task(), &task_frame(2, &["site-0"], 10), 30));
    assert_eq!(view.task.as_ref().unwrap().round, 4);
    assert!(view.tasks.contains_key(&2));
    assert_eq!(view.opened, 1);
}

#[test]
fn genuine_updates_are_captured_and_own_payloads_are_not() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    view.absorb(
        &t.round_task(),
        &task_frame(3, &["site-0", "site-1"], 10),
        0,
    );
    let plain = update_frame("site-0", 3, 7, 10);
    view.absorb(&t.update("site-0"), &plain, 5);
    let captured = &view.updates["site-0"];
    assert_eq!(
        (captured.round, captured.seq, captured.sealed),
        (3, 7, false)
    );
    assert_eq!(captured.pieces, vec![plain]);

    let chunked = fedge_wire::split_into_chunks(update_frame("site-1", 3, 9, 5000), 9, 4096);
    for piece in &chunked {
        view.absorb(&t.update("site-1"), piece, 6);
    }
    let captured = &view.updates["site-1"];
    assert_eq!(captured.seq, 9);
    assert_eq!(
        captured.chunking.map(|(c, _)| c as usize),
        Some(chunked.len())
    );

    let forged = update_frame("site-0", 3, 100, 10);
    view.mark_own(&forged);
    view.absorb(&t.update("site-0"), &forged, 7);
    view.absorb(
        &t.update("mallory-nan"),
        &update_frame("mallory-nan", 3, 1, 10),
        7,
    );
    assert_eq!(view.updates["site-0"].seq, 7);
    assert!(!view.updates.contains_key("mallory-nan"));
}

#[test]
fn an_answer_to_a_republished_stale_task_is_recorded_as_its_effect() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    view.absorb(&t.round_task(), &task_frame(5, &["site-0"], 10), 0);
    view.stale_rounds.insert(2);
    view.absorb(&t.update("site-0"), &update_frame("site-0", 2, 3, 10), 50);
    assert_eq!(view.stale_updates, 1);
    assert_eq!(view.touches[0].kind, AttackKind::StaleTask);
    assert_eq!(view.touches[0].client, "site-0");
}

#[test]
fn statuses_metrics_and_the_coordinator_are_followed() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let online = serde_json::json!({"client_id": "site-0", "online": true, "profile": "p",
        "backbone": "b", "samples": 5, "last_round": 0, "last_error": ""});
    view.absorb(&t.edge_status("site-0"), online.to_string().as_bytes(), 1);
    view.absorb(&t.edge_status("site-1"), b"not json", 1);
    assert_eq!(view.real_devices(), vec!["site-0".to_string()]);
    assert!(view.raw_statuses.contains_key("site-0"));

    let status = |state: &str, malformed: u64| {
        serde_json::json!({"state": state, "round": 1, "total_rounds": 0, "strategy": "fedavg",
            "clients_online": 1, "clients_selected": 1, "clients_reported": 0,
            "rejected_updates": {"malformed": malformed}, "rejected_total": malformed,
            "target_accuracy": null, "source_val_accuracy": null, "params_norm": 1.0,
            "updated_at": ""})
        .to_string()
    };
    view.absorb(&t.coordinator_status(), status("training", 2).as_bytes(), 2);
    view.absorb(&t.coordinator_status(), br#"{"state":"offline"}"#, 3);
    view.absorb(&t.coordinator_status(), br#"{"state":"offline"}"#, 4);
    view.absorb(&t.coordinator_status(), status("training", 9).as_bytes(), 5);
    assert_eq!(view.coordinator.offline_events, 1);
    assert_eq!(view.rejected_since_start()["malformed"], 7);

    let metrics = serde_json::json!({"round": 3, "aggregated": false,
        "failures": {"mallory-nan": "non_finite", "site-0": "no_report"}});
    view.absorb(&t.metrics(), metrics.to_string().as_bytes(), 6);
    view.absorb(&t.metrics(), b"\xff", 6);
    assert_eq!(view.metrics.len(), 1);
    assert!(!view.metrics[0].aggregated);
    assert_eq!(view.metrics[0].failures["mallory-nan"], "non_finite");
}

#[test]
fn a_device_refusing_a_stale_task_is_counted_once_per_refusal() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let status = |error: &str| {
        serde_json::json!({"client_id": "site-0", "online": true, "profile": "p",
            "backbone": "b", "samples": 5, "last_round": 4, "last_error": error})
        .to_string()
    };
    let refusal = status("refused a stale round task (run 1, round 2): already answered round 4");
    view.absorb(&t.edge_status("site-0"), refusal.as_bytes(), 1);
    assert_eq!(view.stale_refusals, 0, "no stale task was published yet");
    view.stale_rounds.insert(2);
    view.absorb(&t.edge_status("site-0"), status("").as_bytes(), 2);
    view.absorb(&t.edge_status("site-0"), refusal.as_bytes(), 3);
    view.absorb(&t.edge_status("site-0"), refusal.as_bytes(), 4);
    assert_eq!(view.stale_refusals, 1);
    let again = status("refused a stale round task (run 1, round 2): already answered round 5");
    view.absorb(&t.edge_status("site-0"), again.as_bytes(), 5);
    assert_eq!(view.stale_refusals, 2);
}

#[test]
fn a_device_putting_its_status_back_overturns_a_forgery() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let status = |online: bool| {
        serde_json::json!({"client_id": "site-0", "online": online, "profile": "p",
            "backbone": "b", "samples": 5, "last_round": 4, "last_error": ""})
        .to_string()
    };
    view.forged.insert("site-0".into(), 10);
    let forged = status(false);
    view.mark_own(forged.as_bytes());
    view.absorb(&t.edge_status("site-0"), forged.as_bytes(), 11);
    assert_eq!(view.forged_overturned, 0, "the forgery itself is no answer");
    assert!(
        !view.statuses.contains_key("site-0"),
        "nor is it the device's status"
    );
    view.absorb(&t.edge_status("site-0"), status(true).as_bytes(), 12);
    view.absorb(&t.edge_status("site-0"), status(true).as_bytes(), 13);
    assert_eq!(view.forged_overturned, 1);
}
