//! The thin tokio driver: MQTT events, a timer and a stop signal in, the round machine's
//! outputs out.
//!
//! Everything that decides lives in `crate::round::Rounds`; this file only maps I/O to the
//! machine's inputs and its outputs to publishes, logs and events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fedge_mqtt::{Backoff, BrokerConfig, REQUEST_QUEUE};
use fedge_wire::control::ControlMessage;
use fedge_wire::{EdgeStatus, Topics};
use rumqttc::{AsyncClient, Event, LastWill, Packet, QoS};
use tokio::sync::{mpsc, watch};

use super::keys_watch::KeysWatch;
use super::metrics::Metrics;
use super::outbox::Outbox;
use super::status::{StatusContext, metrics_json, status_at};
use crate::round::{Output, Phase, Record, Rejection, RoundReport, Rounds};
use crate::store::journal::Journal;

/// Evaluates global parameters on data the coordinator holds (demo and bench only; in a
/// deployment an unseen site evaluates).
pub type Evaluator = Box<dyn Fn(&[f32]) -> Option<f32> + Send>;

/// What the driver tells an embedding program (the demo's progress bar and table).
#[derive(Debug, Clone, PartialEq)]
pub enum DriverEvent {
    /// A round ended.
    RoundEnded {
        /// The machine's report.
        report: Box<RoundReport>,
        /// Evaluator's accuracy on the new global parameters.
        target_accuracy: Option<f32>,
    },
    /// An update was rejected.
    Rejected {
        /// Client from the topic.
        client: String,
        /// Reason key.
        reason: &'static str,
        /// Details.
        detail: String,
    },
}

/// What a site aggregator's upstream link hands its round machine.
#[derive(Debug, Clone, PartialEq)]
pub enum FromUpstream {
    /// The global round task naming the site (opened with the site's key).
    Task(Box<fedge_wire::RoundTask>),
    /// The global model released upstream.
    Release(Box<fedge_wire::ModelRelease>),
}

/// What a site aggregator's round machine hands its upstream link.
#[derive(Debug, Clone, PartialEq)]
pub enum ToUpstream {
    /// The site's update for a global round.
    Update(Box<fedge_wire::ClientUpdate>),
    /// The site cannot answer the global task of `round`: why, for the site's status.
    Refused {
        /// The global round.
        round: u64,
        /// What to fix.
        reason: String,
    },
    /// The site's round for global round `round` ended without an aggregate.
    Abandoned {
        /// The global round.
        round: u64,
        /// Why (`quorum`, or the guard's reason).
        reason: String,
    },
}

/// A site aggregator's two channels to its upstream link.
#[derive(Debug)]
pub struct Relay {
    /// Tasks and releases from the global federation.
    pub inbox: mpsc::UnboundedReceiver<FromUpstream>,
    /// Updates and refusals for it.
    pub outbox: mpsc::UnboundedSender<ToUpstream>,
}

/// Where and as whom the driver connects.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Broker settings.
    pub broker: BrokerConfig,
    /// Federation name (topic root `fedge/<federation>/`).
    pub federation: String,
    /// MQTT client id of the coordinator.
    pub client_id: String,
    /// Where to save the checkpoint after every aggregation.
    pub checkpoint: Option<std::path::PathBuf>,
    /// Where to keep the released model (`model.bin` in the state folder).
    pub model_file: Option<std::path::PathBuf>,
    /// Where to write the open round's journal (`Output::Journal` records).
    pub journal: Option<std::path::PathBuf>,
    /// Announce Home Assistant sensors (retained discovery configs) on connect.
    pub home_assistant: bool,
    /// Serve metrics for Prometheus on `GET /metrics` at this address.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Take operator commands tagged with this key on `coordinator/control`.
    pub operator_key: Option<fedge_wire::DeviceKey>,
    /// The device keys file, reloaded when it changes (enrolment, `revoke`).
    pub keys_file: Option<std::path::PathBuf>,
}

