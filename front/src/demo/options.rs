//! The settings of a demo run.

use fedge_coordinator::strategy::StrategyConfig;
use fedge_models::Backend;
use fedge_mqtt::BrokerConfig;
use fedge_wire::TrainParams;

/// Settings of a demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Rounds to aggregate.
    pub rounds: u64,
    /// Edge agents (source domains are shared round-robin when there are more agents).
    pub clients: usize,
    /// Server strategy and its parameters.
    pub strategy: StrategyConfig,
    /// Local training.
    pub train: TrainParams,
    /// Seed for data split, initialisation and sampling.
    pub seed: u64,
    /// Burn backend of the agents.
    pub backend: Backend,
    /// Projector width.
    pub hidden: usize,
    /// An external broker; `None` starts the embedded one on a free loopback port.
    pub broker: Option<BrokerConfig>,
    /// Largest MQTT payload; larger messages are chunked.
    pub max_packet: usize,
    /// Seconds a round stays open.
    pub round_timeout_s: f64,
    /// Federation name (topic root).
    pub federation: String,
    /// FedDIM's server momentum `m` (used when the objective is `FedDim`).
    pub insight_momentum: f32,
    /// Clients sampled per round; `None` selects them all.
    pub per_round: Option<usize>,
    /// Authenticate: a random key per agent, known to the coordinator.
    pub auth: bool,
    /// Announce Home Assistant sensors.
    pub home_assistant: bool,
    /// Attacks a hostile participant runs every round (none when empty).
    pub attack: Vec<crate::attack::AttackKind>,
    /// Packets per second per attack.
    pub attack_rate: f64,
    /// Under attack, leave device keys off (unless `auth`). By default attacks turn keys on,
    /// and the attacking devices that take part in rounds get keys of their own (compromised
    /// devices): without keys, a status or an update in a device's name cannot be told from
    /// the device's own.
    pub attack_keyless: bool,
    /// Sites (0: none): each its own embedded broker and site aggregator, with the devices of
    /// one source domain; the global coordinator's clients are the sites.
    pub sites: usize,
    /// Central DP-FedAvg (`--dp-noise`, `--dp-clip`): the coordinator's `[privacy]`.
    pub privacy: Option<fedge_coordinator::config::PrivacySettings>,
    /// Synchronous rounds or buffered aggregation (`--mode`, `--buffer-size`).
    pub aggregation: fedge_coordinator::buffer::AggregationConfig,
    /// The straggler mix (`--stragglers`): the last tenth of the agents train twenty times
    /// slower, the fifth before them five times slower.
    pub stragglers: bool,
}

impl DemoOptions {
    /// How many times slower agent `i` of `n` trains: 20 for the last ⌈n/10⌉, 5 for the
    /// ⌈n/5⌉ before them, 1 for the others (1 for all without `stragglers`).
    pub fn slowdown(&self, i: usize, n: usize) -> f32 {
        let (slowest, slow) = (n.div_ceil(10), n.div_ceil(5));
        match self.stragglers {
            true if i + slowest >= n => 20.0,
            true if i + slowest + slow >= n => 5.0,
            _ => 1.0,
        }
    }
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            rounds: 20,
            clients: 5,
            strategy: StrategyConfig::default(),
            train: TrainParams {
                local_epochs: 5,
                ..TrainParams::default()
            },
            seed: 0,
            backend: Backend::default(),
            hidden: 64,
            broker: None,
            max_packet: fedge_wire::DEFAULT_MAX_PACKET,
            round_timeout_s: 30.0,
            federation: "demo".into(),
            insight_momentum: 0.5,
            per_round: None,
            auth: false,
            home_assistant: false,
            attack: Vec::new(),
            attack_rate: crate::attack::DEFAULT_RATE,
            attack_keyless: false,
            sites: 0,
            privacy: None,
            aggregation: Default::default(),
            stragglers: false,
        }
    }
}
