//! The device's MQTT loop.
//!
//! Connect with a Last Will that marks the device offline, publish a retained online status,
//! follow the retained round task, train when selected, publish the update, and reconnect
//! with back-off whenever the broker goes away. Training runs on a blocking thread so the
//! MQTT keep-alive continues meanwhile.

use std::sync::Arc;
use std::time::Instant;

use fedge_models::{HeadConfig, SelectedDevice};
use fedge_mqtt::{Backoff, BrokerConfig, REQUEST_QUEUE, publish_frame};
use fedge_wire::{
    ClassStats, ClientUpdate, Codec, DeviceKey, EdgeStatus, LocalMetrics, Message, Reassembler,
    RoundTask, TensorF32, Topics,
};
use rumqttc::{AsyncClient, Event, LastWill, Packet, QoS};
use tokio::sync::{mpsc, watch};

use crate::fedddl::DdlViews;
use crate::train::{
    FeatureSet, LocalState, RoundInputs, TrainError, TrainOutcome, accuracy, train_local,
};
use fedge_models::ModelLayout;

/// Everything a running agent needs.
#[derive(Debug, Clone)]
pub struct AgentSetup {
    /// Client id (one MQTT topic level).
    pub client_id: String,
    /// Federation name.
    pub federation: String,
    /// Broker.
    pub broker: BrokerConfig,
    /// Head sizes; must match the coordinator's.
    pub head: HeadConfig,
    /// Local training split, as backbone features.
    pub train: Arc<FeatureSet>,
    /// Local validation split.
    pub val: Arc<FeatureSet>,
    /// FedDDL's counterfactual and object-only views of `train`, when built.
    pub views: Option<Arc<DdlViews>>,
    /// Burn device for training (CPU, or a CUDA GPU on a Jetson build) and its status name.
    pub device: SelectedDevice,
    /// The profile's memory budget in MiB (0: none): a peak above it is reported in status.
    pub memory_budget_mb: u64,
    /// Hardware profile name, for status.
    pub profile: String,
    /// Backbone name, for status.
    pub backbone: String,
    /// Seed of local shuffling (mixed with the round number).
    pub seed: u64,
    /// The device's key: when set, updates are sealed with it and round tasks must carry a tag
    /// that verifies with it.
    pub key: Option<DeviceKey>,
    /// Where the device keeps its round state (last round trained, update sequence) across
    /// restarts, so a retained task it already answered is not trained again.
    pub state_file: Option<std::path::PathBuf>,
}

/// What a device remembers across restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoundState {
    /// Last round the device trained and answered.
    pub last_round: u64,
    /// Sequence number of its last update.
    pub seq: u64,
    /// Seconds its last local training took.
    pub last_train_seconds: f32,
}

impl RoundState {
    /// Reads the state file; a missing or unreadable file is a fresh state (logged).
    pub fn load(path: &std::path::Path) -> Self {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "round state unreadable; starting afresh");
                Self::default()
            }),
            Err(_) => Self::default(),
        }
    }

    /// Writes the state file atomically (write, fsync, rename).
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(self).unwrap_or_default())?;
        file.sync_all()?;
        std::fs::rename(tmp, path)
    }
}

/// Whether a task should be skipped because the last round's training took longer than the
/// task's whole deadline: the update would arrive after the round closed.
pub fn too_slow_for(task_deadline_ms: u64, last_train_seconds: f32) -> bool {
    task_deadline_ms > 0 && (last_train_seconds as f64) * 1000.0 > task_deadline_ms as f64
}

/// What an agent did before it stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSummary {
    /// Rounds trained.
    pub rounds_trained: u64,
    /// Update bytes published (all chunks).
    pub bytes_up: u64,
    /// Task bytes received.
    pub bytes_down: u64,
}

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Invalid client id or federation.
    #[error("invalid agent identity: {0}")]
    Identity(String),
}

struct Trained {
    round: u64,
    /// How the task asked for the update to be packed.
    codec: Codec,
    result: Result<TrainOutcome, TrainError>,
    val_accuracy: f32,
    seconds: f32,
}

