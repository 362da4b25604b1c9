//! A site aggregator's link to the global federation: one MQTT connection to the upstream
//! broker (the central one, or the site broker bridged to it), as the site's client id.
//!
//! - It reads the retained global task (and its chunks) and hands a task that names the site,
//!   opened with the site's key, to the site's round machine; and the retained global model,
//!   which the site re-releases to its devices.
//! - It sends the site's update (sealed and chunk-tagged with the site's key) while the global
//!   round it answers is open. The update is kept in `pending` on disk until the global
//!   federation moves past its round: an uplink that drops, or a site killed and restarted,
//!   sends it when the link returns if the global round is still open (a second copy is a
//!   `duplicate` upstream, which changes nothing), else it is dropped as stale and the site's
//!   status says so.
//! - It keeps the site's retained status upstream (online, the last round answered, the last
//!   error), signed like a device's, with an offline Last Will.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fedge_mqtt::{BrokerConfig, REQUEST_QUEUE, Session, SessionEvent};
use fedge_wire::{ClientUpdate, DeviceKey, EdgeStatus, Message, Reassembler, Topics};
use rumqttc::{AsyncClient, LastWill, QoS};
use tokio::sync::{mpsc, watch};

use crate::io::driver::{FromUpstream, ToUpstream};

/// Where and as whom the link connects.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// The upstream broker.
    pub broker: BrokerConfig,
    /// The global federation.
    pub federation: String,
    /// The site's client id upstream.
    pub site: String,
    /// The site's key upstream.
    pub key: Option<DeviceKey>,
    /// The backbone the site's devices run (shown in its status).
    pub backbone: String,
    /// Where the update waiting for the uplink is kept (`state_dir/upstream.bin`, private to
    /// its owner).
    pub pending_file: Option<PathBuf>,
    /// Where the last global task for the site is kept (`state_dir/global-task.bin`), so that
    /// a restarted site resumes its open round before its devices' queued updates arrive.
    pub task_file: Option<PathBuf>,
}

/// The global task a site kept, if the file holds one.
pub fn load_task(path: &std::path::Path) -> Option<fedge_wire::RoundTask> {
    match fedge_wire::decode(&std::fs::read(path).ok()?) {
        Ok(Message::RoundTask(task)) => Some(task),
        _ => None,
    }
}

/// What the link did, when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSummary {
    /// Global tasks handed to the site's rounds.
    pub tasks: u64,
    /// Updates sent upstream (a resend after a reconnect counts again).
    pub sent: u64,
    /// Updates dropped because their global round had closed.
    pub stale: u64,
}

/// The site's update waiting to be sent or for its round to close.
struct Pending {
    update: ClientUpdate,
    sent: bool,
}

/// The link's state between events.
struct Link {
    options: LinkOptions,
    topics: Topics,
    status: EdgeStatus,
    /// The newest global round whose task the link saw, and whether it names the site.
    global_round: Option<u64>,
    /// Whether the global coordinator aggregates buffered (its tasks have no deadline): an
    /// update for an earlier version still counts there, with its staleness.
    global_buffered: bool,
    pending: Option<Pending>,
    tasks: Reassembler,
    models: Reassembler,
    summary: LinkSummary,
}

