//! The thin tokio driver: MQTT events, a timer and a stop signal in, the round machine's
//! outputs out.
//!
//! Everything that decides lives in `crate::round::Rounds`; this file only maps I/O to the
//! machine's inputs and its outputs to publishes, logs and events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fedge_mqtt::{REQUEST_QUEUE, Session, SessionEvent};
use fedge_wire::control::ControlMessage;
use fedge_wire::{EdgeStatus, Topics};
use rumqttc::{LastWill, QoS};
use tokio::sync::{mpsc, watch};

use super::keys_watch::KeysWatch;
use super::metrics::Metrics;
use super::outbox::Outbox;
use super::retained::{TaskTopics, publish_task};
use super::sinks::{RejectionLog, Sinks};
use super::status::StatusContext;
use crate::round::{Phase, Rejection, Rounds};
use crate::store::audit::{AuditLog, Event};
use crate::store::journal::Journal;

pub use super::contract::{
    DriverError, DriverEvent, DriverOptions, Evaluator, FromUpstream, Relay, ToUpstream,
};

/// Largest device status the coordinator reads (a real one is a few hundred bytes).
pub const MAX_EDGE_STATUS_BYTES: usize = 4096;

/// An operator command: applied when its tag, federation and number check, else counted as
/// `bad_control` (`fedge_wire::control`). What the command will set is kept in `control_file`
/// first, with its number, and only then applied: a restart forgets nothing whose effects were
/// published, and takes no captured command again. A command that cannot be kept is refused
/// (nothing applied), as is one the machine cannot apply; a refused command's number is used
/// up all the same. Returns the command taken (its tag and number checked) and whether it was
/// applied or why not, which the status also says (`Rounds::note_command`).
fn handle_control(
    rounds: &mut Rounds,
    federation: &str,
    key: &fedge_wire::DeviceKey,
    last_seq: &mut u64,
    control_file: Option<&std::path::Path>,
    payload: &[u8],
    now_ms: u64,
) -> Option<(ControlMessage, Result<(), String>)> {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let message = match ControlMessage::open(payload, federation, key, *last_seq, wall) {
        Ok(message) => message,
        // Logged by the machine's rate-limited rejection log.
        Err(e) => {
            rounds.reject_control(e.to_string());
            return None;
        }
    };
    // Its number is spent, whatever becomes of it: a captured copy is a replay.
    *last_seq = message.seq;
    let outcome = apply_control(rounds, &message, *last_seq, control_file, now_ms);
    if let Err(detail) = &outcome {
        rounds.reject_control(detail.clone());
    }
    rounds.note_command(message.seq, &message.command, &outcome);
    Some((message, outcome))
}

/// Keeps what `message` will set, then applies it; or says why it cannot be.
fn apply_control(
    rounds: &mut Rounds,
    message: &ControlMessage,
    last_seq: u64,
    control_file: Option<&std::path::Path>,
    now_ms: u64,
) -> Result<(), String> {
    let keep = |settings: &crate::round::OperatorSettings| match control_file {
        Some(path) => crate::store::control::store(path, settings),
        None => Ok(()),
    };
    let planned = match rounds.settings_after(&message.command, last_seq) {
        Ok(planned) => planned,
        Err(detail) => {
            if let Err(e) = keep(&rounds.operator_settings(last_seq)) {
                tracing::error!(error = %e, "the refused command's number not kept");
            }
            return Err(detail);
        }
    };
    if let Err(e) = keep(&planned) {
        let command = serde_json::to_string(&message.command).unwrap_or_default();
        return Err(format!(
            "{command} not applied: {e}; the operator settings must be kept before a command \
             is applied (fix the state folder, then send the command again)"
        ));
    }
    let applied = rounds.try_control(&message.command, now_ms);
    // What the machine set may differ from the plan (a rollback pins once the pipeline took
    // it; a refused one changed nothing).
    let settings = rounds.operator_settings(last_seq);
    if settings != planned
        && let Err(e) = keep(&settings)
    {
        tracing::error!(error = %e, "operator settings not kept: a restart would forget them");
    }
    applied
}

