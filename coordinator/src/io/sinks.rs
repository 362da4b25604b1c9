//! The driver's output side: what it keeps to act on the round machine's outputs (publishes
//! through the outbox, the checkpoint and journal, the release, the status document and its
//! pacing, metrics and events), and the retained task topics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fedge_wire::Topics;
use tokio::sync::mpsc;

use super::contract::{DriverEvent, DriverOptions, Evaluator, ToUpstream};
use super::metrics::Metrics;
use super::outbox::Outbox;
use super::retained::{TaskTopics, clear_task, publish_task};
use super::status::{StatusContext, metrics_json, status_at};
use crate::round::{Output, Record, Rounds};
use crate::store::audit::{AuditLog, Event};
use crate::store::journal::Journal;

/// What the driver keeps to act on the machine's outputs: where to publish, what to write, and
/// the status document's context.
pub(super) struct Sinks<'a> {
    pub(super) outbox: Outbox,
    pub(super) options: &'a DriverOptions,
    pub(super) topics: &'a Topics,
    pub(super) status_topic: String,
    pub(super) task_topics: TaskTopics,
    /// `model/current` and its chunk topics, and the frame last published there.
    pub(super) model_topics: TaskTopics,
    pub(super) release: Option<(u64, Vec<u8>)>,
    pub(super) evaluator: Option<Evaluator>,
    pub(super) events: Option<mpsc::UnboundedSender<DriverEvent>>,
    pub(super) target_accuracy: Option<f32>,
    pub(super) journal: Option<Journal>,
    pub(super) context: StatusContext,
    /// When the status document was last published, and when the next one is due (status
    /// changes are coalesced: at most one publish per [`STATUS_INTERVAL`]).
    pub(super) status_sent: Option<Instant>,
    pub(super) status_due: Option<Instant>,
    pub(super) logs: RejectionLog,
    pub(super) upstream: Option<mpsc::UnboundedSender<ToUpstream>>,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// How long the machine took over the last packet or deadline (a round's closing time).
    pub(super) handling: Duration,
    /// The number of the last operator command applied.
    pub(super) control_seq: u64,
    /// Why the driver must stop now, publishing nothing more of the model (a checkpoint that
    /// could not be saved under central DP).
    pub(super) fatal: Option<String>,
    /// With `home_assistant`: the devices whose entities were announced on this connection.
    pub(super) announced: std::collections::BTreeSet<String>,
    /// The audit trail (`DriverOptions::audit_file`).
    pub(super) audit: Option<AuditLog>,
    /// The last aggregated round and the clients whose updates it used, for its release's
    /// audit line.
    pub(super) built: std::collections::VecDeque<(u64, Vec<String>)>,
    /// Candidates and serving pointers (`serving.rs`).
    pub(super) serving: super::serving::ServingSinks,
}

