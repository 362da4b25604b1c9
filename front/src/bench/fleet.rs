//! `fedge bench fleet`: many lightweight simulated devices, each its own MQTT connection,
//! against a running coordinator (another process, so its CPU and memory can be measured on
//! their own, see `bench/fleet.sh`).
//!
//! A simulated device does what a real one does on the wire and nothing else: a Last Will,
//! a retained online status, the round task (reassembled when chunked, tag checked when it has
//! a key), and an update of the right size (chunked when large) for every round that selects
//! it. It trains nothing: the delta is a fixed pattern, so the coordinator's cost is what is
//! measured. The report counts, per round, the updates the devices sent and the ones the
//! coordinator says it used, read from the `metrics` topic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_device::machine::{Agent, Identity, Output as AgentOutput};
use fedge_device::state::RoundState;
use fedge_mqtt::{BrokerConfig, publish_frame};
use fedge_wire::{
    ClientUpdate, DeviceKey, EdgeStatus, LocalMetrics, Message, Reassembler, TensorF32, Topics,
};
use rumqttc::{AsyncClient, Event, LastWill, Packet, QoS};
use serde::Serialize;
use tokio::sync::mpsc;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Broker of the federation.
    pub broker: BrokerConfig,
    /// Federation name.
    pub federation: String,
    /// Simulated devices, `fleet-00000` … .
    pub devices: usize,
    /// Rounds to watch before stopping.
    pub rounds: u64,
    /// Give up after this long.
    pub timeout: Duration,
    /// Keys by device id, when the coordinator authenticates.
    pub keys: BTreeMap<String, DeviceKey>,
}

/// One round as the coordinator reported it, next to what the devices sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetRound {
    /// Round number.
    pub round: u64,
    /// Clients the coordinator selected.
    pub selected: u64,
    /// Updates it used.
    pub reported: u64,
    /// Updates it rejected.
    pub rejected: u64,
    /// Seconds from task to aggregation, as the coordinator measured them.
    pub seconds: f64,
    /// Update bytes it received.
    pub bytes_up: u64,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetReport {
    /// Devices simulated.
    pub devices: usize,
    /// Rounds seen on the metrics topic.
    pub rounds: Vec<FleetRound>,
    /// Updates the devices published, over all rounds.
    pub updates_sent: u64,
    /// Wall time from the first connection to the last round's metrics.
    pub seconds: f64,
}

/// Device ids of a fleet.
pub fn device_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("fleet-{i:05}")).collect()
}

fn status(topics: &Topics, id: &str, online: bool, key: Option<&DeviceKey>) -> String {
    let mut status = EdgeStatus {
        client_id: id.into(),
        online,
        profile: "simulated".into(),
        updated_at: fedge_mqtt::now_rfc3339(),
        ..EdgeStatus::default()
    };
    if let Some(key) = key {
        status.sign(topics.federation(), key);
    }
    serde_json::to_string(&status).unwrap_or_default()
}

/// A simulated device started serving a release (`fedge bench rollback`).
#[derive(Debug, Clone)]
pub struct Switch {
    /// The device.
    pub device: String,
    /// SHA-256 of the release, hex.
    pub sha256: String,
    /// Its round.
    pub round: u64,
    /// When.
    pub at: Instant,
}

/// The device's own release decisions (`fedge_device::machine::Agent`), fed only the release
/// topics: which release it serves, as a real device decides it.
fn follower(id: &str, federation: &str, key: Option<&DeviceKey>) -> Option<Agent> {
    let identity = Identity {
        client_id: id.to_owned(),
        federation: federation.to_owned(),
        key: key.cloned(),
        samples: 10,
        val_samples: 0,
        profile: "simulated".into(),
        backbone: String::new(),
        backbone_sha256: None,
        follows_federation_backbone: false,
        device: String::new(),
        memory_budget_mb: 0,
        role: fedge_wire::Role::Train,
        classes: Vec::new(),
    };
    Agent::new(identity, RoundState::default()).ok()
}

