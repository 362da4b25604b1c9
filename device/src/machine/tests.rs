//! The agent's decisions, driven with simulated time and no broker.

use super::*;

pub(super) const FED: &str = "lab";

pub(super) fn identity(client: &str, key: Option<DeviceKey>) -> Identity {
    Identity {
        client_id: client.into(),
        federation: FED.into(),
        key,
        samples: 10,
        val_samples: 2,
        profile: "generic".into(),
        backbone: "digits-conv".into(),
        backbone_sha256: Some([1; 32]),
        follows_federation_backbone: false,
        device: "cpu".into(),
        runtime: "tract".into(),
        memory_budget_mb: 0,
        role: Role::Train,
        classes: fedge_wire::numbered_classes(2),
    }
}

/// The run of the tasks below.
const RUN: u64 = 0xfeed;

pub(super) fn agent(state: RoundState) -> Agent {
    Agent::new(identity("cam-1", None), state).unwrap()
}

pub(super) fn task(round: u64, selected: &[&str], deadline_ms: u64) -> RoundTask {
    RoundTask {
        pooled: None,
        federation: FED.into(),
        run: RUN,
        round,
        selected: selected.iter().map(|s| s.to_string()).collect(),
        classes: fedge_wire::numbered_classes(2),
        params: TensorF32::from_slice(&[1.0, 2.0]),
        train: Default::default(),
        deadline_ms,
        insight: None,
        prototypes: None,
        backbone: None,
    }
}

fn frame(task: RoundTask) -> Vec<u8> {
    fedge_wire::encode(&Message::RoundTask(task))
}

pub(super) fn trained(round: u64, seconds: f32) -> Trained {
    Trained {
        round,
        result: Ok(TrainOutcome {
            params: vec![1.5, 2.5],
            delta: vec![0.5, 0.5],
            last_epoch_loss: 0.25,
            steps: 3,
            class_stats: None,
            prototypes: None,
            features: None,
        }),
        val_accuracy: 0.5,
        seconds,
        peak_memory_mb: None,
        data: None,
    }
}

pub(super) fn drain(agent: &mut Agent) -> Vec<Output> {
    std::iter::from_fn(|| agent.poll_output()).collect()
}

/// The rounds the agent asked to train, in order.
pub(super) fn trains(outputs: &[Output]) -> Vec<u64> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Train(task) => Some(task.round),
            _ => None,
        })
        .collect()
}

/// Delivers round `round`'s task (selecting cam-1) and returns what the agent asked for.
pub(super) fn deliver(agent: &mut Agent, round: u64, deadline_ms: u64, now_ms: u64) -> Vec<Output> {
    let topic = Topics::new(FED).unwrap().round_task();
    agent.handle_publish(&topic, &frame(task(round, &["cam-1"], deadline_ms)), now_ms);
    drain(agent)
}

/// Finishes a round's training, queues its update, and returns the update's sequence number
/// and the state the agent saved.
fn answer(agent: &mut Agent, round: u64, seconds: f32) -> (u64, RoundState) {
    agent.handle_trained(trained(round, seconds));
    let outputs = drain(agent);
    let [Output::Update { seq, frame, .. }] = outputs.as_slice() else {
        panic!("expected one update, got {outputs:?}");
    };
    let Ok(Message::ClientUpdate(update)) = fedge_wire::decode(frame) else {
        panic!("not an update");
    };
    assert_eq!((update.round, update.seq), (round, *seq));
    let seq = *seq;
    agent.handle_update_sent(Ok(100));
    let outputs = drain(agent);
    let saved = outputs
        .iter()
        .find_map(|o| match o {
            Output::Save(state) => Some(state.clone()),
            _ => None,
        })
        .expect("the round state is saved");
    assert!(matches!(outputs.last(), Some(Output::Status { .. })));
    (seq, saved)
}

