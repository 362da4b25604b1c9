//! The simulation: nodes, the broker, the event queue and the virtual clock.
//!
//! A step takes the earliest thing due — a delivery, a training result, a scheduled action, or
//! a coordinator's timeout — advances the clock to it, feeds it to its machine and carries out
//! everything the machines then ask (publish, subscribe, train, save). Trainings asked for at
//! one instant run together (in parallel threads) once that instant has no more events, and
//! their results come back in client order after the device's virtual training time, so a
//! seed gives the same run bit for bit whatever the threads do.

use std::collections::BTreeMap;
use std::sync::Arc;

use fedge_coordinator::{Rejection, RoundReport};
use fedge_device::Trained;
use fedge_device::train::{LocalState, Trainer, run_round};
use fedge_models::{Backend, training_device};
use fedge_wire::RoundTask;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::broker::{Broker, Message, NodeId};
use crate::coordinator::{CoordinatorNode, CoordinatorSpec};
use crate::device::{DeviceNode, DeviceSpec};
use crate::error::SimError;
use crate::faults::{Network, Rule, deliveries};

/// Something scheduled to happen to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The node loses the broker (a device's Last Will is published).
    Disconnect(NodeId),
    /// The node connects again: it subscribes and gets what waited for it.
    Connect(NodeId),
    /// The coordinator process dies: its machine is gone, its state folder stays.
    Crash(usize),
    /// The coordinator starts again from its checkpoint and journal, and connects.
    Restart(usize),
    /// The device restarts from its saved round state (the trainer's memory is lost).
    RestartDevice(usize),
}

/// What the simulation shows as it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// A coordinator's round ended; `params` is its global model afterwards.
    RoundEnded {
        /// Which coordinator.
        coordinator: usize,
        /// The round's report.
        report: Box<RoundReport>,
        /// The model after the round.
        params: Vec<f32>,
    },
    /// A coordinator rejected something.
    Rejected {
        /// Which coordinator.
        coordinator: usize,
        /// The client named by the topic.
        client: String,
        /// Why.
        reason: Rejection,
        /// The log line's detail.
        detail: String,
    },
    /// A site aggregator could not answer a global task.
    Refused {
        /// Which coordinator.
        coordinator: usize,
        /// The global round.
        round: u64,
        /// Why.
        reason: String,
    },
    /// A coordinator finished its rounds.
    Finished {
        /// Which coordinator.
        coordinator: usize,
    },
    /// A device trained a round (whether its update then left or not).
    Trained {
        /// Which device.
        device: usize,
        /// The round.
        round: u64,
        /// Wall seconds the training took.
        seconds: f32,
    },
}

enum Event {
    Deliver {
        to: NodeId,
        message: Message,
    },
    Trained {
        device: usize,
        life: u64,
        trained: Box<Trained>,
    },
    Do(Action),
}

/// The simulation.
pub struct Sim {
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    pub(crate) broker: Broker,
    network: Network,
    rules: Vec<Rule>,
    rng: StdRng,
    pub(crate) coordinators: Vec<CoordinatorNode>,
    pub(crate) devices: Vec<DeviceNode>,
    pending: Vec<(usize, Box<RoundTask>)>,
    observed: Vec<Observed>,
    threads: usize,
}

