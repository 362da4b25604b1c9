//! One simulated device of `fedge bench fleet`: its own MQTT connection with a Last Will, the
//! round task decoded as the agent decodes it, and an update of the right size (chunked when
//! large) after its "training" time, counted when the broker acknowledges every piece of it.
//!
//! With a [`FleetLoad`] the device takes its time (nominal, five or twenty times slower) and may
//! go away in random windows: it drops its connection without DISCONNECT (the broker fires its
//! Last Will), keeps training, and comes back on its persistent session, where the QoS 1
//! messages it missed wait; an update finished while away goes out then. A task naming it while
//! it trains is kept (the newest one) and trained next, as a device does in buffered mode.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fedge_device::machine::{Agent, Identity, Output as AgentOutput};
use fedge_device::state::RoundState;
use fedge_mqtt::BrokerConfig;
use fedge_wire::{
    ClientUpdate, Codec, DeviceKey, EdgeStatus, LocalMetrics, Message, Reassembler, TensorF32,
    Topics,
};
use rand::Rng;
use rand::rngs::StdRng;
use rumqttc::{AsyncClient, Event, LastWill, Outgoing, Packet, QoS};
use tokio::sync::{mpsc, watch};

use super::load::FleetLoad;

/// What the devices of a fleet did, summed over them.
#[derive(Debug, Default)]
pub struct Counters {
    /// Updates every piece of which the broker acknowledged.
    pub sent: Arc<AtomicU64>,
    /// Updates published whose acknowledgement never came (the connection broke first): they
    /// may or may not have reached the broker.
    pub unconfirmed: AtomicU64,
    /// Times a device went away (its connection dropped without DISCONNECT).
    pub absences: AtomicU64,
    /// Updates finished while their device was away, published when it came back.
    pub held: AtomicU64,
    /// Tasks a device took while it was training another (trained next).
    pub queued: AtomicU64,
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

/// A device's settings, shared by its connections.
pub struct Setup {
    /// Broker of the federation.
    pub broker: BrokerConfig,
    /// The federation's topics.
    pub topics: Topics,
    /// The device id.
    pub id: String,
    /// Its key, when the coordinator authenticates.
    pub key: Option<DeviceKey>,
    /// Its pace.
    pub load: FleetLoad,
    /// The fleet's counters.
    pub counters: Arc<Counters>,
    /// Where to say release switches, when the device follows releases.
    pub follow: Option<mpsc::UnboundedSender<Switch>>,
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
        runtime: "tract".into(),
        memory_budget_mb: 0,
        role: fedge_wire::Role::Train,
        classes: Vec::new(),
    };
    Agent::new(identity, RoundState::default()).ok()
}

/// A task the device took: what its update must carry.
#[derive(Debug, Clone, Copy)]
struct Job {
    run: u64,
    round: u64,
    params: usize,
    codec: Codec,
}

/// Aborts its task when dropped: the connection's event loop goes with the device.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One connection: its client, the events its loop forwards (none once it failed), and which
/// update each publish in flight belongs to.
struct Link {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<Event>,
    _pump: AbortOnDrop,
    up: bool,
    /// Per publish request not yet written, in order: the update's round, or none (a status).
    requested: VecDeque<Option<u64>>,
    /// Per packet id written and not yet acknowledged: the update's round, or none.
    written: BTreeMap<u16, Option<u64>>,
    /// Per update: its pieces not yet acknowledged.
    pieces: BTreeMap<u64, usize>,
}

/// The device's state between connections.
struct Device {
    setup: Setup,
    agent: Option<Agent>,
    reassembler: Reassembler,
    origin: Instant,
    backoff: fedge_mqtt::Backoff,
    /// The run and the newest round it took a task of.
    taken: (u64, u64),
    training: Option<(Job, tokio::time::Instant)>,
    next: Option<Job>,
    /// Finished while away, published on return.
    done: VecDeque<Job>,
    link: Option<Link>,
    away: Option<StdRng>,
    leave_at: Option<tokio::time::Instant>,
    back_at: Option<tokio::time::Instant>,
    /// Stopped: takes no more tasks.
    stopping: bool,
}