/// The driver could not run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// Bad federation name.
    #[error("invalid federation name: {0}")]
    Federation(#[from] fedge_wire::DecodeError),
    /// The metrics address cannot be listened on.
    #[error(
        "cannot serve metrics on {addr}: {error} (is metrics_listen taken by another process?)"
    )]
    Metrics {
        /// `metrics_listen`.
        addr: std::net::SocketAddr,
        /// Why.
        error: std::io::Error,
    },
}

/// Task topics: one frame on `round/task`, or chunk `i` on `round/task/<i>` (all retained).
struct TaskTopics {
    base: String,
    chunk_topics_in_use: usize,
}

/// What the driver keeps to act on the machine's outputs: where to publish, what to write, and
/// the status document's context.
struct Sinks<'a> {
    outbox: Outbox,
    options: &'a DriverOptions,
    topics: &'a Topics,
    status_topic: String,
    task_topics: TaskTopics,
    /// `model/current` and its chunk topics, and the frame last published there.
    model_topics: TaskTopics,
    release: Option<(u64, Vec<u8>)>,
    evaluator: Option<Evaluator>,
    events: Option<mpsc::UnboundedSender<DriverEvent>>,
    target_accuracy: Option<f32>,
    journal: Option<Journal>,
    context: StatusContext,
    /// When the status document was last published, and when the next one is due (status
    /// changes are coalesced: at most one publish per [`STATUS_INTERVAL`]).
    status_sent: Option<Instant>,
    status_due: Option<Instant>,
    logs: RejectionLog,
    upstream: Option<mpsc::UnboundedSender<ToUpstream>>,
    metrics: Option<Arc<Metrics>>,
    /// How long the machine took over the last packet or deadline (a round's closing time).
    handling: Duration,
    /// The number of the last operator command applied.
    control_seq: u64,
}

/// Least time between two status publishes: a flood of junk packets, each a rejection and a
/// status change, costs one retained publish per interval, not one per packet.
const STATUS_INTERVAL: Duration = Duration::from_millis(500);
/// Largest device status the coordinator reads (a real one is a few hundred bytes).
pub const MAX_EDGE_STATUS_BYTES: usize = 4096;

/// An operator command: applied when its tag, federation and number check, else counted as
/// `bad_control` (`fedge_wire::control`).
fn handle_control(
    rounds: &mut Rounds,
    federation: &str,
    key: &fedge_wire::DeviceKey,
    last_seq: &mut u64,
    payload: &[u8],
    now_ms: u64,
) {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match ControlMessage::open(payload, federation, key, *last_seq, wall) {
        Ok(message) => {
            *last_seq = message.seq;
            rounds.apply_control(&message.command, now_ms);
        }
        Err(e) => {
            tracing::warn!(error = %e, "operator command refused");
            rounds.reject_control(e.to_string());
        }
    }
}

/// Reads a device's retained status: online or not. An empty payload (a cleared retained
/// message) means offline; an oversized or unreadable one is rejected and changes nothing.
fn handle_edge_status(rounds: &mut Rounds, client: &str, payload: &[u8], now_ms: u64) {
    if payload.is_empty() {
        rounds.handle_client_status(client, false, now_ms);
    } else if payload.len() > MAX_EDGE_STATUS_BYTES {
        let detail = format!(
            "status of {} bytes, above {MAX_EDGE_STATUS_BYTES}",
            payload.len()
        );
        rounds.handle_bad_status(client, Rejection::Oversized, detail);
    } else {
        match serde_json::from_slice::<EdgeStatus>(payload) {
            Ok(status) => rounds.handle_edge_status(client, &status, now_ms),
            Err(e) => {
                let detail = format!("unreadable status: {e}");
                rounds.handle_bad_status(client, Rejection::Malformed, detail);
            }
        }
    }
}

/// Rate-limited logging of rejections: per reason, the first [`RejectionLog::BURST`] in each
/// minute are logged one by one, the rest summed in one line when the minute ends.
#[derive(Default)]
struct RejectionLog {
    window: Option<Instant>,
    counts: std::collections::BTreeMap<&'static str, u64>,
}

impl RejectionLog {
    const BURST: u64 = 10;
    const WINDOW: Duration = Duration::from_secs(60);