/// One simulated device's loop; returns when the task is aborted. With `follow`, it also
/// follows the releases and says each switch there.
async fn device(
    broker: BrokerConfig,
    topics: Topics,
    id: String,
    key: Option<DeviceKey>,
    sent: Arc<AtomicU64>,
    follow: Option<mpsc::UnboundedSender<Switch>>,
) {
    let mut agent = follow
        .as_ref()
        .and_then(|_| follower(&id, topics.federation(), key.as_ref()));
    let (model_base, serving_topic) = (topics.model_current(), topics.model_serving());
    let status_topic = topics.edge_status(&id);
    let will = LastWill::new(
        &status_topic,
        status(&topics, &id, false, key.as_ref()),
        QoS::AtLeastOnce,
        true,
    );
    let mut options = broker.options(&format!("fleet-{id}"), Some(will));
    options.set_keep_alive(Duration::from_secs(60));
    let (client, mut events) = AsyncClient::new(options, 64);
    let task_base = topics.round_task();
    let update_topic = topics.update(&id);
    let mut reassembler = Reassembler::new(30_000, fedge_wire::MAX_MESSAGE_BYTES);
    let origin = Instant::now();
    let mut answered = 0u64;
    let mut backoff = fedge_mqtt::Backoff::default();
    loop {
        let event = match events.poll().await {
            Ok(event) => event,
            Err(_) => {
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        let publish = match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                backoff.reset();
                let mut filters = vec![task_base.clone(), format!("{task_base}/+")];
                if agent.is_some() {
                    filters.extend([model_base.clone(), format!("{model_base}/+")]);
                    filters.push(serving_topic.clone());
                }
                for filter in filters {
                    let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                }
                let _ = client.try_publish(
                    &status_topic,
                    QoS::AtLeastOnce,
                    true,
                    status(&topics, &id, true, key.as_ref()),
                );
                continue;
            }
            Event::Incoming(Packet::Publish(p)) if !p.payload.is_empty() => p,
            _ => continue,
        };
        let now = origin.elapsed().as_millis() as u64;
        if let (Some(agent), Some(follow)) = (agent.as_mut(), &follow)
            && (publish.topic.starts_with(&model_base) || publish.topic == serving_topic)
        {
            agent.handle_publish(&publish.topic, &publish.payload, now);
            while let Some(output) = agent.poll_output() {
                if let AgentOutput::Serve(release) = output {
                    let _ = follow.send(Switch {
                        device: id.clone(),
                        sha256: release.sha256_hex(),
                        round: release.round,
                        at: Instant::now(),
                    });
                }
            }
            continue;
        }
        // The agent's own task decoding: reassembly, tag check, kind.
        let task =
            fedge_device::decode_task(&mut reassembler, &publish.payload, now, &id, key.as_ref());
        let Ok(Some(task)) = task else {
            continue;
        };
        if task.round == answered || !task.selected.contains(&id) {
            continue;
        }
        answered = task.round;
        let m = task.params.len();
        let delta: Vec<f32> = (0..m).map(|i| 1e-3 * ((i % 7) as f32 - 3.0)).collect();
        let mut frame = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
            features: None,
            run: task.run,
            round: task.round,
            client_id: id.clone(),
            seq: task.round,
            num_samples: 10,
            delta: TensorF32::from_slice_with(&delta, task.train.update_codec),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        }));
        if let Some(key) = &key {
            frame = fedge_wire::seal(frame, &[(id.as_str(), key)]);
        }
        let signer = key.as_ref().map(|k| (id.as_str(), k));
        let packet = (task.round, broker.max_packet);
        if publish_frame(&client, &update_topic, frame, packet, false, signer).is_ok() {
            sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Starts the fleet's devices (each its own connection), following releases when `follow`
/// is given; returns their tasks and the count of updates they sent.
pub async fn spawn_fleet(
    options: &FleetOptions,
    follow: Option<mpsc::UnboundedSender<Switch>>,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Arc<AtomicU64>)> {
    let topics = Topics::new(&options.federation).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for id in device_ids(options.devices) {
        let key = options.keys.get(&id).cloned();
        tasks.push(tokio::spawn(device(
            options.broker.clone(),
            topics.clone(),
            id,
            key,
            Arc::clone(&sent),
            follow.clone(),
        )));
        // Spread the connection storm a little, as devices booting at one site would.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((tasks, sent))
}

/// Watches the metrics topic until `options.rounds` rounds were reported (or the timeout).
pub async fn watch_rounds(options: &FleetOptions) -> anyhow::Result<Vec<FleetRound>> {
    let topics = Topics::new(&options.federation).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (watcher, mut watch_events) =
        AsyncClient::new(options.broker.options("fleet-watcher", None), 64);
    watcher
        .subscribe(topics.metrics(), QoS::AtLeastOnce)
        .await
        .context("cannot subscribe to the metrics topic")?;
    let deadline = tokio::time::Instant::now() + options.timeout;
    let mut rounds = Vec::new();
    // Drawn on a terminal only (hidden when stderr is not one, as in tests and CI logs).
    let bar = indicatif::ProgressBar::new(options.rounds).with_style(
        indicatif::ProgressStyle::with_template("rounds {bar:30} {pos}/{len}, ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let result = loop {
        if rounds.len() as u64 >= options.rounds {
            break Ok(());
        }
        let event = match tokio::time::timeout_at(deadline, watch_events.poll()).await {
            Err(_) => break Err(anyhow::anyhow!("timed out after {} rounds", rounds.len())),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "watcher reconnecting");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Ok(Ok(event)) => event,
        };
        if let Event::Incoming(Packet::Publish(p)) = event
            && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&p.payload)
        {
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            rounds.push(FleetRound {
                round: n("round"),
                selected: n("clients_selected"),
                reported: n("clients_reported"),
                rejected: n("rejected"),
                seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
                bytes_up: n("bytes_up"),
            });
            bar.inc(1);
        }
    };
    bar.finish_and_clear();
    let _ = watcher.disconnect().await;
    result.map(|()| rounds)
}

/// Runs the fleet until `rounds` rounds were reported on the metrics topic.
pub async fn run_fleet(options: &FleetOptions) -> anyhow::Result<FleetReport> {
    let start = Instant::now();
    let (tasks, sent) = spawn_fleet(options, None).await?;
    let rounds = watch_rounds(options).await;
    for task in &tasks {
        task.abort();
    }
    Ok(FleetReport {
        devices: options.devices,
        rounds: rounds?,
        updates_sent: sent.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}
