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

fn release_frame(round: u64, pooled: Option<fedge_wire::FeatureSummary>) -> Vec<u8> {
    let params = vec![0.25 * round as f32; 4 * 3 + 3 + 3 * 2 + 2];
    fedge_wire::encode(&Message::Model(fedge_wire::ModelRelease {
        federation: "lab".into(),
        run: 77,
        round,
        strategy: "fedavg".into(),
        classes: fedge_wire::numbered_classes(2),
        backbone: "digits-conv".into(),
        head: fedge_wire::HeadConfig {
            features: 4,
            hidden: 3,
            classes: 2,
            tail: None,
        },
        feature_norm: fedge_wire::FeatureNorm::Pooled,
        sha256: fedge_wire::ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        pooled,
    }))
}

#[test]
fn releases_pointers_and_the_pooled_summary_are_followed_sealed_or_not() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let key = fedge_wire::DeviceKey::from_bytes([9; 32]);
    let pooled = flat_summary(2, 4, 1.5, 40);
    // A sealed release, chunked on `model/current/<i>`: read without the key.
    let sealed = fedge_wire::seal(release_frame(3, Some(pooled.clone())), &[("cam-01", &key)]);
    for (i, piece) in fedge_wire::split_into_chunks(sealed, 1, 64)
        .iter()
        .enumerate()
    {
        view.absorb(&format!("{}/{i}", t.model_current()), piece, 10);
    }
    let r = &view.releases;
    assert_eq!(r.releases.len(), 1);
    let (sha, seen) = r.releases.iter().next().unwrap();
    assert_eq!((seen.round, seen.candidate), (3, false));
    assert_eq!(r.pooled_after[&3], pooled);
    assert_eq!(r.newest_round(), Some(3));
    let sha = sha.clone();
    view.absorb(&t.model_candidate(), &release_frame(4, None), 11);
    assert!(
        view.releases
            .releases
            .values()
            .any(|r| r.candidate && r.round == 4)
    );
    // A task carries the pool in force after the round before it.
    let mut task = match fedge_wire::decode(&task_frame(6, &["cam-01"], 10)).unwrap() {
        Message::RoundTask(task) => task,
        other => panic!("{other:?}"),
    };
    task.pooled = Some(flat_summary(2, 4, 7.0, 40));
    view.absorb(
        &t.round_task(),
        &fedge_wire::encode(&Message::RoundTask(task)),
        12,
    );
    assert_eq!(view.task.as_ref().unwrap().classes, 2);
    assert!(view.task.as_ref().unwrap().pooled.is_some());
    assert_eq!(view.releases.pooled_after[&5].means.to_vec()[0], 7.0);

    let pointer = |seq: u64, stage: fedge_wire::Stage| fedge_wire::ServingPointer {
        federation: "lab".into(),
        seq,
        sha256: sha.clone(),
        round: 3,
        stage,
        canary: vec!["cam-01".into()],
        previous: Some("cd".repeat(32)),
        pinned: false,
    };
    let plain = pointer(7, fedge_wire::Stage::Canary).to_payload();
    view.absorb(&t.model_serving(), &plain, 13);
    let sealed = fedge_wire::seal(
        pointer(8, fedge_wire::Stage::All).to_payload(),
        &[("cam-01", &key)],
    );
    view.absorb(&t.model_serving(), &sealed, 14);
    view.absorb(&t.model_serving(), &plain, 15);
    view.absorb(&t.model_serving(), b"{not a pointer", 15);
    assert_eq!(view.releases.pointers.len(), 2);
    let newest = view.releases.pointer().unwrap();
    assert_eq!(
        (newest.pointer.seq, newest.pointer.stage),
        (8, fedge_wire::Stage::All)
    );
}

#[test]
fn the_coordinators_pipeline_gate_and_site_scores_are_read_from_its_status() {
    let t = topics();
    let mut view = ViewState::new(t.clone(), "mallory");
    let (a, b) = ("aa".repeat(32), "bb".repeat(32));
    let status = |outcome: &str, candidate_accuracy: f64| {
        serde_json::json!({"state": "training", "round": 4,
            "site_accuracy": {"unseen-75": 0.66, "mallory-lying-score": 1.0},
            "release": {"mode": "gated", "serving": {"sha256": a, "round": 3},
                "candidate": {"sha256": b, "round": 4}, "canary_devices": 0, "pinned": false,
                "devices": {},
                "gate": {"candidate": {"sha256": b, "round": 4}, "outcome": outcome,
                    "sites": 1, "candidate_accuracy": candidate_accuracy,
                    "serving_accuracy": 65.0, "reason": "…"}}})
        .to_string()
    };
    view.absorb(
        &t.coordinator_status(),
        status("waiting", 66.0).as_bytes(),
        20,
    );
    view.absorb(
        &t.coordinator_status(),
        status("waiting", 66.0).as_bytes(),
        21,
    );
    view.absorb(
        &t.coordinator_status(),
        status("promoted", 5e31).as_bytes(),
        22,
    );
    view.absorb(&t.coordinator_status(), br#"{"state":"offline"}"#, 23);
    let r = &view.releases;
    assert_eq!(
        r.status_ms,
        Some(22),
        "an offline Last Will is no status of the pipeline"
    );
    assert_eq!(r.serving, Some((a.clone(), 3)));
    assert_eq!(r.candidate, Some((b.clone(), 4)));
    assert_eq!(r.site_accuracy["mallory-lying-score"], 1.0);
    assert_eq!(r.gates.len(), 2);
    assert_eq!(
        (r.gates[0].outcome.as_str(), r.gates[0].first_ms),
        ("waiting", 20)
    );
    assert!(!r.gates[0].swayed(1));
    assert!(r.gates[1].swayed(1), "5e31 points is no accuracy");
    assert!(r.gates[0].swayed(0), "one site scored, none of them honest");

    let evaluator = serde_json::json!({"client_id": "unseen-75", "online": true,
        "profile": "p", "backbone": "b", "role": "evaluate", "samples": 5, "last_round": 0,
        "last_error": ""});
    view.absorb(
        &t.edge_status("unseen-75"),
        evaluator.to_string().as_bytes(),
        24,
    );
    let liar = evaluator
        .to_string()
        .replace("unseen-75", "mallory-lying-score");
    view.absorb(&t.edge_status("mallory-lying-score"), liar.as_bytes(), 24);
    assert_eq!(
        view.evaluators.iter().collect::<Vec<_>>(),
        vec!["unseen-75"]
    );
    let gone = evaluator
        .to_string()
        .replace("\"online\":true", "\"online\":false");
    view.absorb(&t.edge_status("unseen-75"), gone.as_bytes(), 25);
    assert!(view.evaluators.is_empty());
}

/// A summary of `classes` × `features` values all `value`, its `samples` rows spread over the
/// classes (what the attacks craft; written here so that the view's tests need no crafting).
fn flat_summary(
    classes: usize,
    features: usize,
    value: f32,
    samples: u32,
) -> fedge_wire::FeatureSummary {
    let means = vec![value; classes * features];
    fedge_wire::FeatureSummary {
        counts: vec![f64::from(samples) / classes as f64; classes],
        means: fedge_wire::TensorF32::new(vec![classes as u32, features as u32], &means).unwrap(),
        within: fedge_wire::TensorF32::from_slice(&vec![value; features]),
    }
}