    /// Whether to log this rejection on its own line.
    fn admit(&mut self, reason: &'static str, now: Instant) -> bool {
        if self
            .window
            .is_none_or(|start| now.duration_since(start) >= Self::WINDOW)
        {
            for (reason, n) in std::mem::take(&mut self.counts) {
                if n > Self::BURST {
                    let suppressed = n - Self::BURST;
                    tracing::warn!(
                        reason,
                        suppressed,
                        "more updates rejected (not logged one by one)"
                    );
                }
            }
            self.window = Some(now);
        }
        let n = self.counts.entry(reason).or_default();
        *n += 1;
        *n <= Self::BURST
    }
}

/// Runs the federation until the machine finishes or `stop` turns true; returns the machine.
pub async fn run(
    rounds: Rounds,
    options: DriverOptions,
    evaluator: Option<Evaluator>,
    events: Option<mpsc::UnboundedSender<DriverEvent>>,
    stop: watch::Receiver<bool>,
) -> Result<Rounds, DriverError> {
    drive(rounds, options, evaluator, events, None, stop).await
}

/// Runs a site aggregator's rounds (a machine with `RoundConfig::relay`) on the site broker,
/// fed by and feeding `relay`, until `stop` turns true.
pub async fn run_site(
    rounds: Rounds,
    options: DriverOptions,
    relay: Relay,
    events: Option<mpsc::UnboundedSender<DriverEvent>>,
    stop: watch::Receiver<bool>,
) -> Result<Rounds, DriverError> {
    drive(rounds, options, None, events, Some(relay), stop).await
}

/// The next message from the upstream link; never, without one (or once it closed).
async fn from_upstream(inbox: &mut Option<mpsc::UnboundedReceiver<FromUpstream>>) -> FromUpstream {
    if let Some(rx) = inbox.as_mut()
        && let Some(message) = rx.recv().await
    {
        return message;
    }
    *inbox = None;
    std::future::pending().await
}