/// Runs the link until `stop` turns true: tasks and releases go to `inbox`, the site's answers
/// come from `outbox`.
pub async fn run(
    options: LinkOptions,
    inbox: mpsc::UnboundedSender<FromUpstream>,
    mut outbox: mpsc::UnboundedReceiver<ToUpstream>,
    mut stop: watch::Receiver<bool>,
) -> Result<LinkSummary, fedge_wire::DecodeError> {
    let topics = Topics::new(&options.federation)?;
    let mut link = Link::new(options, topics);
    let (topic, will) = link.will();
    let will = LastWill::new(topic, will, QoS::AtLeastOnce, true);
    let client_id = format!("fedge-site-{}", link.options.site);
    let mut mqtt = link.options.broker.options(&client_id, Some(will));
    mqtt.set_clean_session(false);
    let mut session = Session::new(mqtt, REQUEST_QUEUE);
    let client = session.client().clone();
    let origin = Instant::now();
    let mut connected = false;
    loop {
        tokio::select! {
            event = session.next() => match event {
                SessionEvent::Connected => {
                    connected = true;
                    tracing::info!(site = %link.options.site, "site connected upstream");
                    for base in [link.topics.round_task(), link.topics.model_current()] {
                        for filter in [base.clone(), format!("{base}/+")] {
                            let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                        }
                    }
                    let _ = client.try_subscribe(link.topics.model_serving(), QoS::AtLeastOnce);
                    link.publish_status(&client, true);
                }
                SessionEvent::Publish(p) => {
                    let now = origin.elapsed().as_millis() as u64;
                    link.handle_publish(&client, &inbox, &p.topic, &p.payload, now);
                }
                SessionEvent::Other => {}
                // The back-off is waited out inside `session.next()`: the site's answers and a
                // stop are taken meanwhile.
                SessionEvent::Lost { error, was_connected, first } => {
                    if was_connected || first {
                        tracing::warn!(%error, "site lost the upstream broker; its update waits");
                    }
                    connected = false;
                }
            },
            answer = outbox.recv() => match answer {
                Some(answer) => link.handle_answer(&client, answer, connected),
                None => break,
            },
            _ = stop.changed() => break,
        }
    }
    link.publish_status(&client, false);
    let (client, events) = session.parts();
    fedge_mqtt::flush_and_disconnect(client, events, Duration::from_secs(2)).await;
    Ok(link.summary)
}

impl Link {
    fn new(options: LinkOptions, topics: Topics) -> Self {
        let pending = options.pending_file.as_deref().and_then(load_pending);
        if let Some(p) = &pending {
            tracing::info!(
                round = p.round,
                "the site's update for the global round waits to be sent"
            );
        }
        let status = EdgeStatus {
            client_id: options.site.clone(),
            online: true,
            profile: "site".into(),
            backbone: options.backbone.clone(),
            device: "site aggregator".into(),
            ..EdgeStatus::default()
        };
        Self {
            topics,
            status,
            global_round: None,
            global_buffered: false,
            pending: pending.map(|update| Pending {
                update,
                sent: false,
            }),
            tasks: Reassembler::new(
                fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
                fedge_wire::MAX_MESSAGE_BYTES,
            ),
            models: Reassembler::new(
                fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
                fedge_wire::MAX_MESSAGE_BYTES,
            ),
            summary: LinkSummary::default(),
            options,
        }
    }

    /// The status topic and the offline status the broker publishes if the site vanishes.
    fn will(&self) -> (String, String) {
        let topic = self.topics.edge_status(&self.options.site);
        (topic, self.status_json(false))
    }

    fn status_json(&self, online: bool) -> String {
        let mut status = EdgeStatus {
            online,
            updated_at: fedge_mqtt::now_rfc3339(),
            ..self.status.clone()
        };
        if let Some(key) = &self.options.key {
            status.sign(&self.options.federation, key);
        }
        serde_json::to_string(&status).unwrap_or_default()
    }

    fn publish_status(&self, client: &AsyncClient, online: bool) {
        let topic = self.topics.edge_status(&self.options.site);
        let _ = client.try_publish(topic, QoS::AtLeastOnce, true, self.status_json(online));
    }