/// Sleeps until `at`, or forever.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next event of `link`; `None` once its connection failed; forever without a link.
async fn next_event(link: &mut Option<Link>) -> Option<Event> {
    match link {
        Some(link) => link.events.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves once `stop` says true (never if its sender is gone without saying it).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One simulated device's loop; returns once `stop` says so and its updates in flight are
/// acknowledged (or a few seconds passed), or when its task is aborted. With `follow`, it also
/// follows the releases and says each switch there.
pub async fn run(setup: Setup, mut stop: watch::Receiver<bool>) {
    let agent = (setup.follow.as_ref())
        .and_then(|_| follower(&setup.id, setup.topics.federation(), setup.key.as_ref()));
    let away = setup.load.absences(&setup.id);
    let mut device = Device {
        agent,
        reassembler: Reassembler::new(30_000, fedge_wire::MAX_MESSAGE_BYTES),
        origin: Instant::now(),
        backoff: fedge_mqtt::Backoff::default(),
        taken: (0, 0),
        training: None,
        next: None,
        done: VecDeque::new(),
        link: None,
        away,
        leave_at: None,
        back_at: None,
        stopping: false,
        setup,
    };
    if let Some(rng) = device.away.as_mut() {
        let unit = device.setup.load.unit_ms();
        let first = rng.random_range(0..120 * unit);
        device.leave_at = Some(tokio::time::Instant::now() + Duration::from_millis(first));
    }
    device.connect();
    loop {
        let trained = device.training.as_ref().map(|(_, at)| *at);
        let leave = device.leave_at.filter(|_| device.link.is_some());
        let back = device.back_at.filter(|_| device.link.is_none());
        tokio::select! {
            () = stopped(&mut stop) => break,
            event = next_event(&mut device.link) => match event {
                Some(event) => device.on_event(event),
                None => device.lost(),
            },
            () = until(trained) => device.trained(),
            () = until(leave) => device.leave(),
            () = until(back) => device.connect(),
        }
    }
    device.drain().await;
}

impl Device {
    /// Opens a connection (persistent session when the device goes away, so that what it
    /// missed waits for it).
    fn connect(&mut self) {
        self.back_at = None;
        let Setup {
            broker,
            topics,
            id,
            key,
            load,
            ..
        } = &self.setup;
        let will = LastWill::new(
            topics.edge_status(id),
            status(topics, id, false, key.as_ref()),
            QoS::AtLeastOnce,
            true,
        );
        let mut options = broker.options(&format!("fleet-{id}"), Some(will));
        options.set_keep_alive(Duration::from_secs(60));
        options.set_clean_session(!load.offline);
        let (client, mut eventloop) = AsyncClient::new(options, fedge_mqtt::REQUEST_QUEUE);
        let (tx, events) = mpsc::unbounded_channel();
        // The event loop in its own task (its poll is not cancel-safe); it stops at the first
        // error, and the device decides when to connect again.
        let pump = tokio::spawn(async move {
            while let Ok(event) = eventloop.poll().await {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        self.link = Some(Link {
            client,
            events,
            _pump: AbortOnDrop(pump),
            up: false,
            requested: VecDeque::new(),
            written: BTreeMap::new(),
            pieces: BTreeMap::new(),
        });
    }

    /// The connection failed: what was in flight is unconfirmed; connect again after a delay.
    fn lost(&mut self) {
        if let Some(link) = self.link.take() {
            let n = link.pieces.len() as u64;
            self.setup
                .counters
                .unconfirmed
                .fetch_add(n, Ordering::Relaxed);
        }
        let delay = self.backoff.next_delay();
        self.back_at = Some(tokio::time::Instant::now() + delay);
    }

    /// An absence begins: the connection is dropped without DISCONNECT, so the broker publishes
    /// the Last Will. Put off while an update awaits its acknowledgement.
    fn leave(&mut self) {
        let now = tokio::time::Instant::now();
        if self.link.as_ref().is_some_and(|l| !l.pieces.is_empty()) {
            self.leave_at = Some(now + Duration::from_millis(20));
            return;
        }
        let (Some(rng), unit) = (self.away.as_mut(), self.setup.load.unit_ms()) else {
            return;
        };
        let away = rng.random_range(10 * unit..60 * unit);
        let online = rng.random_range(20 * unit..120 * unit);
        self.link = None;
        self.setup.counters.absences.fetch_add(1, Ordering::Relaxed);
        let back = now + Duration::from_millis(away);
        self.back_at = Some(back);
        self.leave_at = Some(back + Duration::from_millis(online));
    }

    fn on_event(&mut self, event: Event) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let publish = match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                self.backoff.reset();
                link.up = true;
                let (topics, id) = (&self.setup.topics, &self.setup.id);
                let task_base = topics.round_task();
                let mut filters = vec![format!("{task_base}/+"), task_base];
                if self.agent.is_some() {
                    let model_base = topics.model_current();
                    filters.extend([format!("{model_base}/+"), model_base]);
                    filters.push(topics.model_serving());
                }
                for filter in filters {
                    let _ = link.client.try_subscribe(filter, QoS::AtLeastOnce);
                }
                let online = status(topics, id, true, self.setup.key.as_ref());
                let topic = topics.edge_status(id);
                if link
                    .client
                    .try_publish(topic, QoS::AtLeastOnce, true, online)
                    .is_ok()
                {
                    link.requested.push_back(None);
                }
                while let Some(job) = self.done.pop_front() {
                    self.publish(job);
                }
                return;
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                if let Some(update) = link.requested.pop_front() {
                    link.written.insert(pkid, update);
                }
                return;
            }
            Event::Incoming(Packet::PubAck(ack)) => {
                if let Some(Some(round)) = link.written.remove(&ack.pkid)
                    && let Some(left) = link.pieces.get_mut(&round)
                {
                    *left -= 1;
                    if *left == 0 {
                        link.pieces.remove(&round);
                        self.setup.counters.sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return;
            }
            Event::Incoming(Packet::Publish(p)) if !p.payload.is_empty() && !self.stopping => p,
            _ => return,
        };
        let now = self.origin.elapsed().as_millis() as u64;
        let topics = &self.setup.topics;
        if let (Some(agent), Some(follow)) = (self.agent.as_mut(), &self.setup.follow)
            && (publish.topic.starts_with(&topics.model_current())
                || publish.topic == topics.model_serving())
        {
            agent.handle_publish(&publish.topic, &publish.payload, now);
            while let Some(output) = agent.poll_output() {
                if let AgentOutput::Serve(release) = output {
                    let _ = follow.send(Switch {
                        device: self.setup.id.clone(),
                        sha256: release.sha256_hex(),
                        round: release.round,
                        at: Instant::now(),
                    });
                }
            }
            return;
        }
        // The agent's own task decoding: reassembly, tag check, kind.
        let (id, key) = (&self.setup.id, self.setup.key.as_ref());
        let task = fedge_device::decode_task(&mut self.reassembler, &publish.payload, now, id, key);
        let Ok(Some(task)) = task else {
            return;
        };
        // A task is taken once (it is retained and published again with more names), and a
        // newer run's numbering starts afresh.
        let (run, round) = self.taken;
        if (task.run == run && task.round <= round) || !task.selected.contains(id) {
            return;
        }
        self.taken = (task.run, task.round);
        let job = Job {
            run: task.run,
            round: task.round,
            params: task.params.len(),
            codec: task.train.update_codec,
        };
        if self.training.is_some() {
            // Busy: the newest task naming it is trained next.
            self.setup.counters.queued.fetch_add(1, Ordering::Relaxed);
            self.next = Some(job);
        } else {
            self.start(job);
        }
    }

    /// Trains `job`: answered at once without a training time, else when it is over.
    fn start(&mut self, job: Job) {
        let time = self.setup.load.train_time(&self.setup.id);
        if time.is_zero() {
            self.finished(job);
        } else {
            self.training = Some((job, tokio::time::Instant::now() + time));
        }
    }

    /// The training under way is over; the next task, if any, starts.
    fn trained(&mut self) {
        if let Some((job, _)) = self.training.take() {
            self.finished(job);
        }
        if let Some(job) = self.next.take() {
            self.start(job);
        }
    }

    /// An update is ready: published now, or on return when the device is away.
    fn finished(&mut self, job: Job) {
        if self.link.as_ref().is_some_and(|l| l.up) {
            self.publish(job);
        } else {
            self.setup.counters.held.fetch_add(1, Ordering::Relaxed);
            self.done.push_back(job);
        }
    }

    /// Publishes `job`'s update (a fixed pattern: the coordinator's cost is what is measured),
    /// sealed and chunked as a device sends it.
    fn publish(&mut self, job: Job) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let Setup {
            broker,
            topics,
            id,
            key,
            ..
        } = &self.setup;
        let delta: Vec<f32> = (0..job.params)
            .map(|i| 1e-3 * ((i % 7) as f32 - 3.0))
            .collect();
        let mut frame = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
            features: None,
            run: job.run,
            round: job.round,
            client_id: id.clone(),
            seq: job.round,
            num_samples: 10,
            delta: TensorF32::from_slice_with(&delta, job.codec),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        }));
        if let Some(key) = key {
            frame = fedge_wire::seal(frame, &[(id.as_str(), key)]);
        }
        let signer = key.as_ref().map(|k| (id.as_str(), k));
        let pieces =
            fedge_wire::split_into_tagged_chunks(frame, job.round, broker.max_packet, signer);
        let topic = topics.update(id);
        let mut written = 0;
        for piece in pieces {
            if link
                .client
                .try_publish(&topic, QoS::AtLeastOnce, false, piece)
                .is_err()
            {
                break;
            }
            link.requested.push_back(Some(job.round));
            written += 1;
        }
        if written > 0 {
            link.pieces.insert(job.round, written);
        }
    }

    /// After the stop: lets the updates in flight be acknowledged (at most 5 s), then
    /// disconnects cleanly (no Last Will: the fleet stops, its devices do not vanish); what is
    /// still unacknowledged counts as unconfirmed.
    async fn drain(&mut self) {
        self.stopping = true;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.link.as_ref().is_some_and(|l| !l.pieces.is_empty()) {
            match tokio::time::timeout_at(deadline, next_event(&mut self.link)).await {
                Ok(Some(event)) => self.on_event(event),
                Ok(None) | Err(_) => break,
            }
        }
        if let Some(link) = self.link.as_mut()
            && link.up
            && link.pieces.is_empty()
            && link.client.try_disconnect().is_ok()
        {
            // The event loop ends once the DISCONNECT is out.
            let closed = tokio::time::Instant::now() + Duration::from_secs(1);
            while let Ok(Some(_)) = tokio::time::timeout_at(closed, link.events.recv()).await {}
        }
        if let Some(link) = self.link.take() {
            let n = link.pieces.len() as u64;
            self.setup
                .counters
                .unconfirmed
                .fetch_add(n, Ordering::Relaxed);
        }
    }
}