/// Runs until `stop` turns true.
pub async fn run_agent(
    setup: AgentSetup,
    mut stop: watch::Receiver<bool>,
) -> Result<AgentSummary, AgentError> {
    let topics = Topics::new(&setup.federation).map_err(|e| AgentError::Identity(e.to_string()))?;
    if !fedge_wire::valid_client_id(&setup.client_id) {
        return Err(AgentError::Identity(format!(
            "client id {:?} must be 1-64 characters of A-Z a-z 0-9 _ . -",
            setup.client_id
        )));
    }
    let status_topic = topics.edge_status(&setup.client_id);
    let update_topic = topics.update(&setup.client_id);
    let task_base = topics.round_task();
    let metrics_topic = topics.metrics();
    if let Some(reason) = &setup.device.fallback {
        tracing::warn!(client = %setup.client_id, "{reason}");
    }
    let mut status = EdgeStatus {
        client_id: setup.client_id.clone(),
        online: false,
        profile: setup.profile.clone(),
        backbone: setup.backbone.clone(),
        samples: setup.train.len() as u32,
        last_round: 0,
        last_error: String::new(),
        device: setup.device.name.clone(),
        peak_memory_mb: None,
        updated_at: String::new(),
    };
    let will = LastWill::new(&status_topic, json(&status), QoS::AtLeastOnce, true);
    let mut options = setup
        .broker
        .options(&format!("fedge-edge-{}", setup.client_id), Some(will));
    // A persistent session: the broker keeps the subscription and queues the QoS 1 task while
    // the device is offline.
    options.set_clean_session(false);
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Trained>();
    // Stable-FedADG's discriminator and memory, kept between rounds (one round trains at a time).
    let local_state = Arc::new(std::sync::Mutex::new(LocalState::default()));
    let mut reassembler = Reassembler::new(
        fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
        fedge_wire::MAX_MESSAGE_BYTES,
    );
    let origin = Instant::now();
    let mut backoff = Backoff::default();
    let mut summary = AgentSummary::default();
    let mut training: Option<u64> = None;
    let mut remembered = setup
        .state_file
        .as_deref()
        .map(RoundState::load)
        .unwrap_or_default();
    status.last_round = remembered.last_round;
    let mut connected = false;
    status.online = true;
    loop {
        tokio::select! {
            event = eventloop.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    connected = true;
                    tracing::info!(client = %setup.client_id, "edge connected");
                    for filter in [task_base.clone(), format!("{task_base}/+"), metrics_topic.clone()] {
                        let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                    }
                    let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if p.topic == metrics_topic {
                        if let Some(e) = rejection_of(&p.payload, &setup.client_id) {
                            tracing::warn!(client = %setup.client_id, "{e}");
                            status.last_error = e;
                            let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
                        }
                        continue;
                    }
                    if p.payload.is_empty() || !(p.topic == task_base || p.topic.starts_with(&format!("{task_base}/"))) {
                        continue;
                    }
                    summary.bytes_down += p.payload.len() as u64;
                    let now_ms = origin.elapsed().as_millis() as u64;
                    reassembler.expire(now_ms);
                    let task = match decode_task(&mut reassembler, &p.payload, now_ms, &setup.client_id, setup.key.as_ref()) {
                        Ok(Some(task)) => task,
                        Ok(None) => continue,
                        Err(e) => {
                            tracing::error!(client = %setup.client_id, error = %e, "round task refused");
                            status.last_error = e;
                            let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
                            continue;
                        }
                    };
                    let wanted = task.selected.contains(&setup.client_id)
                        // `!=` rather than `>`: a restarted coordinator counts from 1 again,
                        // while a task delivered twice (retained, reconnect) has the same round.
                        && task.round != status.last_round
                        && training.is_none();
                    if wanted && too_slow_for(task.deadline_ms, remembered.last_train_seconds) {
                        status.last_error = format!(
                            "skipped round {}: the last local training took {:.1} s, longer than the round's {:.1} s deadline",
                            task.round, remembered.last_train_seconds, task.deadline_ms as f64 / 1000.0
                        );
                        tracing::warn!(client = %setup.client_id, "{}", status.last_error);
                        // Skip it once; the next round is tried again.
                        remembered.last_train_seconds = 0.0;
                        let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
                    } else if wanted {
                        training = Some(task.round);
                        spawn_training(&setup, task, Arc::clone(&local_state), done_tx.clone());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if connected {
                        tracing::warn!(client = %setup.client_id, error = %e, "lost the broker; reconnecting");
                    } else if backoff.is_fresh() {
                        tracing::warn!(client = %setup.client_id, error = %e, "cannot connect to the broker; retrying with back-off");
                    }
                    connected = false;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            },
            Some(done) = done_rx.recv() => {
                training = None;
                status.last_round = done.round;
                remembered.last_round = done.round;
                remembered.last_train_seconds = done.seconds;
                match done.result {
                    Ok(outcome) => {
                        remembered.seq += 1;
                        let seq = remembered.seq;
                        let update = ClientUpdate {
                            round: done.round,
                            client_id: setup.client_id.clone(),
                            seq,
                            num_samples: setup.train.len() as u32,
                            delta: TensorF32::from_slice_with(&outcome.delta, done.codec),
                            metrics: LocalMetrics {
                                train_loss: outcome.last_epoch_loss,
                                val_accuracy: done.val_accuracy,
                                val_samples: setup.val.len() as u32,
                                train_seconds: done.seconds,
                            },
                            class_stats: outcome.class_stats.map(|s| class_stats(s, done.codec)),
                            prototypes: outcome.prototypes.map(|s| class_stats(s, done.codec)),
                        };
                        let mut frame = fedge_wire::encode(&Message::ClientUpdate(update));
                        if let Some(key) = &setup.key {
                            frame = fedge_wire::seal(frame, &[(setup.client_id.as_str(), key)]);
                        }
                        match publish_frame(&client, &update_topic, frame, seq, setup.broker.max_packet, false) {
                            Ok(bytes) => {
                                summary.bytes_up += bytes;
                                summary.rounds_trained += 1;
                                status.last_error.clear();
                            }
                            Err(e) => {
                                tracing::error!(client = %setup.client_id, error = %e, "cannot publish update");
                                status.last_error = e.to_string();
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(client = %setup.client_id, round = done.round, error = %e, "local training failed");
                        status.last_error = e.to_string();
                    }
                }
                status.peak_memory_mb = crate::resources::peak_rss_mib();
                if let Some(message) = status
                    .peak_memory_mb
                    .and_then(|peak| crate::resources::over_budget(peak, setup.memory_budget_mb))
                {
                    tracing::warn!(client = %setup.client_id, "{message}");
                    if status.last_error.is_empty() {
                        status.last_error = message;
                    }
                }
                if let Some(path) = &setup.state_file
                    && let Err(e) = remembered.save(path)
                {
                    tracing::warn!(client = %setup.client_id, error = %e, "round state not saved");
                }
                let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
            },
            _ = stop.changed() => break,
        }
    }
    status.online = false;
    let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, json(&status));
    fedge_mqtt::flush_and_disconnect(&client, &mut eventloop, std::time::Duration::from_secs(2))
        .await;
    Ok(summary)
}

/// The coordinator's word on this device's update, from a round's metrics JSON: `Some` when
/// the device was selected and its update did not count (a rejection reason or `no_report`).
pub fn rejection_of(metrics: &[u8], client_id: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(metrics).ok()?;
    let reason = value.get("failures")?.get(client_id)?.as_str()?;
    let round = value.get("round").and_then(|r| r.as_u64()).unwrap_or(0);
    Some(format!(
        "round {round}: the coordinator did not use this device's update ({reason})"
    ))
}

/// The round task in a payload: `Ok(None)` while chunks are missing, for tasks that do not
/// concern this device and for undecodable payloads (logged); `Err` for a task that names this
/// device but fails authentication (reported in the device's status).
pub fn decode_task(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Result<Option<RoundTask>, String> {
    let message = match fedge_wire::decode(payload) {
        Ok(Message::Chunk(chunk)) => match reassembler.push("coordinator", chunk, now_ms) {
            Ok(Some(frame)) => fedge_wire::decode(&frame),
            Ok(None) => return Ok(None),
            Err(e) => Err(e),
        },
        other => other,
    };
    let message = match (message, key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            if !sealed.names(client_id) {
                return Ok(None);
            }
            match sealed.open(client_id, key) {
                Ok(inner) => fedge_wire::decode(inner),
                Err(e) => return Err(format!("round task tag: {e}")),
            }
        }
        // A device without a key follows tasks without checking their tags.
        (Ok(Message::Sealed(sealed)), None) => fedge_wire::decode(&sealed.inner),
        (Ok(Message::RoundTask(task)), Some(_)) if task.selected.iter().any(|c| c == client_id) => {
            return Err(
                "round task without a tag, but this device has a key: the coordinator must \
                 have this device's key in its keys file"
                    .into(),
            );
        }
        (other, _) => other,
    };
    match message {
        Ok(Message::RoundTask(task)) => Ok(Some(task)),
        Ok(_) => {
            tracing::warn!("ignoring a message that is not a round task on the task topic");
            Ok(None)
        }
        Err(e) => {
            tracing::warn!(error = %e, "ignoring an undecodable round task");
            Ok(None)
        }
    }
}

/// Counts and `[K, H]` means as they go on the wire.
pub fn class_stats((counts, means): (Vec<u32>, Vec<f32>), codec: Codec) -> ClassStats {
    ClassStats {
        counts,
        means: TensorF32::from_slice_with(&means, codec),
    }
}

fn spawn_training(
    setup: &AgentSetup,
    task: RoundTask,
    state: Arc<std::sync::Mutex<LocalState>>,
    done: mpsc::UnboundedSender<Trained>,
) {
    let (head, train, val, views, device) = (
        setup.head.clone(),
        setup.train.clone(),
        setup.val.clone(),
        setup.views.clone(),
        setup.device.device.clone(),
    );
    let seed = setup.seed ^ task.round.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let global = task.params.to_vec();
        let layout = ModelLayout::new(head.clone(), task.train.objective.carries_generator());
        let val_accuracy = accuracy(&head, layout.head_part(&global), &val).unwrap_or(0.0);
        let insight = task.insight.as_ref().map(TensorF32::to_vec);
        let prototypes = task.prototypes.as_ref().map(TensorF32::to_vec);
        let inputs = RoundInputs {
            insight: insight.as_deref(),
            prototypes: prototypes.as_deref(),
            views: views.as_deref(),
        };
        let mut state = state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = train_local(
            &head,
            &global,
            &train,
            &task.train,
            &inputs,
            &mut state,
            seed,
            &device,
        );
        let _ = done.send(Trained {
            round: task.round,
            codec: task.train.update_codec,
            result,
            val_accuracy,
            seconds: start.elapsed().as_secs_f32(),
        });
    });
}