impl Sim {
    /// An empty simulation at time 0 whose network draws come from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            broker: Broker::default(),
            network: Network::default(),
            rules: Vec::new(),
            rng: StdRng::seed_from_u64(seed ^ 0x5349_4d55_4c41_5445),
            coordinators: Vec::new(),
            devices: Vec::new(),
            pending: Vec::new(),
            observed: Vec::new(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// The same, with `network`'s latency and random faults.
    pub fn with_network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    /// Trains at most `threads` selected devices at once (the results do not depend on it).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Adds a targeted fault.
    pub fn add_rule(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// The virtual time in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.now
    }

    /// Starts a coordinator now and connects it; returns its index (the global one first).
    pub fn add_coordinator(&mut self, spec: CoordinatorSpec) -> Result<usize, SimError> {
        let mut node = CoordinatorNode::new(spec)?;
        node.boot(self.now, &mut self.rng)?;
        self.coordinators.push(node);
        let c = self.coordinators.len() - 1;
        self.connect(NodeId::Coordinator(c));
        Ok(c)
    }

    /// Starts a device now and connects it; returns its index.
    pub fn add_device(&mut self, spec: DeviceSpec) -> Result<usize, SimError> {
        let node = DeviceNode::new(spec, Default::default())?;
        self.devices.push(node);
        let d = self.devices.len() - 1;
        self.connect(NodeId::Device(d));
        Ok(d)
    }

    /// Schedules `action` at `at_ms` (now if earlier).
    pub fn schedule(&mut self, at_ms: u64, action: Action) {
        self.push(at_ms.max(self.now), Event::Do(action));
    }

    /// Publishes `payload` on `topic` as an outsider would (a stale task replayed, a forged
    /// update): delivered to the subscribers after the network's latency.
    pub fn inject(&mut self, topic: &str, payload: Vec<u8>, retain: bool) {
        self.route(topic, Arc::from(payload), retain);
    }

    /// Whether something happened since the last [`Sim::take_observed`].
    pub fn has_observed(&self) -> bool {
        !self.observed.is_empty()
    }

    /// What happened since the last call.
    pub fn take_observed(&mut self) -> Vec<Observed> {
        std::mem::take(&mut self.observed)
    }

    /// A coordinator's machine (none while crashed).
    pub fn coordinator(&self, c: usize) -> Option<&fedge_coordinator::Rounds> {
        self.coordinators[c].rounds.as_ref()
    }

    /// Whether a coordinator finished its rounds.
    pub fn finished(&self, c: usize) -> bool {
        self.coordinators[c].finished
    }

    /// A device's agent machine.
    pub fn agent(&self, d: usize) -> &fedge_device::Agent {
        &self.devices[d].agent
    }

    /// The rounds whose update a device published, in order.
    pub fn rounds_sent(&self, d: usize) -> &[u64] {
        &self.devices[d].trained
    }

    /// The release a device serves (the newest, or the one the serving pointer names).
    pub fn device_release(&self, d: usize) -> Option<&fedge_wire::ModelRelease> {
        self.devices[d].release.as_ref()
    }

    /// The retained message on `topic`, as a new subscriber would get it.
    pub fn retained(&self, topic: &str) -> Option<&[u8]> {
        self.broker.retained(topic).map(|p| &p[..])
    }

    /// Runs until `done` says so, nothing is left to do, or the clock would pass `limit_ms`;
    /// returns whether `done` said so.
    pub fn run_until(&mut self, limit_ms: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.next_due() {
                Some(at) if at <= limit_ms => self.step(),
                _ => return false,
            }
        }
    }

    /// Runs until coordinator `c` finished (see [`Sim::run_until`]).
    pub fn run_to_finish(&mut self, c: usize, limit_ms: u64) -> bool {
        self.run_until(limit_ms, |sim| sim.finished(c))
    }