#[test]
fn connecting_subscribes_to_tasks_and_metrics_and_says_the_device_is_online() {
    let mut agent = agent(RoundState::default());
    agent.handle_connected();
    let outputs = drain(&mut agent);
    let topics = Topics::new(FED).unwrap();
    let task = topics.round_task();
    assert_eq!(
        outputs[0],
        Output::Subscribe(vec![
            task.clone(),
            format!("{task}/+"),
            topics.metrics(),
            topics.edge_status("cam-1"),
            topics.model_current(),
            format!("{}/+", topics.model_current()),
            topics.model_serving(),
        ])
    );
    let Output::Status { topic, status } = &outputs[1] else {
        panic!("{outputs:?}");
    };
    assert_eq!(topic, &topics.edge_status("cam-1"));
    assert!(status.online);
    let (_, will) = agent.last_will();
    assert!(!will.online);
}

#[test]
fn a_retained_task_delivered_again_after_a_restart_is_not_trained_twice() {
    let mut first = agent(RoundState::default());
    assert_eq!(trains(&deliver(&mut first, 4, 0, 0)), vec![4]);
    let (_, saved) = answer(&mut first, 4, 1.0);
    assert_eq!(saved.last_round, 4);
    // The device restarts with its saved state; the broker hands it the retained task again.
    let mut restarted = agent(saved);
    assert_eq!(restarted.status().last_round, 4);
    restarted.handle_connected();
    drain(&mut restarted);
    assert!(trains(&deliver(&mut restarted, 4, 0, 10)).is_empty());
    assert_eq!(trains(&deliver(&mut restarted, 5, 0, 20)), vec![5]);
}

pub(super) fn send(agent: &mut Agent, task: RoundTask, now_ms: u64) -> Vec<Output> {
    let topic = Topics::new(FED).unwrap().round_task();
    agent.handle_publish(&topic, &frame(task), now_ms);
    drain(agent)
}

#[test]
fn a_replayed_older_task_is_refused_and_a_new_run_counts_from_one() {
    let mut agent = agent(RoundState {
        run: RUN,
        last_round: 7,
        seq: 7,
        last_train_seconds: 0.5,
        ..RoundState::default()
    });
    // Round 3 of the run the device answered round 7 of: a replay.
    let outputs = deliver(&mut agent, 3, 10_000, 0);
    assert!(trains(&outputs).is_empty());
    assert!(
        agent.status().last_error.contains("stale round task"),
        "{}",
        agent.status().last_error
    );
    // A coordinator that started afresh draws a new run and counts from 1: trained.
    let fresh = RoundTask {
        run: RUN + 1,
        ..task(1, &["cam-1"], 10_000)
    };
    assert_eq!(trains(&send(&mut agent, fresh, 1)), vec![1]);
    let (seq, saved) = answer(&mut agent, 1, 0.5);
    assert_eq!(
        (seq, saved.last_round, saved.run, saved.past_runs[0]),
        (8, 1, RUN + 1, RUN)
    );
    // The old run's round 8 is a replay now, though its round is higher.
    let outputs = deliver(&mut agent, 8, 10_000, 2);
    assert!(trains(&outputs).is_empty());
    assert!(agent.status().last_error.contains("stale round task"));
}

#[test]
fn a_task_of_another_federation_or_with_values_out_of_range_is_refused() {
    let mut agent = agent(RoundState::default());
    let foreign = RoundTask {
        federation: "elsewhere".into(),
        ..task(1, &["cam-1"], 10_000)
    };
    assert!(trains(&send(&mut agent, foreign, 0)).is_empty());
    assert!(
        agent
            .status()
            .last_error
            .contains("federation \"elsewhere\"")
    );
    let mut endless = task(1, &["cam-1"], 10_000);
    endless.train.local_epochs = 1_000_000;
    assert!(trains(&send(&mut agent, endless, 1)).is_empty());
    assert!(
        agent.status().last_error.contains("local_epochs"),
        "{}",
        agent.status().last_error
    );
    // 150 epochs are far more than 150 batches: a bound of its own.
    let mut phases = task(1, &["cam-1"], 10_000);
    phases.train.stable_schedule = fedge_wire::StableSchedule::EpochPhases;
    phases.train.adversarial_batches = 150;
    assert!(trains(&send(&mut agent, phases, 2)).is_empty());
    assert!(
        agent.status().last_error.contains("at most 100 epochs"),
        "{}",
        agent.status().last_error
    );
    let mut nan = task(1, &["cam-1"], 10_000);
    nan.train.learning_rate = f32::NAN;
    assert!(trains(&send(&mut agent, nan, 2)).is_empty());
    assert_eq!(trains(&deliver(&mut agent, 1, 10_000, 3)), vec![1]);
}