    fn handle_publish(
        &mut self,
        client: &AsyncClient,
        inbox: &mpsc::UnboundedSender<FromUpstream>,
        topic: &str,
        payload: &[u8],
        now_ms: u64,
    ) {
        let site = self.options.site.clone();
        let key = self.options.key.clone();
        let (site, key) = (site.as_str(), key.as_ref());
        if under(topic, &self.topics.round_task()) {
            if payload.is_empty() {
                return;
            }
            match fedge_wire::decode_task(&mut self.tasks, payload, now_ms, site, key) {
                Ok(Some(task)) if task.federation != self.options.federation => {
                    // A task of another federation on this broker's topics (a replay, a
                    // misconfigured bridge): never relayed to the site's devices.
                    let error = format!(
                        "a round task of federation {:?} arrived where the global federation \
                         {:?} publishes; refused",
                        task.federation, self.options.federation
                    );
                    tracing::warn!("{error}");
                    self.status.last_error = error;
                    self.publish_status(client, true);
                }
                Ok(Some(task)) => {
                    self.global_round = Some(task.round);
                    self.global_buffered = task.deadline_ms == 0;
                    self.settle_pending(client, task.round);
                    if task.selected.iter().any(|c| c == site) {
                        self.summary.tasks += 1;
                        self.save_task(&task);
                        let _ = inbox.send(FromUpstream::Task(Box::new(task)));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "the global task for this site cannot be trusted");
                    self.status.last_error = e.to_string();
                    self.publish_status(client, true);
                }
            }
        } else if under(topic, &self.topics.model_current()) && !payload.is_empty() {
            match fedge_wire::decode_release(&mut self.models, payload, now_ms, site, key) {
                Ok(Some(release)) => {
                    let _ = inbox.send(FromUpstream::Release(Box::new(release)));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "the global model is refused"),
            }
        } else if topic == self.topics.model_serving() && !payload.is_empty() {
            // Which release the global federation serves: a rollback or a rollout reaches the
            // site's devices too (with a key, only a pointer sealed for the site is believed).
            match fedge_wire::decode_serving(payload, site, key) {
                Some(pointer) => {
                    let _ = inbox.send(FromUpstream::Serving(pointer));
                }
                None => tracing::warn!("the global serving pointer is refused"),
            }
        }
    }

    /// A global task of `round` arrived: the pending update goes now if it answers it, or is
    /// dropped as stale if the global federation moved past it.
    fn settle_pending(&mut self, client: &AsyncClient, round: u64) {
        let Some((answered, sent)) = self.pending.as_ref().map(|p| (p.update.round, p.sent)) else {
            return;
        };
        if answered == round || (answered < round && self.global_buffered) {
            // Buffered upstream: a late update is applied with its staleness, or refused
            // there as `stale` by name; it is sent once either way.
            if !sent {
                self.send(client);
            }
        } else if answered < round {
            if !sent {
                self.summary.stale += 1;
                self.status.last_error = format!(
                    "the site's update for round {answered} was dropped: the global round \
                     closed while the uplink was down"
                );
                tracing::warn!(round = answered, "the site's update is stale; dropped");
                self.publish_status(client, true);
            }
            self.pending = None;
            self.save_pending();
        }
    }

    fn handle_answer(&mut self, client: &AsyncClient, answer: ToUpstream, connected: bool) {
        match answer {
            ToUpstream::Update(update) => {
                self.status.samples = update.num_samples;
                self.pending = Some(Pending {
                    update: *update,
                    sent: false,
                });
                self.save_pending();
                let round = self.pending.as_ref().map(|p| p.update.round);
                if connected && (self.global_round == round || self.global_buffered) {
                    self.send(client);
                } else if connected && self.global_round > round {
                    // The global round closed before the site's did.
                    self.settle_pending(client, self.global_round.unwrap_or_default());
                }
            }
            ToUpstream::Refused { round, reason } => {
                self.status.last_error = format!("round {round}: {reason}");
                self.publish_status(client, true);
            }
            ToUpstream::Abandoned { round, reason } => {
                self.status.last_error = format!(
                    "round {round}: the site's round ended without an aggregate ({reason})"
                );
                self.publish_status(client, true);
            }
        }
    }

    /// Publishes the pending update, sealed and chunk-tagged with the site's key.
    fn send(&mut self, client: &AsyncClient) {
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        let site = self.options.site.as_str();
        let mut frame = fedge_wire::encode(&Message::ClientUpdate(pending.update.clone()));
        let signer = self.options.key.as_ref().map(|k| (site, k));
        if let Some(signer) = signer {
            frame = fedge_wire::seal(frame, &[signer]);
        }
        let topic = self.topics.update(site);
        let packet = (pending.update.seq, self.options.broker.max_packet);
        match fedge_mqtt::publish_frame(client, &topic, frame, packet, false, signer) {
            Ok(bytes) => {
                pending.sent = true;
                self.summary.sent += 1;
                self.status.last_round = pending.update.round;
                self.status.last_error.clear();
                tracing::info!(
                    round = pending.update.round,
                    bytes,
                    samples = pending.update.num_samples,
                    "site update sent upstream"
                );
                self.publish_status(client, true);
            }
            Err(e) => tracing::warn!(error = %e, "cannot send the site's update yet"),
        }
    }