    /// When the next thing is due: trainings waiting for this instant to end run first.
    fn next_due(&self) -> Option<u64> {
        if !self.pending.is_empty() {
            return Some(self.now);
        }
        let event = self.events.keys().next().map(|(at, _)| *at);
        let timeout = self.next_timeout().map(|(at, _)| at);
        match (event, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn next_timeout(&self) -> Option<(u64, usize)> {
        (self.coordinators.iter().enumerate())
            .filter_map(|(c, node)| Some((node.rounds.as_ref()?.poll_timeout()?, c)))
            .min()
    }

    /// Takes the earliest thing due.
    fn step(&mut self) {
        let event_at = self.events.keys().next().map(|(at, _)| *at);
        if !self.pending.is_empty() && event_at.is_none_or(|at| at > self.now) {
            self.train_pending();
            return;
        }
        let timeout = self.next_timeout();
        match (event_at, timeout) {
            (Some(at), Some((due, c))) if due < at => self.timeout(c, due),
            (None, Some((due, c))) => self.timeout(c, due),
            (Some(_), _) => {
                let Some(((at, _), event)) = self.events.pop_first() else {
                    return;
                };
                self.now = self.now.max(at);
                self.handle(event);
            }
            (None, None) => {}
        }
    }

    fn timeout(&mut self, c: usize, due: u64) {
        self.now = self.now.max(due);
        if let Some(rounds) = self.coordinators[c].rounds.as_mut() {
            rounds.handle_timeout(self.now);
        }
        self.drain_coordinator(c);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { to, message } => self.deliver(to, message),
            Event::Trained {
                device,
                life,
                trained,
            } => {
                let node = &mut self.devices[device];
                if node.life != life {
                    return;
                }
                self.observed.push(Observed::Trained {
                    device,
                    round: trained.round,
                    seconds: trained.seconds,
                });
                node.agent.handle_trained(*trained);
                self.drain_device(device);
            }
            Event::Do(action) => self.act(action),
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Disconnect(node) => self.disconnect(node),
            Action::Connect(node) => self.connect(node),
            Action::Crash(c) => {
                self.disconnect(NodeId::Coordinator(c));
                self.coordinators[c].rounds = None;
            }
            Action::Restart(c) => {
                let now = self.now;
                if let Err(e) = self.coordinators[c].boot(now, &mut self.rng) {
                    tracing::error!(coordinator = c, error = %e, "the simulated coordinator cannot restart");
                    return;
                }
                self.connect(NodeId::Coordinator(c));
            }
            Action::RestartDevice(d) => {
                self.disconnect(NodeId::Device(d));
                if let Err(e) = self.devices[d].restart() {
                    tracing::error!(device = d, error = %e, "the simulated device cannot restart");
                    return;
                }
                self.connect(NodeId::Device(d));
            }
        }
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    /// Publishes from the broker's side: retained kept, each subscriber's copies scheduled
    /// through the network's faults.
    pub(crate) fn route(&mut self, topic: &str, payload: Arc<[u8]>, retain: bool) {
        if retain {
            self.broker.retain(topic, &payload);
        }
        for to in self.broker.subscribers(topic) {
            self.send(to, topic, &payload);
        }
    }

    fn send(&mut self, to: NodeId, topic: &str, payload: &Arc<[u8]>) {
        for delay in deliveries(&self.network, &mut self.rules, &mut self.rng, topic) {
            let message = Message {
                topic: topic.to_owned(),
                payload: Arc::clone(payload),
            };
            self.push(self.now + delay, Event::Deliver { to, message });
        }
    }

    /// A node publishes: through the broker when it is connected, else into its client's queue.
    pub(crate) fn publish(&mut self, from: NodeId, topic: String, payload: Vec<u8>, retain: bool) {
        let payload: Arc<[u8]> = Arc::from(payload);
        if let NodeId::Device(d) = from
            && !self.devices[d].online
        {
            let message = Message { topic, payload };
            self.devices[d].outbox.push((message, retain));
            return;
        }
        self.route(&topic, payload, retain);
    }

    /// A node subscribes: the retained messages it matches are delivered to it.
    pub(crate) fn subscribe(&mut self, node: NodeId, filter: &str) {
        for message in self.broker.subscribe(node, filter) {
            self.send(node, &message.topic, &message.payload);
        }
    }

    fn deliver(&mut self, to: NodeId, message: Message) {
        match to {
            NodeId::Device(d) if !self.devices[d].online => self.devices[d].inbox.push(message),
            NodeId::Coordinator(c) if !self.coordinators[c].online => {
                self.coordinators[c].inbox.push(message)
            }
            NodeId::Device(d) => {
                let now = self.now;
                let node = &mut self.devices[d];
                node.agent
                    .handle_publish(&message.topic, &message.payload, now);
                self.drain_device(d);
            }
            NodeId::Coordinator(c) => {
                self.coordinator_receives(c, &message);
                self.drain_coordinator(c);
            }
        }
    }

    fn connect(&mut self, node: NodeId) {
        let waiting = match node {
            NodeId::Device(d) => {
                let device = &mut self.devices[d];
                if device.online {
                    return;
                }
                device.online = true;
                device.agent.handle_connected();
                self.drain_device(d);
                let device = &mut self.devices[d];
                for (message, retain) in std::mem::take(&mut device.outbox) {
                    self.route(&message.topic, message.payload, retain);
                }
                std::mem::take(&mut self.devices[d].inbox)
            }
            NodeId::Coordinator(c) => {
                if self.coordinators[c].online || self.coordinators[c].rounds.is_none() {
                    return;
                }
                self.coordinators[c].online = true;
                self.coordinator_connected(c);
                std::mem::take(&mut self.coordinators[c].inbox)
            }
        };
        for message in waiting {
            let latency = self.network.latency_ms;
            self.push(self.now + latency, Event::Deliver { to: node, message });
        }
    }

    fn disconnect(&mut self, node: NodeId) {
        match node {
            NodeId::Device(d) => {
                if !self.devices[d].online {
                    return;
                }
                self.devices[d].online = false;
                // The broker publishes the device's Last Will.
                let (topic, will) = self.devices[d].agent.last_will();
                let will = self.devices[d].spec.status_json(&will, self.now);
                self.route(&topic, Arc::from(will.into_bytes()), true);
            }
            NodeId::Coordinator(c) => self.coordinators[c].online = false,
        }
    }

    /// Runs the trainings asked for at this instant, in parallel, and schedules their results
    /// in client order.
    fn train_pending(&mut self) {
        let mut jobs = std::mem::take(&mut self.pending);
        jobs.sort_by(|a, b| {
            let id = |d: usize| self.devices[d].spec.client_id.as_str();
            id(a.0).cmp(id(b.0))
        });
        let mut work: Vec<(usize, Box<RoundTask>, LocalState)> = jobs
            .into_iter()
            .map(|(d, task)| (d, task, std::mem::take(&mut self.devices[d].local)))
            .collect();
        let specs: Vec<&DeviceSpec> = self.devices.iter().map(|n| &n.spec).collect();
        let per_thread = work.len().div_ceil(self.threads).max(1);
        let results: Vec<Trained> = std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .chunks_mut(per_thread)
                .map(|chunk| {
                    let specs = &specs;
                    scope.spawn(move || {
                        let device = training_device(Backend::default());
                        (chunk.iter_mut())
                            .map(|(d, task, state)| train_one(specs[*d], task, &device, state))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            (handles.into_iter())
                .flat_map(|h| h.join().expect("a simulated training thread panicked"))
                .collect()
        });
        for ((d, _, state), trained) in work.into_iter().zip(results) {
            let node = &mut self.devices[d];
            node.local = state;
            let (life, at) = (node.life, self.now + node.spec.train_ms);
            let trained = Box::new(trained);
            self.push(
                at,
                Event::Trained {
                    device: d,
                    life,
                    trained,
                },
            );
        }
    }

    pub(crate) fn queue_training(&mut self, d: usize, task: Box<RoundTask>) {
        self.pending.push((d, task));
    }

    pub(crate) fn observe(&mut self, observed: Observed) {
        self.observed.push(observed);
    }

    pub(crate) fn now(&self) -> u64 {
        self.now
    }
}

/// One device's round, as the agent's driver runs it on its training thread.
fn train_one(
    spec: &DeviceSpec,
    task: &RoundTask,
    device: &fedge_models::Device,
    state: &mut LocalState,
) -> Trained {
    let trainer = Trainer {
        head: &spec.head,
        device,
        seed: spec.seed,
        client_id: &spec.client_id,
        threads: 1,
        cancel: None,
        tail: spec.tail.as_deref(),
    };
    let start = std::time::Instant::now();
    let outcome = run_round(&spec.data, task, &trainer, state);
    Trained::of_round(task.round, outcome, start.elapsed().as_secs_f32(), None)
}