#[test]
fn a_task_naming_another_backbone_is_sat_out_and_one_of_the_previous_version_is_trained() {
    let mut agent = agent(RoundState::default());
    // The identity's backbone digest is [1; 32].
    let other = RoundTask {
        backbone: Some(fedge_wire::BackboneRef {
            name: "efficientnet-lite0".into(),
            sha256: [2; 32],
        }),
        ..task(1, &["cam-1"], 10_000)
    };
    assert!(trains(&send(&mut agent, other, 0)).is_empty());
    let said = &agent.status().last_error;
    assert!(
        said.contains("\"efficientnet-lite0\" (sha256 020202020202…)")
            && said.contains("\"digits-conv\" (sha256 010101010101…)"),
        "{said}"
    );
    assert_eq!(agent.status().protocol, Some(fedge_wire::PROTOCOL_VERSION));
    assert_eq!(agent.status().declined.as_ref().map(|d| d.round), Some(1));
    // Not selected: nothing to decline.
    let mut bystander = self::agent(RoundState::default());
    let other = RoundTask {
        backbone: Some(fedge_wire::BackboneRef {
            name: "efficientnet-lite0".into(),
            sha256: [2; 32],
        }),
        ..task(1, &["cam-2"], 10_000)
    };
    send(&mut bystander, other, 0);
    assert_eq!(bystander.status().declined, None);
    let same = RoundTask {
        backbone: Some(fedge_wire::BackboneRef {
            name: "digits-conv".into(),
            sha256: [1; 32],
        }),
        ..task(1, &["cam-1"], 10_000)
    };
    assert_eq!(trains(&send(&mut agent, same, 1)), vec![1]);
    // A coordinator writing protocol 7 for an old device: read, and trained.
    let mut agent = self::agent(RoundState::default());
    let old = fedge_wire::previous::encode(&Message::RoundTask(task(1, &["cam-1"], 10_000)));
    agent.handle_task_bytes(&old, 0);
    assert_eq!(trains(&drain(&mut agent)), vec![1]);
}

#[test]
fn the_last_will_carries_the_last_round_answered() {
    let agent = agent(RoundState {
        run: RUN,
        last_round: 9,
        ..RoundState::default()
    });
    let (_, will) = agent.last_will();
    assert_eq!((will.online, will.last_round), (false, 9));
}

#[test]
fn training_that_outlasts_the_deadline_skips_the_next_task_once_then_tries_again() {
    let mut agent = agent(RoundState::default());
    assert_eq!(trains(&deliver(&mut agent, 1, 2_000, 0)), vec![1]);
    // Round 1's training took 3 s, longer than the 2 s deadline.
    answer(&mut agent, 1, 3.0);
    let outputs = deliver(&mut agent, 2, 2_000, 5_000);
    assert!(trains(&outputs).is_empty(), "skipped");
    let Some(Output::Status { status, .. }) = outputs.last() else {
        panic!("{outputs:?}");
    };
    assert!(
        status.last_error.contains("skipped round 2") && status.last_error.contains("3.0 s"),
        "{}",
        status.last_error
    );
    assert_eq!(agent.state().last_train_seconds, 0.0);
    assert_eq!(status.declined.as_ref().map(|d| d.round), Some(2));
    // The next round is tried again, and a good round clears the error.
    assert_eq!(trains(&deliver(&mut agent, 3, 2_000, 10_000)), vec![3]);
    answer(&mut agent, 3, 1.0);
    assert_eq!(agent.status().last_error, "");
    assert_eq!(agent.status().declined, None);
}