    fn save_task(&self, task: &fedge_wire::RoundTask) {
        let Some(path) = &self.options.task_file else {
            return;
        };
        let frame = fedge_wire::encode(&Message::RoundTask(task.clone()));
        if let Err(e) =
            fedge_daemon::write_atomically(path, &frame, fedge_daemon::Visibility::Shared)
        {
            tracing::error!(path = %path.display(), error = %e, "the global task is not on disk");
        }
    }

    fn save_pending(&self) {
        let Some(path) = &self.options.pending_file else {
            return;
        };
        let result = match &self.pending {
            Some(p) => {
                // The site's aggregate of its devices' updates: private, as the coordinator's
                // journal of raw updates is.
                let frame = fedge_wire::encode(&Message::ClientUpdate(p.update.clone()));
                fedge_daemon::write_atomically(path, &frame, fedge_daemon::Visibility::Private)
            }
            None => match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        if let Err(e) = result {
            tracing::error!(path = %path.display(), error = %e, "the site's pending update is not on disk");
        }
    }
}

/// The update a site kept for the uplink, if the file holds one.
fn load_pending(path: &std::path::Path) -> Option<ClientUpdate> {
    let bytes = std::fs::read(path).ok()?;
    match fedge_wire::decode(&bytes) {
        Ok(Message::ClientUpdate(update)) => Some(update),
        _ => {
            tracing::warn!(path = %path.display(), "the site's pending update is damaged; ignored");
            None
        }
    }
}

/// Whether `topic` is `base` or one of its chunk topics `base/<i>`.
fn under(topic: &str, base: &str) -> bool {
    topic
        .strip_prefix(base)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &std::path::Path) -> LinkOptions {
        LinkOptions {
            broker: BrokerConfig::at("127.0.0.1", 1),
            federation: "demo".into(),
            site: "plant-7".into(),
            key: None,
            backbone: "b".into(),
            pending_file: Some(dir.join("upstream.bin")),
            task_file: Some(dir.join("global-task.bin")),
        }
    }

    /// A client whose requests queue up (no broker): what the link publishes is counted in its
    /// summary, not delivered.
    fn client() -> (AsyncClient, rumqttc::EventLoop) {
        AsyncClient::new(rumqttc::MqttOptions::new("t", "127.0.0.1", 1), 1024)
    }

    fn task_payload(round: u64) -> Vec<u8> {
        task_of("demo", round)
    }

    fn task_of(federation: &str, round: u64) -> Vec<u8> {
        fedge_wire::encode(&Message::RoundTask(fedge_wire::RoundTask {
            pooled: None,
            federation: federation.into(),
            run: 1,
            round,
            selected: vec!["plant-7".into()],
            classes: Vec::new(),
            params: fedge_wire::TensorF32::from_slice(&[0.0; 3]),
            train: fedge_wire::TrainParams::default(),
            deadline_ms: 1_000,
            insight: None,
            prototypes: None,
            backbone: None,
        }))
    }

    fn update(round: u64) -> ToUpstream {
        ToUpstream::Update(Box::new(ClientUpdate {
            features: None,
            run: 1,
            round,
            client_id: "plant-7".into(),
            seq: round,
            num_samples: 40,
            delta: fedge_wire::TensorF32::from_slice(&[0.5; 3]),
            metrics: fedge_wire::LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        }))
    }

    fn link(dir: &std::path::Path) -> Link {
        Link::new(options(dir), Topics::new("demo").unwrap())
    }