async fn drive(
    mut rounds: Rounds,
    options: DriverOptions,
    evaluator: Option<Evaluator>,
    events: Option<mpsc::UnboundedSender<DriverEvent>>,
    relay: Option<Relay>,
    mut stop: watch::Receiver<bool>,
) -> Result<Rounds, DriverError> {
    let (mut inbox, upstream) = match relay {
        Some(Relay { inbox, outbox }) => (Some(inbox), Some(outbox)),
        None => (None, None),
    };
    let topics = Topics::new(&options.federation)?;
    // The federation the driver runs on the broker is the one every task names.
    rounds.name_federation(&options.federation);
    let status_topic = topics.coordinator_status();
    let offline = serde_json::json!({"state": "offline", "updated_at": fedge_mqtt::now_rfc3339()});
    let will = LastWill::new(&status_topic, offline.to_string(), QoS::AtLeastOnce, true);
    let mut mqtt = options.broker.options(&options.client_id, Some(will));
    // A persistent session: while the coordinator is down (crash, restart), the broker queues
    // the QoS 1 updates devices publish, and delivers them when it is back.
    mqtt.set_clean_session(false);
    // An update is acknowledged only once its journal record is on disk: a coordinator killed
    // in between gets it again from the broker.
    mqtt.set_manual_acks(true);
    let (client, mut eventloop) = AsyncClient::new(mqtt, REQUEST_QUEUE);
    let (metrics, metrics_server) = match options.metrics_listen {
        Some(addr) => {
            let metrics = Arc::new(Metrics::new());
            let exposition = Arc::clone(&metrics);
            let server = fedge_daemon::metrics::serve(addr, Arc::new(move || exposition.encode()))
                .await
                .map_err(|error| DriverError::Metrics { addr, error })?;
            (
                Some(metrics),
                Some(fedge_daemon::metrics::AbortOnDrop(server)),
            )
        }
        None => (None, None),
    };
    let origin = Instant::now();
    let now_ms = || origin.elapsed().as_millis() as u64;
    let mut backoff = Backoff::default();
    let mut connected = false;
    let mut sinks = Sinks {
        outbox: Outbox::new(client),
        options: &options,
        topics: &topics,
        status_topic,
        task_topics: TaskTopics {
            base: topics.round_task(),
            chunk_topics_in_use: 0,
        },
        model_topics: TaskTopics {
            base: topics.model_current(),
            chunk_topics_in_use: 0,
        },
        // The last release survives a restart in the state folder; a broker that lost its
        // retained messages gets it again on connect.
        release: (options.model_file.as_deref())
            .and_then(super::release::load)
            .map(|r| {
                let keys = rounds.config().auth.as_deref();
                (r.round, super::release::frames(&r, keys).published)
            }),
        evaluator,
        events,
        target_accuracy: None,
        journal: options.journal.as_ref().map(Journal::new),
        context: StatusContext {
            federation: options.federation.clone(),
            ..StatusContext::default()
        },
        status_sent: None,
        status_due: None,
        logs: RejectionLog::default(),
        upstream,
        metrics,
        handling: Duration::ZERO,
        control_seq: 0,
    };
    let control_topic = topics.control();
    let mut keys_watch = KeysWatch::new(options.keys_file.as_deref());
    rounds.start(now_ms());
    loop {
        let deadline = rounds
            .poll_timeout()
            .map(|ms| tokio::time::Instant::from_std(origin + Duration::from_millis(ms)));
        let mut wake = match (deadline, sinks.status_due) {
            (Some(a), Some(b)) => Some(a.min(tokio::time::Instant::from_std(b))),
            (a, b) => a.or(b.map(tokio::time::Instant::from_std)),
        };
        if options.keys_file.is_some() {
            let at = tokio::time::Instant::from_std(keys_watch.next_check);
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        // Requests waiting for room are retried soon: the broker sends nothing more (nothing
        // would wake this loop) while unsent acknowledgements hold its in-flight window.
        if sinks.outbox.is_waiting() {
            let soon = tokio::time::Instant::now() + Duration::from_millis(2);
            wake = Some(wake.map_or(soon, |w| w.min(soon)));
        }
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let mut ack = None;
        tokio::select! {
            event = eventloop.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    connected = true;
                    tracing::info!(broker = %format!("{}:{}", options.broker.host, options.broker.port), "coordinator connected");
                    let control = options.operator_key.as_ref().map(|_| control_topic.clone());
                    for filter in [topics.update_filter(), topics.edge_status_filter()].into_iter().chain(control) {
                        if let Err(e) = sinks.outbox.client().try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                            tracing::error!(%filter, error = %e, "cannot subscribe");
                        }
                    }
                    // Republish what a new broker or a reconnecting dashboard needs.
                    if rounds.phase() == Phase::Training {
                        rounds.republish_task();
                    }
                    if let Some((round, frame)) = &sinks.release {
                        let max_packet = options.broker.max_packet;
                        publish_task(&mut sinks.outbox, &mut sinks.model_topics, *round, frame.clone(), max_packet);
                    }
                    if options.home_assistant {
                        for (topic, config) in super::discovery::discovery_messages(&topics, &options.federation) {
                            sinks.outbox.publish(topic, true, config);
                        }
                    }
                    rounds.touch_status();
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let started = Instant::now();
                    if let Some(c) = topics.client_of_update(&p.topic) {
                        rounds.handle_packet(c, &p.payload, now_ms());
                    } else if let Some(c) = topics.client_of_edge_status(&p.topic) {
                        handle_edge_status(&mut rounds, c, &p.payload, now_ms());
                    } else if let (true, Some(key)) = (p.topic == control_topic, &options.operator_key) {
                        let seq = &mut sinks.control_seq;
                        handle_control(&mut rounds, &options.federation, key, seq, &p.payload, now_ms());
                    }
                    sinks.handling = started.elapsed();
                    if let Some(m) = &sinks.metrics {
                        m.received(p.payload.len());
                    }
                    ack = Some(p);
                }
                Ok(_) => {}
                Err(e) => {
                    // The broker sends unacknowledged messages again on the next session.
                    sinks.outbox.forget_acks();
                    if connected {
                        tracing::warn!(error = %fedge_mqtt::describe_error(&e), "lost the broker; reconnecting");
                    } else if backoff.is_fresh() {
                        tracing::warn!(error = %fedge_mqtt::describe_error(&e), "cannot connect to the broker; retrying with back-off");
                    }
                    let delay = backoff.next_delay();
                    connected = false;
                    tracing::debug!(error = %e, ?delay, "broker unreachable");
                    tokio::time::sleep(delay).await;
                }
            },
            _ = sleep => {
                let started = Instant::now();
                rounds.handle_timeout(now_ms());
                sinks.handling = started.elapsed();
            }
            message = from_upstream(&mut inbox) => match message {
                FromUpstream::Task(task) => {
                    let round = task.round;
                    if let Err(e) = rounds.relay_task(*task, now_ms()) {
                        tracing::error!(round, error = %e, "the site cannot answer the global round");
                        if let Some(tx) = &sinks.upstream {
                            let _ = tx.send(ToUpstream::Refused { round, reason: e.to_string() });
                        }
                    }
                }
                FromUpstream::Release(release) => rounds.relay_release(*release),
            },
            _ = stop.changed() => break,
        }
        if let Some(path) = &options.keys_file {
            keys_watch.poll(path, &mut rounds);
        }
        sinks.context.now_ms = now_ms();
        sinks.context.wall = std::time::SystemTime::now();
        let finished = sinks.drain(&mut rounds);
        // After the journal writes the packet caused (`drain`): now the broker may forget it.
        // Acknowledgements wait in order while the client's request queue is full (a burst of
        // thousands of updates, see `outbox.rs`): a dropped one would hold the broker's
        // in-flight window for this session shut, and the round would stall short of its last
        // updates.
        if let Some(publish) = ack {
            sinks.outbox.ack(publish);
        }
        sinks.outbox.flush();
        if finished {
            break;
        }
    }
    // Let the last publishes (final status, metrics) reach the broker, without a Last Will.
    sinks
        .outbox
        .close(&mut eventloop, Duration::from_secs(2))
        .await;
    drop(metrics_server);
    Ok(rounds)
}