#[test]
fn a_device_not_selected_or_already_training_ignores_the_task() {
    let mut agent = agent(RoundState::default());
    let topic = Topics::new(FED).unwrap().round_task();
    agent.handle_publish(&topic, &frame(task(1, &["cam-2"], 0)), 0);
    assert!(drain(&mut agent).is_empty());
    assert_eq!(
        agent.summary().bytes_down,
        frame(task(1, &["cam-2"], 0)).len() as u64
    );
    assert_eq!(trains(&deliver(&mut agent, 2, 0, 1)), vec![2]);
    assert!(trains(&deliver(&mut agent, 3, 0, 2)).is_empty(), "busy");
    // Payloads on other topics, and empty ones (a cleared retained task), are ignored.
    agent.handle_publish("lab/other", &frame(task(4, &["cam-1"], 0)), 3);
    agent.handle_publish(&topic, &[], 3);
    assert!(drain(&mut agent).is_empty());
}

#[test]
fn update_sequence_numbers_increase_and_survive_a_restart() {
    let mut agent1 = agent(RoundState::default());
    let mut seqs = Vec::new();
    let mut saved = RoundState::default();
    for round in 1..=2 {
        deliver(&mut agent1, round, 0, round * 1_000);
        let (seq, state) = answer(&mut agent1, round, 0.1);
        seqs.push(seq);
        saved = state;
    }
    assert_eq!(agent1.summary().rounds_trained, 2);
    assert_eq!(agent1.summary().bytes_up, 200);
    let mut agent2 = agent(saved);
    deliver(&mut agent2, 3, 0, 0);
    seqs.push(answer(&mut agent2, 3, 0.1).0);
    assert_eq!(seqs, vec![1, 2, 3]);
}

#[test]
fn a_failed_round_or_publish_is_reported_and_still_counts_as_answered() {
    let mut agent = agent(RoundState::default());
    deliver(&mut agent, 1, 0, 0);
    agent.handle_trained(Trained {
        result: Err(TrainError::Empty),
        ..trained(1, 0.1)
    });
    let outputs = drain(&mut agent);
    assert!(matches!(
        outputs[0],
        Output::Save(RoundState {
            last_round: 1,
            seq: 0,
            ..
        })
    ));
    assert_eq!(agent.status().last_error, "no training samples");
    // The coordinator is told at once that round 1 gets no update from this device.
    let declined = agent.status().declined.clone().expect("declined");
    assert_eq!((declined.run, declined.round), (format!("{RUN:016x}"), 1));
    assert_eq!(declined.reason, "no training samples");
    assert!(trains(&deliver(&mut agent, 1, 0, 1)).is_empty());
    deliver(&mut agent, 2, 0, 2);
    agent.handle_trained(trained(2, 0.1));
    drain(&mut agent);
    agent.handle_update_sent(Err("cannot publish on t: queue full".into()));
    assert!(agent.status().last_error.contains("queue full"));
    assert_eq!(agent.summary().rounds_trained, 0);
}

#[test]
fn a_rejection_in_the_round_metrics_lands_in_last_error() {
    let mut agent = agent(RoundState::default());
    let metrics = Topics::new(FED).unwrap().metrics();
    agent.handle_publish(
        &metrics,
        br#"{"round": 4, "failures": {"cam-2": "bad_tag"}}"#,
        0,
    );
    assert!(drain(&mut agent).is_empty(), "another device's rejection");
    agent.handle_publish(
        &metrics,
        br#"{"round": 4, "failures": {"cam-1": "stale"}}"#,
        0,
    );
    let outputs = drain(&mut agent);
    let [Output::Status { status, .. }] = outputs.as_slice() else {
        panic!("{outputs:?}");
    };
    assert!(status.last_error.contains("round 4") && status.last_error.contains("stale"));
}