/// Least time between two status publishes: a flood of junk packets, each a rejection and a
/// status change, costs one retained publish per interval, not one per packet.
pub(super) const STATUS_INTERVAL: Duration = Duration::from_millis(500);
/// Rate-limited logging of rejections: per reason, the first [`RejectionLog::BURST`] in each
/// minute are logged one by one, the rest summed in one line when the minute ends.
#[derive(Default)]
pub(super) struct RejectionLog {
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

impl Sinks<'_> {
    /// Acts on every output the machine has; true once the federation finished.
    pub(super) fn drain(&mut self, rounds: &mut Rounds) -> bool {
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
            fatal,
            announced,
            audit,
            built,
            serving,
        } = self;
        let (options, topics) = (*options, *topics);
        let mut status_dirty = false;
        let mut finished = false;
        while let Some(output) = rounds.poll_output() {
            match output {
                // Under central DP with its accountant not on disk, nothing of the new model
                // leaves: neither the release nor the next round's task.
                Output::PublishTask { .. }
                | Output::Release(_)
                | Output::Candidate(_)
                | Output::Serving(_)
                    if fatal.is_some() => {}
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
                        // A gated release is promoted rounds later, a rollback goes further
                        // back: the last few rounds' builders are kept.
                        built.push_back((report.round, report.reported.clone()));
                        while built.len() > BUILT_KEPT {
                            built.pop_front();
                        }
                        if let (Some(audit), Some(p)) = (audit.as_mut(), &report.privacy) {
                            audit.record(
                                "coordinator",
                                Event::PrivacyStep {
                                    round: report.round,
                                    epsilon: p.epsilon,
                                    amplified_epsilon: p.amplified_epsilon,
                                    delta: p.delta,
                                    rounds: p.rounds,
                                },
                            );
                        }
                        context.last_aggregation = Some(context.wall);
                        *target_accuracy = evaluator
                            .as_ref()
                            .and_then(|e| e(rounds.params(), rounds.pooled()));
                        if let Some(path) = &options.checkpoint {
                            let saved = rounds.checkpoint();
                            if let Err(e) = crate::store::checkpoint::save(path, &saved) {
                                tracing::error!(error = %e, "checkpoint not saved");
                                // A restart would resume from the checkpoint before, with the
                                // privacy spent on this round forgotten: release nothing.
                                if rounds.privacy_spent().is_some() {
                                    *fatal = Some(format!(
                                        "checkpoint not saved under central DP ({e}); the \
                                         model of round {} was not released",
                                        report.round
                                    ));
                                }
                            }
                        }
                    }
                    // One line a person can follow a federation by: accuracies as plain
                    // numbers (absent ones left out), the sites' scores as `site=acc` pairs.
                    // What devices serve, as the status says it (a held candidate's score is
                    // not what any site gets).
                    let served = rounds.served_site_accuracy();
                    let sites: Vec<String> = (served.iter())
                        .map(|(site, acc)| format!("{site}={acc:.3}"))
                        .collect();
                    tracing::info!(
                        round = report.round,
                        aggregated = report.aggregated,
                        reported = report.reported.len(),
                        selected = report.selected.len(),
                        target_accuracy = target_accuracy.map(three_places),
                        source_val_accuracy = report.source_val_accuracy.map(three_places),
                        site_accuracy = %sites.join(" "),
                        "round ended"
                    );
                    let metrics =
                        metrics_json(&report, *target_accuracy, rounds.strategy_name(), &served);
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
                        // Escaped, so that control characters a device put in its id or a payload
                        // put in the detail cannot forge log lines; not Debug-quoted, so a JSON
                        // log holds the plain value.
                        let (who, detail) = (who.escape_debug(), detail.escape_debug());
                        tracing::warn!(client = %who, reason = reason.name(), detail = %detail, "update rejected");
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
                    let frames = super::release::frames(
                        &model,
                        rounds.config().auth.as_deref(),
                        rounds.downlink_version(),
                    );
                    if let Some(path) = &options.model_file {
                        super::release::save(path, &frames.plain);
                    }
                    let max_packet = options.broker.max_packet;
                    let frame = frames.published;
                    publish_task(outbox, model_topics, model.round, frame.clone(), max_packet);
                    *release = Some((model.round, frame));
                    if let Some(audit) = audit.as_mut() {
                        audit.record("coordinator", released(&model, built, rounds));
                    }
                }
                Output::Candidate(model) => {
                    serving.candidate(outbox, rounds, &model, options.broker.max_packet);
                }
                Output::Serving(pointer) => {
                    let wall = (context.wall.duration_since(std::time::UNIX_EPOCH))
                        .map_or(0, |d| d.as_millis() as u64);
                    let topic = topics.model_serving();
                    serving.pointer(
                        outbox,
                        rounds,
                        &topic,
                        pointer,
                        wall,
                        options.broker.max_packet,
                    );
                    // Every change of what is served ends with a pointer: keep the releases a
                    // rollback can go back to.
                    if let Some(dir) = &options.releases_dir
                        && let Err(e) = crate::store::releases::save(dir, rounds.releases().kept())
                    {
                        tracing::warn!(dir = %dir.display(), error = %e, "the releases kept for rollback were not written");
                    }
                }
                Output::ReleaseEvent(event) => {
                    if let Some(m) = metrics {
                        m.release_event(&event);
                    }
                    super::serving::record(event, audit.as_mut());
                }
                Output::Upstream(update) => {
                    if let Some(tx) = upstream {
                        let _ = tx.send(ToUpstream::Update(update));
                    }
                }
                Output::StatusChanged => status_dirty = true,
                Output::ClearDeviceStatus(client) => {
                    outbox.publish(topics.edge_status(&client), true, Vec::new());
                    if options.home_assistant {
                        let federation = &options.federation;
                        for topic in super::discovery::device_discovery_topics(federation, &client)
                        {
                            outbox.publish(topic, true, Vec::new());
                        }
                        announced.remove(&client);
                    }
                }
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
                    // A finished federation leaves no retained task for devices that join later,
                    // and no raw updates on disk.
                    clear_task(outbox, task_topics);
                    if let Some(Err(e)) = journal.as_mut().map(Journal::remove) {
                        tracing::warn!(error = %e, "the finished federation's journal not removed");
                    }
                    finished = true;
                }
            }
        }
        if options.home_assistant {
            announce_devices(outbox, options, topics, rounds, announced);
        }
        if let Some(m) = metrics {
            m.devices(rounds.online().len(), rounds.selected());
            m.observe(rounds);
            if let Some(spent) = rounds.privacy_spent() {
                m.privacy_epsilon(spent.epsilon);
            }
            m.releases(rounds.releases().rounds());
            m.sent(outbox.take_sent());
        }
        // Each line the trail gained goes out with the status: its head anchored off this machine.
        status_dirty |= context.follow_audit(audit.as_mut());
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

/// Rounds whose contributors the driver keeps for the audit lines of their releases.
const BUILT_KEPT: usize = 64;

/// The audit line of `model`'s release: who built it is its round's clients (while that round
/// is among the last [`BUILT_KEPT`] aggregated); a site relaying the global release names none
/// (the global coordinator's trail does).
fn released(
    model: &fedge_wire::ModelRelease,
    built: &std::collections::VecDeque<(u64, Vec<String>)>,
    rounds: &Rounds,
) -> Event {
    let relayed = rounds.config().relay.is_some();
    let built_by = (built.iter())
        .rev()
        .find(|(round, _)| *round == model.round && !relayed)
        .map(|(_, clients)| clients.clone())
        .unwrap_or_default();
    Event::Released {
        round: model.round,
        run: format!("{:016x}", model.run),
        sha256: fedge_wire::hex::encode(&model.sha256),
        built_by,
        relayed,
    }
}

/// Announces the Home Assistant entities of every device heard from (online to train, or an
/// evaluation-only site that scored a release) not announced yet on this connection.
fn announce_devices(
    outbox: &mut Outbox,
    options: &DriverOptions,
    topics: &Topics,
    rounds: &Rounds,
    announced: &mut std::collections::BTreeSet<String>,
) {
    let heard = rounds.online().iter().chain(rounds.site_accuracy().keys());
    let new: Vec<String> = heard.filter(|c| !announced.contains(*c)).cloned().collect();
    for client in new {
        let federation = &options.federation;
        for (topic, config) in
            super::discovery::device_discovery_messages(topics, federation, &client)
        {
            outbox.publish(topic, true, config);
        }
        announced.insert(client);
    }
}

/// An accuracy for the log: three decimals, without f32's tail in f64.
fn three_places(accuracy: f32) -> f64 {
    (f64::from(accuracy) * 1000.0).round() / 1000.0
}