impl Sinks<'_> {
    /// Acts on every output the machine has; true once the federation finished.
    fn drain(&mut self, rounds: &mut Rounds) -> bool {
        let Sinks {
            outbox,
            options,
            topics,
            status_topic,
            task_topics,
            model_topics,
            release,
            evaluator,
            events,
            target_accuracy,
            journal,
            context,
            status_sent,
            status_due,
            logs,
            upstream,
            metrics,
            handling,
            control_seq: _,
        } = self;
        let (options, topics) = (*options, *topics);
        let mut status_dirty = false;
        let mut finished = false;
        while let Some(output) = rounds.poll_output() {
            match output {
                Output::PublishTask { round, frame } => {
                    if let Some(m) = metrics {
                        m.task_published(round);
                    }
                    publish_task(outbox, task_topics, round, frame, options.broker.max_packet);
                }
                Output::RoundEnded(report) => {
                    if let (Some(tx), Some(reason)) = (upstream.as_ref(), report.abandoned) {
                        let round = report.round;
                        let reason = reason.to_owned();
                        let _ = tx.send(ToUpstream::Abandoned { round, reason });
                    }
                    if let Some(m) = metrics {
                        m.round_ended(&report, handling.as_secs_f64());
                    }
                    if report.aggregated {
                        context.last_aggregation = Some(context.wall);
                        *target_accuracy = evaluator.as_ref().and_then(|e| e(rounds.params()));
                        if let Some(path) = &options.checkpoint {
                            let saved = rounds.checkpoint();
                            if let Err(e) = crate::store::checkpoint::save(path, &saved) {
                                tracing::error!(error = %e, "checkpoint not saved");
                            }
                        }
                    }
                    tracing::info!(
                        round = report.round,
                        aggregated = report.aggregated,
                        reported = report.reported.len(),
                        selected = report.selected.len(),
                        target_accuracy = ?target_accuracy,
                        "round ended"
                    );
                    let metrics = metrics_json(
                        &report,
                        *target_accuracy,
                        rounds.strategy_name(),
                        rounds.site_accuracy(),
                    );
                    outbox.publish(topics.metrics(), false, metrics.to_string());
                    if let Some(tx) = events {
                        let _ = tx.send(DriverEvent::RoundEnded {
                            report,
                            target_accuracy: *target_accuracy,
                        });
                    }
                }
                Output::Rejected {
                    client: who,
                    reason,
                    detail,
                } => {
                    if let Some(m) = metrics {
                        m.rejected(reason.name());
                    }
                    if logs.admit(reason.name(), Instant::now()) {
                        // Debug formatting escapes control characters a device put in its id.
                        tracing::warn!(client = ?who, reason = reason.name(), detail = ?detail, "update rejected");
                    }
                    if let Some(tx) = events {
                        let _ = tx.send(DriverEvent::Rejected {
                            client: who,
                            reason: reason.name(),
                            detail,
                        });
                    }
                }
                Output::Release(model) => {
                    let frames = super::release::frames(&model, rounds.config().auth.as_deref());
                    if let Some(path) = &options.model_file {
                        super::release::save(path, &frames.plain);
                    }
                    let max_packet = options.broker.max_packet;
                    let frame = frames.published;
                    publish_task(outbox, model_topics, model.round, frame.clone(), max_packet);
                    *release = Some((model.round, frame));
                }
                Output::Upstream(update) => {
                    if let Some(tx) = upstream {
                        let _ = tx.send(ToUpstream::Update(update));
                    }
                }
                Output::StatusChanged => status_dirty = true,
                Output::Journal(record) => {
                    let Some(journal) = journal.as_mut() else {
                        continue;
                    };
                    if let Err(e) = journal.write(&record) {
                        tracing::error!(error = %e, "journal not written");
                        if let Record::Accepted { round, client, .. } = &record {
                            rounds.handle_journal_failure(*round, client, e.to_string());
                        }
                    }
                }
                Output::Finished => {
                    // A finished federation leaves no retained task for devices that join later.
                    clear_task(outbox, task_topics);
                    finished = true;
                }
            }
        }
        if let Some(m) = metrics {
            m.devices(rounds.online().len(), rounds.selected());
            m.sent(outbox.take_sent());
        }
        let now = Instant::now();
        if status_dirty || finished {
            let next = status_sent.map_or(now, |sent| sent + STATUS_INTERVAL);
            *status_due = Some(status_due.map_or(next, |due| due.min(next)));
        }
        if finished || status_due.is_some_and(|due| due <= now) {
            let status = status_at(rounds, *target_accuracy, context);
            let json = serde_json::to_string(&status).unwrap_or_default();
            outbox.publish(status_topic.as_str(), true, json);
            *status_sent = Some(now);
            *status_due = None;
        }
        finished
    }
}