/// The number of the last operator command taken, kept in `control_file` (the settings
/// themselves were put back when the machine booted, `boot::Start::settings`).
fn last_control_seq(control_file: Option<&std::path::Path>) -> Result<u64, DriverError> {
    let Some(path) = control_file else {
        return Ok(0);
    };
    Ok(crate::store::control::load(path)?.map_or(0, |saved| saved.last_seq))
}

/// Reads a device's retained status: online or not. An empty payload (a cleared retained
/// message) means offline; an oversized or unreadable one is rejected and changes nothing.
pub fn handle_edge_status(rounds: &mut Rounds, client: &str, payload: &[u8], now_ms: u64) {
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
    let mut session = Session::new(mqtt, REQUEST_QUEUE);
    let client = session.client().clone();
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
    let control_seq = last_control_seq(options.control_file.as_deref())?;
    let origin = Instant::now();
    let now_ms = || origin.elapsed().as_millis() as u64;
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
                let version = rounds.downlink_version();
                let frame = super::release::frames(&r, keys, version).published;
                let round = r.round;
                // What devices were told to serve last, and the releases kept before it (a
                // rollback's pin comes back with the operator settings).
                let mut kept = (options.releases_dir.as_deref())
                    .map(crate::store::releases::load)
                    .unwrap_or_default();
                if kept.last().is_none_or(|k| k.sha256 != r.sha256) {
                    kept.push(r);
                }
                rounds.restore_served(kept);
                (round, frame)
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
        control_seq,
        fatal: None,
        announced: Default::default(),
        audit: options.audit_file.as_ref().map(AuditLog::new),
        built: Default::default(),
        serving: super::serving::ServingSinks {
            candidate_topics: Some(TaskTopics {
                base: topics.model_candidate(),
                chunk_topics_in_use: 0,
            }),
            ..super::serving::ServingSinks::restored(options.serving_file.clone())?
        },
    };
    let control_topic = topics.control();
    let mut keys_watch = KeysWatch::new(options.keys_file.as_deref());
    let window = options.previous_protocol;
    rounds.set_previous_protocol(window.accepted_at(std::time::SystemTime::now()));
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
            event = session.next() => match event {
                SessionEvent::Connected => {
                    tracing::info!(broker = %format!("{}:{}", options.broker.host, options.broker.port), "coordinator connected");
                    let control = options.operator_key.as_ref().map(|_| control_topic.clone());
                    let enrol = options.keys_file.as_ref().map(|_| topics.enrol_request_filter());
                    for filter in [topics.update_filter(), topics.edge_status_filter()].into_iter().chain(control).chain(enrol) {
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
                    sinks.serving.republish(&mut sinks.outbox, &topics.model_serving(), options.broker.max_packet);
                    if options.home_assistant {
                        for (topic, config) in super::discovery::discovery_messages(&topics, &options.federation) {
                            sinks.outbox.publish(topic, true, config);
                        }
                        // A new broker session (perhaps a broker that lost its retained
                        // messages): every device's entities are announced again.
                        sinks.announced.clear();
                    }
                    rounds.touch_status();
                }
                SessionEvent::Publish(p) => {
                    let started = Instant::now();
                    if let Some(c) = topics.client_of_update(&p.topic) {
                        rounds.handle_packet(c, &p.payload, now_ms());
                    } else if let Some(c) = topics.client_of_edge_status(&p.topic) {
                        handle_edge_status(&mut rounds, c, &p.payload, now_ms());
                    } else if let (true, Some(key)) = (p.topic == control_topic, &options.operator_key) {
                        let seq = &mut sinks.control_seq;
                        let file = options.control_file.as_deref();
                        let taken = handle_control(&mut rounds, &options.federation, key, seq, file, &p.payload, now_ms());
                        // `ctl status` asks and changes nothing: not an event of the trail.
                        let taken = taken.filter(|(m, _)| !matches!(m.command, fedge_wire::control::Command::Status));
                        if let (Some((message, outcome)), Some(audit)) = (taken, sinks.audit.as_mut()) {
                            let event = Event::control(message, outcome, rounds.control().last_command.as_ref());
                            audit.record(&crate::store::audit::operator(key), event);
                        }
                    } else if let (Some(c), Some(keys)) = (topics.client_of_enrol_request(&p.topic), &options.keys_file) {
                        let audit = sinks.audit.as_mut();
                        super::enrol::handle_request(&mut rounds, &mut sinks.outbox, audit, &options.federation, keys, c, &p.payload);
                    }
                    sinks.handling = started.elapsed();
                    if let Some(m) = &sinks.metrics {
                        m.received(p.payload.len());
                    }
                    ack = Some(p);
                }
                SessionEvent::Other => {}
                // The back-off is waited out inside `session.next()`: the round's timer, the
                // uplink and a stop are taken meanwhile.
                SessionEvent::Lost { error, was_connected, first } => {
                    // The broker sends unacknowledged messages again on the next session.
                    sinks.outbox.forget_acks();
                    if was_connected {
                        tracing::warn!(%error, "lost the broker; reconnecting");
                    } else if first {
                        tracing::warn!(%error, "cannot connect to the broker; retrying with back-off");
                    } else {
                        tracing::debug!(%error, "broker unreachable");
                    }
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
                FromUpstream::Serving(pointer) => rounds.relay_serving(&pointer),
            },
            _ = stop.changed() => break,
        }
        if let Some(path) = &options.keys_file {
            keys_watch.poll(path, &mut rounds, sinks.audit.as_mut());
            sinks.context.keys_error.clone_from(&keys_watch.error);
        }
        let window = options.previous_protocol;
        rounds.set_previous_protocol(window.accepted_at(std::time::SystemTime::now()));
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
        if let Some(reason) = sinks.fatal.take() {
            sinks
                .outbox
                .close(session.parts().1, Duration::from_secs(2))
                .await;
            return Err(DriverError::Withheld(reason));
        }
        if finished && !options.stay_up {
            break;
        }
        if finished {
            tracing::info!("the run is done; staying up for `ctl new-run`");
        }
    }
    // Let the last publishes (final status, metrics) reach the broker, without a Last Will.
    sinks
        .outbox
        .close(session.parts().1, Duration::from_secs(2))
        .await;
    drop(metrics_server);
    Ok(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::RoundConfig;
    use fedge_wire::DeviceKey;
    use fedge_wire::control::Command;

    fn wall_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    #[test]
    fn a_command_that_cannot_be_kept_is_refused_and_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let key = DeviceKey::from_bytes([7; 32]);
        let mut rounds = Rounds::new(
            RoundConfig::default(),
            Box::new(crate::strategy::FedAvg),
            vec![0.0; 4],
        );
        let seq = wall_ms();
        let pause = ControlMessage::signed("f", seq, Command::Pause, &key);
        let payload = serde_json::to_vec(&pause).unwrap();
        // The state folder is a file: nothing can be written under it.
        let blocked = dir.path().join("state");
        std::fs::write(&blocked, b"").unwrap();
        let unwritable = blocked.join("control.json");
        let mut last = 0;
        let taken = handle_control(
            &mut rounds,
            "f",
            &key,
            &mut last,
            Some(&unwritable),
            &payload,
            0,
        );
        assert!(matches!(taken, Some((_, Err(_)))), "taken and refused");
        assert!(!rounds.control().paused, "not applied");
        assert_eq!(rounds.rejected_total().get("bad_control"), Some(&1));
        let refused = rounds.control().refused.clone().unwrap_or_default();
        assert!(
            refused.contains("not applied") && refused.contains("control.json"),
            "{refused}"
        );
        // Its number is spent: the captured copy is a replay.
        let replay = handle_control(&mut rounds, "f", &key, &mut last, None, &payload, 0);
        assert!(replay.is_none() && !rounds.control().paused);
        // Sent again where it can be kept: kept, then applied.
        let file = dir.path().join("control.json");
        let again = ControlMessage::signed("f", seq + 1, Command::Pause, &key);
        let payload = serde_json::to_vec(&again).unwrap();
        let taken = handle_control(&mut rounds, "f", &key, &mut last, Some(&file), &payload, 0);
        assert_eq!(
            taken.map(|(m, o)| (m.command, o)),
            Some((Command::Pause, Ok(())))
        );
        assert!(rounds.control().paused);
        let kept = crate::store::control::load(&file).unwrap().unwrap();
        assert_eq!((kept.last_seq, kept.paused), (seq + 1, true));
        // One the machine refuses is not applied, and its number is kept all the same.
        let bad = Command::SetBackbone {
            name: "b".into(),
            sha256: "zz".into(),
        };
        let refused = ControlMessage::signed("f", seq + 2, bad, &key);
        let payload = serde_json::to_vec(&refused).unwrap();
        let taken = handle_control(&mut rounds, "f", &key, &mut last, Some(&file), &payload, 0);
        assert!(matches!(taken, Some((_, Err(_)))));
        let last = rounds
            .control()
            .last_command
            .clone()
            .expect("the status says it");
        assert_eq!((last.seq, last.applied), (seq + 2, false));
        assert!(last.refused.unwrap_or_default().contains("64 hex digits"));
        let kept = crate::store::control::load(&file).unwrap().unwrap();
        assert_eq!((kept.last_seq, kept.backbone), (seq + 2, None));
    }

    #[test]
    fn a_reset_of_the_pool_is_kept_before_it_is_applied_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("control.json");
        let key = DeviceKey::from_bytes([7; 32]);
        let mut rounds = Rounds::new(
            RoundConfig::default(),
            Box::new(crate::strategy::FedAvg),
            vec![0.0; 4],
        );
        let reset = ControlMessage::signed("f", wall_ms(), Command::ResetPool, &key);
        let payload = serde_json::to_vec(&reset).unwrap();
        let mut last = 0;
        let taken = handle_control(&mut rounds, "f", &key, &mut last, Some(&file), &payload, 0);
        assert_eq!(
            taken.map(|(m, o)| (m.command, o)),
            Some((Command::ResetPool, Ok(())))
        );
        let kept = crate::store::control::load(&file).unwrap().unwrap();
        assert_eq!(kept.pool_reset, Some(0));
    }

    #[test]
    fn a_status_with_hostile_loading_and_skip_fields_is_read_or_refused_never_trusted() {
        let mut rounds = Rounds::new(
            RoundConfig::default(),
            Box::new(crate::strategy::FedAvg),
            vec![0.0; 4],
        );
        // Counts at their limits, a file name with terminal escapes: read, the device online,
        // nothing of it used for a decision.
        let status = |client: &str| {
            serde_json::to_value(fedge_wire::EdgeStatus {
                client_id: client.into(),
                online: true,
                updated_at: "t1".into(),
                ..Default::default()
            })
            .unwrap()
        };
        let mut extreme = status("cam-1");
        for (field, value) in [
            ("loading", serde_json::json!("features\u{1b}[2J")),
            ("loading_done", serde_json::json!(u64::MAX)),
            ("loading_total", serde_json::json!(1)),
            ("skipped_images", serde_json::json!(u64::MAX)),
            (
                "last_skipped_image",
                serde_json::json!("\u{1b}]0;owned\u{7}"),
            ),
            ("last_skipped_reason", serde_json::json!("x".repeat(1000))),
        ] {
            extreme[field] = value;
        }
        handle_edge_status(&mut rounds, "cam-1", extreme.to_string().as_bytes(), 0);
        assert!(rounds.online().contains("cam-1"));
        assert!(
            rounds.rejected_total().is_empty(),
            "{:?}",
            rounds.rejected_total()
        );
        // A negative count or one past u64 is not a status: refused, counted, nothing changes.
        for bad in ["-1", "18446744073709551616", "\"many\""] {
            let text = status("cam-2").to_string().replacen(
                "\"online\":true",
                &format!("\"online\":true,\"skipped_images\":{bad}"),
                1,
            );
            handle_edge_status(&mut rounds, "cam-2", text.as_bytes(), 1);
        }
        assert!(!rounds.online().contains("cam-2"));
        assert_eq!(rounds.rejected_total().get("malformed"), Some(&3));
    }
}