#[test]
fn a_declined_round_s_own_reason_is_not_overwritten_by_the_coordinator_s_no_report() {
    let mut agent = agent(RoundState::default());
    let mut endless = task(4, &["cam-1"], 10_000);
    endless.train.local_epochs = 1_000_000;
    assert!(trains(&send(&mut agent, endless, 0)).is_empty());
    let own = agent.status().last_error.clone();
    assert!(own.contains("local_epochs"), "{own}");
    drain(&mut agent);
    let metrics = Topics::new(FED).unwrap().metrics();
    for vague in ["declined", "no_report"] {
        let payload = format!(r#"{{"round": 4, "failures": {{"cam-1": "{vague}"}}}}"#);
        agent.handle_publish(&metrics, payload.as_bytes(), 1);
        assert!(drain(&mut agent).is_empty(), "{vague}: nothing new to say");
        assert_eq!(agent.status().last_error, own);
    }
    // A reason of the coordinator's own (a refused update) is news: it replaces it.
    agent.handle_publish(
        &metrics,
        br#"{"round": 5, "failures": {"cam-1": "bad_tag"}}"#,
        2,
    );
    assert!(agent.status().last_error.contains("bad_tag"));
}

#[test]
fn a_task_tagged_with_another_devices_key_is_refused() {
    let (mine, theirs) = (
        DeviceKey::from_bytes([1; 32]),
        DeviceKey::from_bytes([2; 32]),
    );
    let mut agent = Agent::new(identity("cam-1", Some(mine)), RoundState::default()).unwrap();
    let topic = Topics::new(FED).unwrap().round_task();
    let forged = fedge_wire::seal(frame(task(1, &["cam-1"], 0)), &[("cam-1", &theirs)]);
    agent.handle_publish(&topic, &forged, 0);
    let outputs = drain(&mut agent);
    assert!(trains(&outputs).is_empty());
    assert!(agent.status().last_error.contains("round task tag"));
}

#[test]
fn an_agent_with_an_invalid_identity_does_not_start() {
    assert!(Agent::new(identity("cam/1", None), RoundState::default()).is_err());
    let mut bad_fed = identity("cam-1", None);
    bad_fed.federation = "a/b".into();
    assert!(Agent::new(bad_fed, RoundState::default()).is_err());
}

fn decode(payload: &[u8], client: &str, key: Option<&DeviceKey>) -> Result<Option<u64>, TaskError> {
    let mut reassembler = Reassembler::new(1_000, 1 << 20);
    decode_task(&mut reassembler, payload, 0, client, key).map(|t| t.map(|t| t.round))
}

#[test]
fn a_device_with_a_key_follows_only_tasks_tagged_for_it() {
    let (k1, k2) = (
        DeviceKey::from_bytes([1; 32]),
        DeviceKey::from_bytes([2; 32]),
    );
    let task_frame = || frame(task(3, &["cam-1", "cam-2"], 1_000));
    let sealed = fedge_wire::seal(task_frame(), &[("cam-1", &k1), ("cam-2", &k2)]);
    assert_eq!(decode(&sealed, "cam-1", Some(&k1)), Ok(Some(3)));
    assert_eq!(decode(&sealed, "cam-2", Some(&k2)), Ok(Some(3)));
    // A forged task (wrong key), a task without tags, a task not for this device.
    let err = decode(&sealed, "cam-1", Some(&k2)).unwrap_err().to_string();
    assert!(err.contains("does not match"), "{err}");
    let err = decode(&task_frame(), "cam-1", Some(&k1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("keys file"), "{err}");
    assert_eq!(decode(&sealed, "cam-9", Some(&k1)), Ok(None));
    // Without a key a device follows both.
    assert_eq!(decode(&sealed, "cam-1", None), Ok(Some(3)));
    assert_eq!(decode(&task_frame(), "cam-1", None), Ok(Some(3)));
}

#[test]
fn a_device_reads_its_own_rejection_from_the_round_metrics() {
    let metrics = br#"{"round": 4, "failures": {"cam-1": "bad_tag", "cam-2": "no_report"}}"#;
    let e = rejection_of(metrics, "cam-1").unwrap();
    assert!(e.contains("round 4") && e.contains("bad_tag"), "{e}");
    assert_eq!(rejection_of(metrics, "cam-3"), None);
    assert_eq!(rejection_of(br#"{"round": 4}"#, "cam-1"), None);
    assert_eq!(rejection_of(b"not json", "cam-1"), None);
}

#[test]
fn a_task_is_too_slow_only_when_the_last_training_outlasted_its_deadline() {
    assert!(too_slow_for(1_000, 1.5));
    assert!(!too_slow_for(2_000, 1.5));
    assert!(!too_slow_for(1_000, 0.0), "no measurement yet");
    assert!(!too_slow_for(0, 9.0), "no deadline");
}

#[test]
fn a_peak_above_the_memory_budget_is_reported_when_nothing_else_went_wrong() {
    let mut id = identity("cam-1", None);
    id.memory_budget_mb = 64;
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    deliver(&mut agent, 1, 0, 0);
    agent.handle_trained(Trained {
        peak_memory_mb: Some(100.0),
        ..trained(1, 0.1)
    });
    drain(&mut agent);
    agent.handle_update_sent(Ok(10));
    drain(&mut agent);
    assert_eq!(agent.status().peak_memory_mb, Some(100.0));
    assert!(
        agent.status().last_error.contains("memory_budget_mb = 64"),
        "{}",
        agent.status().last_error
    );
}

#[test]
fn a_device_puts_its_own_status_back_over_a_forged_one() {
    let key = DeviceKey::from_bytes([6; 32]);
    let mut agent =
        Agent::new(identity("cam-1", Some(key.clone())), RoundState::default()).unwrap();
    agent.handle_connected();
    drain(&mut agent);
    let topic = Topics::new(FED).unwrap().edge_status("cam-1");
    let mut own = agent.status().clone();
    own.updated_at = "2026-11-23T10:00:00Z".into();
    own.sign(FED, &key);
    // Its own status coming back: nothing to do.
    agent.handle_publish(&topic, &serde_json::to_vec(&own).unwrap(), 1);
    assert!(drain(&mut agent).is_empty());
    // Somebody says it is offline, unsigned, or writes garbage: its status goes back up.
    let offline = EdgeStatus {
        online: false,
        ..own.clone()
    };
    let unsigned = EdgeStatus {
        tag: None,
        ..own.clone()
    };
    for forged in [
        serde_json::to_vec(&offline).unwrap(),
        serde_json::to_vec(&unsigned).unwrap(),
        b"junk".to_vec(),
    ] {
        agent.handle_publish(&topic, &forged, 2);
        let outputs = drain(&mut agent);
        assert!(
            matches!(&outputs[..], [Output::Status { status, .. }] if status.online),
            "{outputs:?}"
        );
    }
    assert_eq!(agent.summary().statuses_restored, 3);
    // After a clean stop, its own offline status is left alone.
    agent.handle_stop();
    drain(&mut agent);
    agent.handle_publish(&topic, &serde_json::to_vec(&offline).unwrap(), 3);
    assert!(drain(&mut agent).is_empty());
}

#[test]
fn a_busy_device_trains_a_buffered_task_naming_it_as_soon_as_it_is_done() {
    let mut busy = agent(RoundState::default());
    assert_eq!(trains(&deliver(&mut busy, 1, 0, 0)), vec![1]);
    // Buffered aggregation (no deadline) named it again while it trained version 1.
    assert!(trains(&deliver(&mut busy, 3, 0, 1)).is_empty(), "busy");
    busy.handle_trained(trained(1, 1.0));
    let outputs = drain(&mut busy);
    assert!(matches!(outputs[0], Output::Update { .. }));
    assert_eq!(trains(&outputs), vec![3], "the newer version next");
    // A synchronous round's task (with a deadline) that came while busy is not kept.
    let mut rounds = agent(RoundState::default());
    assert_eq!(trains(&deliver(&mut rounds, 1, 5_000, 0)), vec![1]);
    assert!(trains(&deliver(&mut rounds, 2, 5_000, 1)).is_empty());
    rounds.handle_trained(trained(1, 1.0));
    assert!(trains(&drain(&mut rounds)).is_empty());
}