fn clear_task(outbox: &mut Outbox, topics: &mut TaskTopics) {
    let mut stale = vec![topics.base.clone()];
    stale.extend((0..topics.chunk_topics_in_use).map(|i| format!("{}/{i}", topics.base)));
    for topic in stale {
        outbox.publish(topic, true, Vec::new());
    }
    topics.chunk_topics_in_use = 0;
}

fn publish_task(
    outbox: &mut Outbox,
    topics: &mut TaskTopics,
    round: u64,
    frame: Vec<u8>,
    max_packet: usize,
) {
    let pieces = fedge_wire::split_into_chunks(frame, round, max_packet);
    let count = if pieces.len() == 1 { 0 } else { pieces.len() };
    let mut publish = |topic: String, payload: Vec<u8>| outbox.publish(topic, true, payload);
    // Clear retained task topics the new task does not overwrite, so no device reassembles a
    // mix of old and new pieces.
    if count == 0 {
        for i in 0..topics.chunk_topics_in_use {
            publish(format!("{}/{i}", topics.base), Vec::new());
        }
        publish(
            topics.base.clone(),
            pieces.into_iter().next().unwrap_or_default(),
        );
    } else {
        publish(topics.base.clone(), Vec::new());
        for i in count..topics.chunk_topics_in_use {
            publish(format!("{}/{i}", topics.base), Vec::new());
        }
        for (i, piece) in pieces.into_iter().enumerate() {
            publish(format!("{}/{i}", topics.base), piece);
        }
    }
    topics.chunk_topics_in_use = count;
}