/// The status document, stamped with the current time.
fn json(status: &EdgeStatus) -> String {
    let stamped = EdgeStatus {
        updated_at: fedge_mqtt::now_rfc3339(),
        ..status.clone()
    };
    serde_json::to_string(&stamped).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_frame() -> Vec<u8> {
        fedge_wire::encode(&Message::RoundTask(RoundTask {
            round: 3,
            selected: vec!["cam-1".into(), "cam-2".into()],
            params: TensorF32::from_slice(&[1.0, 2.0]),
            train: Default::default(),
            deadline_ms: 1_000,
            insight: None,
            prototypes: None,
        }))
    }

    fn decode(
        payload: &[u8],
        client: &str,
        key: Option<&DeviceKey>,
    ) -> Result<Option<u64>, String> {
        let mut reassembler = Reassembler::new(1_000, 1 << 20);
        decode_task(&mut reassembler, payload, 0, client, key).map(|t| t.map(|t| t.round))
    }

    #[test]
    fn a_device_with_a_key_follows_only_tasks_tagged_for_it() {
        let (k1, k2) = (
            DeviceKey::from_bytes([1; 32]),
            DeviceKey::from_bytes([2; 32]),
        );
        let sealed = fedge_wire::seal(task_frame(), &[("cam-1", &k1), ("cam-2", &k2)]);
        assert_eq!(decode(&sealed, "cam-1", Some(&k1)), Ok(Some(3)));
        assert_eq!(decode(&sealed, "cam-2", Some(&k2)), Ok(Some(3)));
        // A forged task (wrong key), a task without tags, a task not for this device.
        let err = decode(&sealed, "cam-1", Some(&k2)).unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        let err = decode(&task_frame(), "cam-1", Some(&k1)).unwrap_err();
        assert!(err.contains("keys file"), "{err}");
        assert_eq!(decode(&sealed, "cam-9", Some(&k1)), Ok(None));
        // Without a key a device follows both.
        assert_eq!(decode(&sealed, "cam-1", None), Ok(Some(3)));
        assert_eq!(decode(&task_frame(), "cam-1", None), Ok(Some(3)));
    }
}

#[cfg(test)]
mod state_tests {
    use super::*;

    #[test]
    fn round_state_survives_a_restart_and_a_damaged_file_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cam.round.json");
        assert_eq!(RoundState::load(&path), RoundState::default());
        let state = RoundState {
            last_round: 7,
            seq: 9,
            last_train_seconds: 1.5,
        };
        state.save(&path).unwrap();
        assert_eq!(RoundState::load(&path), state);
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(RoundState::load(&path), RoundState::default());
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
}