    fn task(link: &mut Link, client: &AsyncClient, round: u64) -> Vec<FromUpstream> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let topic = link.topics.round_task();
        link.handle_publish(client, &tx, &topic, &task_payload(round), 0);
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn an_update_for_the_open_round_goes_at_once_and_is_kept_until_the_round_moves_on() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut link = link(dir.path());
        assert_eq!(task(&mut link, &client, 3).len(), 1);
        assert!(load_task(&dir.path().join("global-task.bin")).is_some_and(|t| t.round == 3));
        link.handle_answer(&client, update(3), true);
        assert_eq!(link.summary.sent, 1);
        assert_eq!(link.status.last_round, 3);
        assert!(dir.path().join("upstream.bin").exists());
        // The same round's task again (a reconnect) sends nothing twice.
        task(&mut link, &client, 3);
        assert_eq!(link.summary.sent, 1);
        task(&mut link, &client, 4);
        assert!(!dir.path().join("upstream.bin").exists());
        assert_eq!((link.summary.sent, link.summary.stale), (1, 0));
    }

    #[cfg(unix)]
    #[test]
    fn the_pending_update_is_written_for_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut link = link(dir.path());
        task(&mut link, &client, 5);
        link.handle_answer(&client, update(5), false);
        let path = dir.path().join("upstream.bin");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    #[test]
    fn an_update_made_offline_survives_a_restart_and_goes_if_its_round_is_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut first = link(dir.path());
        task(&mut first, &client, 5);
        // The uplink is down when the site's round ends.
        first.handle_answer(&client, update(5), false);
        assert_eq!(first.summary.sent, 0);
        drop(first);
        // A restarted site finds it, and sends it when the global round 5 is still open.
        let mut again = link(dir.path());
        assert!(again.pending.as_ref().is_some_and(|p| p.update.round == 5));
        task(&mut again, &client, 5);
        assert_eq!(again.summary.sent, 1);
    }

    #[test]
    fn an_update_whose_global_round_closed_meanwhile_is_dropped_as_stale_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut link = link(dir.path());
        task(&mut link, &client, 5);
        link.handle_answer(&client, update(5), false);
        // Back online: the retained task is round 6 already.
        task(&mut link, &client, 6);
        assert_eq!((link.summary.sent, link.summary.stale), (0, 1));
        assert!(
            link.status.last_error.contains("round 5 was dropped"),
            "{}",
            link.status.last_error
        );
        assert!(!dir.path().join("upstream.bin").exists());
        // A site round that ends after the global one moved on is stale at once.
        link.handle_answer(&client, update(5), true);
        assert_eq!((link.summary.sent, link.summary.stale), (0, 2));
    }

    #[test]
    fn under_a_buffered_global_coordinator_a_late_update_still_goes_once() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut link = link(dir.path());
        let (tx, _rx) = mpsc::unbounded_channel();
        let topic = link.topics.round_task();
        let buffered = |round| {
            let Ok(Message::RoundTask(mut task)) = fedge_wire::decode(&task_payload(round)) else {
                unreachable!()
            };
            task.deadline_ms = 0;
            fedge_wire::encode(&Message::RoundTask(task))
        };
        link.handle_publish(&client, &tx, &topic, &buffered(5), 0);
        // The uplink was down for versions 6 and 7: the update goes when it is back, once.
        link.handle_answer(&client, update(5), false);
        link.handle_publish(&client, &tx, &topic, &buffered(7), 0);
        assert_eq!((link.summary.sent, link.summary.stale), (1, 0));
        link.handle_publish(&client, &tx, &topic, &buffered(8), 0);
        assert_eq!((link.summary.sent, link.summary.stale), (1, 0));
    }

    #[test]
    fn a_task_of_another_federation_is_never_relayed() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _events) = client();
        let mut link = link(dir.path());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let topic = link.topics.round_task();
        link.handle_publish(&client, &tx, &topic, &task_of("other", 3), 0);
        assert!(
            rx.try_recv().is_err(),
            "relayed a task of another federation"
        );
        assert!(
            link.status.last_error.contains("\"other\""),
            "{}",
            link.status.last_error
        );
        // The federation's own task still goes through.
        assert_eq!(task(&mut link, &client, 4).len(), 1);
    }
}
