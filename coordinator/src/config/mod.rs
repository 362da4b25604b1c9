//! The coordinator's configuration file. Relative paths in it (`state_dir`, `initial_params`,
//! `[auth] keys_file`) are resolved against the file's folder.
//!
//! ```toml
//! federation = "plant-7"
//! strategy = "fedavg"        # fedavg, fedavgm or fedomg
//! kappa = 0.5                 # fedomg
//! global_lr = 1.0             # fedomg, in FedAvg units
//! solver = "reference"        # fedomg: reference (the authors' 20 steps) or converged
//! server_momentum = 0.0       # β of server momentum around any strategy; 0 = off
//! server_learning_rate = 1.0
//! rounds = 50
//! fraction = 1.0
//! min_clients = 3
//! min_updates = 2
//! round_timeout_s = 120
//! seed = 0
//! embedded_broker = false      # true: run rumqttd in process on [broker].host:port
//! initial_params = "head.f32"  # optional: little-endian f32 file; else a seeded init
//! state_dir = "state"          # optional: checkpoint after every round, resumed at start
//! audit = true                 # with state_dir: the hash-chained audit trail, audit.jsonl
//! update_memory_mb = 1024      # deltas held per round in RAM (N·M·2 bytes in f16, ·4 in f32)
//! spill_dir = "spill"           # optional: beyond that, a memory-mapped file here
//! spill_max_mb = 16384          # the spill file's (sparse) size
//! max_update_norm = 0.0        # reject deltas longer than this on arrival; 0 = off
//! max_norm_ratio = 10.0        # scale down deltas longer than this × the others' median norm
//! max_weight_ratio = 10.0      # cut sample counts above this × the round's lower median
//! max_missed_rounds = 3        # a device failing this many rounds in a row rests; 0 = off
//! robust = "none"              # clip, trimmed-mean or median around the strategy
//! home_assistant = false       # announce sensors through Home Assistant MQTT discovery
//! metrics_listen = "127.0.0.1:9464"  # optional: metrics for Prometheus on /metrics
//! clip_norm = 0.0              # clip: bound, 0 = the round's median norm
//! trim_fraction = 0.1          # trimmed-mean: fraction pulled in at each end
//!
//! [broker]
//! host = "127.0.0.1"
//! port = 1883
//!
//! [head]
//! features = 512
//! hidden = 64
//! classes = 10
//! # [head.tail]               # optional: the backbone's last block, trained with the head
//! # input = [16, 4, 4]        # (`fedge-edge check` of a `train_tail` profile prints it)
//! # channels = 32
//! # kernel = [3, 3]
//! # stride = [1, 1]
//! # padding = [1, 1, 1, 1]
//! # activation = "relu"       # "none", "relu", "relu6"
//! # pooling = "flatten"       # "global-average", "flatten"
//!
//! [train]
//! objective = "cross-entropy"  # "fedprox", "feddim" (see [feddim]), "stable-fedadg", "fedddl"
//! local_epochs = 1
//! batch_size = 32
//! learning_rate = 0.05
//! momentum = 0.9
//! weight_decay = 0.0005
//! prox_mu = 0.01
//! update_codec = "f16"         # how devices pack updates: "f32" (lossless), "f16", "int8"
//!
//! [feddim]
//! lambda = 0.01                # weight of the insight term
//! momentum = 0.5               # Ī ← (1 − m) Ī + m Ī_round
//!
//! [auth]
//! keys_file = "devices.toml"   # optional: device keys; every update must be tagged
//! operator_key_file = "operator.key"  # optional: takes `fedge-coordinator ctl` commands
//!
//! [privacy]
//! mode = "off"                 # "central": DP-FedAvg with an accountant (see [`privacy`])
//! ```
//!
//! `role = "site"` and a `[site]` section make the coordinator a site aggregator ([`site`]).

mod aggregation;
pub use aggregation::{Combined, check as check_aggregation};
mod error;
mod privacy;
mod protocol;
mod sections;
mod site;
mod unknown;

pub use error::{ConfigError, InvalidConfig};
pub use privacy::{InvalidPrivacy, PrivacySettings};
pub use protocol::{PreviousProtocol, ProtocolSettings};
pub use sections::{AuthSettings, FedDimSettings, ModelSettings};
pub use site::{InvalidSite, Role, SiteSettings};
pub use unknown::{Hint, UnknownKey};

use std::path::{Path, PathBuf};

use fedge_mqtt::BrokerConfig;
use fedge_wire::{HeadConfig, TrainParams};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::round::RoundConfig;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Federation name: a level of every MQTT topic (`fedge/<federation>/…`), 1 to 64 bytes
    /// without `/`, `+`, `#` or NUL. The devices' profiles name the same.
    pub federation: String,
    /// The federation's coordinator, or a site's aggregator (then `[site]` says which).
    #[serde(default)]
    pub role: Role,
    /// A site aggregator's link to the global federation (docs/sites.md): needed with
    /// `role = "site"`, refused with the other role.
    #[serde(default)]
    pub site: Option<SiteSettings>,
    /// Server strategy and its parameters (`strategy`, `kappa`, `global_lr`,
    /// `server_momentum`, `server_learning_rate`).
    #[serde(flatten)]
    pub strategy: crate::strategy::StrategyConfig,
    /// Rounds to aggregate; 0 runs until stopped. A site aggregator runs until stopped
    /// whatever this says.
    #[serde(default = "default_rounds")]
    pub rounds: u64,
    /// Fraction of the online devices each round selects (rounded up), in (0, 1], and at least
    /// `min_clients` of them; under central DP with `[privacy] sampling = "poisson"`, each
    /// device's probability of selection instead.
    #[serde(default = "default_fraction")]
    pub fraction: f32,
    /// Devices needed online before a round opens, and the fewest a round selects.
    #[serde(default = "one")]
    pub min_clients: usize,
    /// Updates a round needs by its deadline to be aggregated: the quorum. At most
    /// `min_clients` (or 1 when that is 0), which a round may select alone.
    #[serde(default = "one")]
    pub min_updates: usize,
    /// Seconds a round stays open at most, from 0.1 to 604800 (7 days).
    #[serde(default = "default_timeout")]
    pub round_timeout_s: f64,
    /// Seed of the devices' selection and of the initial head (without `initial_params`).
    #[serde(default)]
    pub seed: u64,
    /// Run a broker (rumqttd) in process on `[broker] host` and `port` instead of connecting to
    /// one. It has no authentication or TLS, so `host` must be a loopback address.
    #[serde(default)]
    pub embedded_broker: bool,
    /// File of the starting head (raw little-endian f32 values in the flat layout), relative to
    /// this file; unset: a head initialised from `seed`.
    #[serde(default)]
    pub initial_params: Option<PathBuf>,
    /// Directory of the checkpoint (`checkpoint.bin`: head, round, server momentum), written
    /// after every aggregation and resumed from at start, relative to this file; unset: no
    /// state is kept.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Stay up when the rounds are done, as a service: the status says `finished` until an
    /// operator starts another run (`fedge-coordinator ctl new-run N`, which needs
    /// `[auth] operator_key_file`). Off: the coordinator exits when its rounds are done.
    #[serde(default)]
    pub stay_up: bool,
    /// Keep the audit trail, `state_dir/audit.jsonl`: hash-chained JSON lines of runs,
    /// releases and the devices that built them, operator commands, enrolments, revocations,
    /// backbone publishes and privacy steps (`fedge-coordinator audit verify` and `audit
    /// show`). Needs `state_dir`.
    #[serde(default = "protocol::yes")]
    pub audit: bool,
    /// Most MiB of deltas one round holds in RAM (N·M·2 bytes for N f16 updates of M
    /// parameters, N·M·4 in f32 or int8). A round whose selected clients need more goes to
    /// the spill file when `spill_dir` is set; otherwise later updates are rejected with
    /// reason `memory_budget`. At least 1.
    #[serde(default = "default_update_memory_mb")]
    pub update_memory_mb: usize,
    /// Folder of the spill file: an unnamed, sparse, memory-mapped file that holds a round's
    /// deltas when they outgrow `update_memory_mb` (the kernel pages them out under memory
    /// pressure), relative to this file. Unset: no spilling.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Size of the spill file's mapping in MiB (sparse: only written pages take disk space).
    #[serde(default = "default_spill_max_mb")]
    pub spill_max_mb: usize,
    /// L2 norm above which an update's delta is rejected on arrival (reason `norm`), ≥ 0;
    /// 0: no bound. Must be 0 with `[privacy] mode = "central"`.
    #[serde(default)]
    pub max_update_norm: f64,
    /// At the round's end, deltas longer than this multiple of the median norm of the round's
    /// other updates are scaled down to it (with 2 or more updates), ≥ 0; 0: off.
    #[serde(default = "default_norm_ratio")]
    pub max_norm_ratio: f64,
    /// Sample counts above this multiple of the round's lower median count are cut down to it
    /// before aggregation, ≥ 0; 0: off.
    #[serde(default = "default_weight_ratio")]
    pub max_weight_ratio: f64,
    /// A device that fails this many selected rounds in a row rests (selected for no round)
    /// until it reports healthy or its rest ends (twice `round_timeout_s`, doubled at each
    /// failed try); 0: off.
    #[serde(default = "default_max_missed_rounds")]
    pub max_missed_rounds: u32,
    /// Announce Home Assistant sensors (MQTT discovery under `homeassistant/`).
    #[serde(default)]
    pub home_assistant: bool,
    /// Serve metrics for Prometheus (OpenMetrics text on `GET /metrics`) at this address, e.g.
    /// `"127.0.0.1:9464"` (`host:port`; a host name is resolved at load); none when unset.
    /// docs/prometheus.md lists them.
    #[serde(
        default,
        deserialize_with = "fedge_daemon::metrics::deserialize_listen"
    )]
    #[schemars(with = "Option<String>")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The MQTT broker the coordinator connects to, or runs with `embedded_broker = true`.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// The sizes of the head the federation trains: `features` is the backbone's feature size,
    /// `hidden` the devices' `hidden`.
    pub head: HeadConfig,
    /// What the federation's model is for: its class names and backbone.
    #[serde(default)]
    pub model: ModelSettings,
    /// How devices train, sent with every round task. Every value is checked at load against
    /// the range its description gives.
    #[serde(default)]
    pub train: TrainParams,
    /// FedDIM settings, used when `[train] objective = "feddim"`.
    #[serde(default)]
    pub feddim: FedDimSettings,
    /// Device keys and the operator's key. Without `keys_file`, any device on the broker takes
    /// part and nothing is authenticated.
    #[serde(default)]
    pub auth: AuthSettings,
    /// The rolling-upgrade window: when devices of the previous protocol version take part.
    #[serde(default)]
    pub protocol: ProtocolSettings,
    /// Differential privacy: off, or central DP-FedAvg with an accountant (docs/privacy.md).
    /// Central DP is refused with `strategy = "fedomg"`, a `robust` rule, the `feddim` and
    /// `fedddl` objectives, `feature_norm = "pooled"` or `"balanced"`, `max_update_norm` above
    /// 0 and `role = "site"`; under it, `[train] feature_norm` defaults to `"none"`.
    #[serde(default)]
    pub privacy: PrivacySettings,
    /// How aggregates become the model devices serve: at once (`direct`), or through the
    /// evaluation gate and a canary stage (`gated`); releases kept for `ctl rollback`.
    #[serde(default)]
    pub release: crate::release::ReleaseConfig,
    /// Synchronous rounds (`mode = "synchronous"`), or buffered asynchronous aggregation
    /// (`mode = "buffered"`, FedBuff: a new model version every `buffer_size` updates, stale
    /// ones weighted down; docs/algorithms.md §12). Buffered mode is refused with
    /// `strategy = "fedomg"`, the `feddim` and `fedddl` objectives, central DP and
    /// `role = "site"`.
    #[serde(default)]
    pub aggregation: crate::buffer::AggregationConfig,
}

fn default_norm_ratio() -> f64 {
    crate::round::DEFAULT_MAX_NORM_RATIO
}
fn default_weight_ratio() -> f64 {
    crate::round::DEFAULT_MAX_WEIGHT_RATIO
}
fn default_max_missed_rounds() -> u32 {
    crate::round::types::DEFAULT_MAX_MISSED_ROUNDS
}
fn default_spill_max_mb() -> usize {
    16 * 1024
}

fn default_update_memory_mb() -> usize {
    1024
}
fn default_rounds() -> u64 {
    20
}
fn default_fraction() -> f32 {
    1.0
}
fn one() -> usize {
    1
}
fn default_timeout() -> f64 {
    60.0
}

/// Longest round: seven days.
const MAX_ROUND_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

impl CoordinatorConfig {
    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.into(),
            source,
        })?;
        let invalid = |reason: InvalidConfig| ConfigError::Invalid {
            path: path.into(),
            reason,
        };
        // Before serde, which names a top-level key with neither its line nor the keys there are.
        if let Some(unknown) = unknown::find::<Self>(&text) {
            return Err(invalid(InvalidConfig::UnknownKey(Box::new(unknown))));
        }
        let mut config: Self = toml::from_str(&text)
            .map_err(|e| invalid(InvalidConfig::Toml(fedge_daemon::describe_toml(&e, &text))))?;
        // Unwritten, `[train] feature_norm` is `none` under central DP (`default_under`).
        let written = (text.parse::<toml::Table>().ok())
            .and_then(|t| t.get("train")?.as_table()?.get("feature_norm").cloned())
            .is_some();
        if !written {
            let central = config.privacy.mode == crate::strategy::PrivacyMode::Central;
            config.train.feature_norm = fedge_wire::FeatureNorm::default_under(central);
        }
        config.check().map_err(invalid)?;
        let base = path.parent().unwrap_or(Path::new("."));
        (config.broker.load(base)).map_err(|e| invalid(InvalidConfig::Broker(e)))?;
        if let Some(site) = config.site.as_mut() {
            site.resolve(base);
            if let Some(upstream) = site.upstream.as_mut() {
                (upstream.load(base)).map_err(|e| invalid(InvalidConfig::Broker(e)))?;
            }
        }
        // Relative paths are read from the configuration file's folder, as in device profiles.
        for path in [
            config.model.classes_file.as_mut(),
            config.auth.keys_file.as_mut(),
            config.auth.operator_key_file.as_mut(),
            config.state_dir.as_mut(),
            config.spill_dir.as_mut(),
            config.initial_params.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            *path = base.join(&*path);
        }
        config.resolve_classes().map_err(invalid)?;
        config.backbone_digest().map_err(invalid)?;
        config
            .protocol
            .window()
            .map_err(|e| invalid(InvalidConfig::Protocol(e)))?;
        Ok(config)
    }

    /// `[model] backbone_sha256` as bytes, if set.
    pub fn backbone_digest(&self) -> Result<Option<[u8; 32]>, InvalidConfig> {
        let Some(hex) = &self.model.backbone_sha256 else {
            return Ok(None);
        };
        let digest = fedge_wire::hex::decode_array(hex.trim());
        digest.map(Some).ok_or(InvalidConfig::BackboneSha256)
    }

    /// The device keys named by `[auth] keys_file`, if any.
    pub fn device_keys(
        &self,
    ) -> Result<Option<crate::round::DeviceKeys>, crate::store::keys::KeysError> {
        self.auth
            .keys_file
            .as_deref()
            .map(crate::store::keys::load)
            .transpose()
    }

    /// Reads `classes_file` into `classes` and checks the list against the head.
    fn resolve_classes(&mut self) -> Result<(), InvalidConfig> {
        if let Some(path) = self.model.classes_file.take() {
            if self.model.classes.is_some() {
                return Err(InvalidConfig::ClassesTwice);
            }
            let classes = fedge_daemon::read_list(&path)
                .map_err(|source| InvalidConfig::ClassFile { path, source })?;
            self.model.classes = Some(classes);
        }
        let classes = self.classes();
        fedge_wire::check_classes(&classes)?;
        if classes.len() != self.head.classes {
            return Err(fedge_wire::InvalidClasses::Count {
                names: classes.len(),
                outputs: self.head.classes,
            }
            .into());
        }
        Ok(())
    }

    /// The federation's class names: `[model] classes` (or its file), else `"0"`, `"1"`, ….
    pub fn classes(&self) -> Vec<String> {
        (self.model.classes.clone())
            .unwrap_or_else(|| fedge_wire::numbered_classes(self.head.classes))
    }

    /// The strategy the configuration names, central DP-FedAvg in FedAvg's place when
    /// `[privacy] mode = "central"` (its noise from the operating system unless `[privacy] seed`
    /// is set).
    pub fn build_strategy(
        &self,
    ) -> Result<Box<dyn crate::strategy::Strategy>, crate::strategy::BuildError> {
        self.plan(Vec::new()).strategy()
    }

    /// The round machine this configuration makes (`crate::boot`), a fresh federation starting
    /// from `initial`.
    pub fn plan(&self, initial: Vec<f32>) -> crate::boot::Plan {
        crate::boot::Plan {
            round: self.round_config(),
            strategy: self.strategy.clone(),
            noise_seed: self.privacy.seed,
            initial,
        }
    }

    fn check(&self) -> Result<(), InvalidConfig> {
        fedge_wire::Topics::new(&self.federation).map_err(InvalidConfig::Federation)?;
        self.privacy
            .check(&self.train, self.role, self.max_update_norm)?;
        let private = self.privacy.central();
        let noise = || fedge_privacy::GaussianNoise::from_seed(0);
        self.strategy.build_with(private.map(|dp| (dp, noise())))?;
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(InvalidConfig::Fraction(self.fraction));
        }
        if !(0.1..=MAX_ROUND_TIMEOUT_S).contains(&self.round_timeout_s) {
            return Err(InvalidConfig::RoundTimeout(self.round_timeout_s));
        }
        if self.min_updates > self.min_clients.max(1) {
            return Err(InvalidConfig::Quorum {
                min_updates: self.min_updates,
                min_clients: self.min_clients.max(1),
            });
        }
        self.train.check()?;
        self.release.check().map_err(InvalidConfig::Release)?;
        let combined = aggregation::Combined {
            strategy: self.strategy.strategy,
            objective: self.train.objective,
            central_dp: private.is_some(),
            role: self.role,
        };
        aggregation::check(&self.aggregation, combined).map_err(InvalidConfig::Aggregation)?;
        if self.embedded_broker {
            let loopback = match self.broker.host.parse::<std::net::IpAddr>() {
                Ok(ip) => ip.is_loopback(),
                Err(_) => self.broker.host == "localhost",
            };
            if !loopback {
                return Err(InvalidConfig::EmbeddedExposed(self.broker.host.clone()));
            }
        }
        let FedDimSettings { lambda, momentum } = self.feddim;
        if !(lambda.is_finite() && lambda >= 0.0 && (0.0..=1.0).contains(&momentum)) {
            return Err(InvalidConfig::FedDim { lambda, momentum });
        }
        for (name, value) in [
            ("max_update_norm", self.max_update_norm),
            ("max_norm_ratio", self.max_norm_ratio),
            ("max_weight_ratio", self.max_weight_ratio),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(InvalidConfig::NormBound { name, value });
            }
        }
        if self.update_memory_mb == 0 {
            return Err(InvalidConfig::UpdateMemory);
        }
        if self.head.features == 0 || self.head.hidden == 0 || self.head.classes < 2 {
            return Err(InvalidConfig::Head);
        }
        if let Some(tail) = &self.head.tail {
            tail.check().map_err(InvalidConfig::Tail)?;
            if tail.features() != self.head.features {
                return Err(InvalidConfig::Tail(format!(
                    "the tail gives {} features, [head] features = {}: set it to {}",
                    tail.features(),
                    self.head.features,
                    tail.features()
                )));
            }
        }
        self.check_role()
    }

    /// A site needs its section, sample-count aggregation and an objective that merges.
    fn check_role(&self) -> Result<(), InvalidConfig> {
        match (self.role, &self.site) {
            (Role::Global, None) => Ok(()),
            (Role::Global, Some(_)) => Err(InvalidSite::Unused.into()),
            (Role::Site, None) => Err(InvalidSite::Missing.into()),
            (Role::Site, Some(site)) => {
                site.check(&self.federation)?;
                let s = &self.strategy;
                let fedavg = s.strategy == crate::strategy::StrategyKind::Fedavg;
                if !fedavg || s.server_momentum != 0.0 || s.server_learning_rate != 1.0 {
                    return Err(InvalidSite::Strategy.into());
                }
                if self.train.objective == fedge_wire::Objective::FedDim {
                    return Err(InvalidSite::FedDim.into());
                }
                Ok(())
            }
        }
    }

    /// The round machine's settings.
    pub fn round_config(&self) -> RoundConfig {
        RoundConfig {
            federation: self.federation.clone(),
            classes: self.classes(),
            backbone: self.model.backbone.clone(),
            backbone_sha256: self.backbone_digest().ok().flatten(),
            head: Some(self.head.clone()),
            // A site answers the global federation's rounds for as long as it runs.
            rounds: if self.role == Role::Site {
                0
            } else {
                self.rounds
            },
            fraction: self.fraction,
            min_clients: self.min_clients,
            min_updates: self.min_updates,
            round_timeout_ms: (self.round_timeout_s * 1000.0) as u64,
            train: TrainParams {
                insight_lambda: self.feddim.lambda,
                ..self.train.clone()
            },
            seed: self.seed,
            update_memory_bytes: self.update_memory_mb.saturating_mul(1 << 20),
            max_update_norm: self.max_update_norm,
            max_norm_ratio: self.max_norm_ratio,
            max_weight_ratio: self.max_weight_ratio,
            max_missed_rounds: self.max_missed_rounds,
            privacy: self.privacy.central(),
            relay: self
                .site
                .as_ref()
                .filter(|_| self.role == Role::Site)
                .map(|site| crate::round::RelayConfig {
                    site: site.name.clone(),
                    margin_ms: (site.margin_s * 1000.0) as u64,
                }),
            aggregation: self.aggregation.clone(),
            ..RoundConfig::default()
        }
        .with_objective(self.train.objective, &self.head, self.feddim.momentum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/coordinator.toml");
        let config = CoordinatorConfig::load(&path).unwrap();
        assert_eq!(config.head, HeadConfig::new(512, 10).with_hidden(64));
        assert_eq!(config.round_config().round_timeout_ms, 60_000);
        assert_eq!(config.classes(), fedge_wire::numbered_classes(10));
        // The digest it names is the committed backbone's.
        let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/assets/digits-conv.onnx");
        let file = fedge_wire::BackboneRef::of("digits-conv", &std::fs::read(onnx).unwrap());
        assert_eq!(config.round_config().backbone_sha256, Some(file.sha256));
    }

    #[test]
    fn the_class_list_comes_from_the_file_and_reaches_the_round_machine() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("classes.txt"), "# parts\nok\nscratch\n").unwrap();
        let path = dir.path().join("c.toml");
        let text = "federation = \"f\"\n[head]\nfeatures = 4\nclasses = 2\n\
                    [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n";
        std::fs::write(&path, text).unwrap();
        let round = CoordinatorConfig::load(&path).unwrap().round_config();
        assert_eq!(round.classes, ["ok", "scratch"]);
        assert_eq!(round.backbone, "digits-conv");
        assert_eq!(round.head, Some(HeadConfig::new(4, 2)));
    }

    #[test]
    fn bad_values_name_the_field_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let head = "[head]\nfeatures = 4\nclasses = 2\n";
        for (extra, expected) in [
            ("fraction = 1.5\n", "fraction"),
            (
                "strategy = \"nope\"\n",
                "expected one of `fedavg`, `fedavgm`, `fedomg`",
            ),
            ("federation2 = 1\n", "line 2: unknown key `federation2`"),
            (
                "[model]\nbackbone_sha256 = \"abc\"\n",
                "backbone_sha256 must be 64 hex digits",
            ),
            (
                "[protocol]\nprevious_until = \"soon\"\n",
                "previous_until = \"soon\"",
            ),
            ("round_timeout_s = 0.0001\n", "round_timeout_s"),
            ("round_timeout_s = 1e300\n", "round_timeout_s"),
            (
                "min_clients = 2\nmin_updates = 3\n",
                "min_updates = 3 can never be reached",
            ),
            (
                "embedded_broker = true\n[broker]\nhost = \"0.0.0.0\"\n",
                "loopback",
            ),
            ("[train]\nlearning_rate = nan\n", "learning_rate = NaN"),
            ("[train]\nbatch_size = 0\n", "batch_size = 0"),
            ("[train]\nlocal_epochs = 100000\n", "local_epochs"),
            (
                "[train]\nlearnig_rate = 0.1\n",
                "unknown key `learnig_rate` in [train]; did you mean `learning_rate`?",
            ),
            ("[broker]\nkeep_alive_s = 70000\n", "keep_alive_s"),
            (
                "[model]\nclasses = [\"ok\", \"scratch\", \"dent\"]\n",
                "3 class names for a head with 2 outputs",
            ),
            (
                "[model]\nclasses = [\"ok\", \"ok\"]\n",
                "class \"ok\" is listed twice",
            ),
            (
                "[model]\nclasses = [\"a\", \"b\"]\nclasses_file = \"c.txt\"\n",
                "both classes and classes_file",
            ),
            ("[model]\nclasses_file = \"missing.txt\"\n", "missing.txt"),
        ] {
            // `[model]` comes after `[head]`, whose keys it would otherwise swallow.
            let text = match extra.strip_prefix("[model]") {
                Some(model) => format!("federation = \"f\"\n{head}[model]{model}"),
                None => format!("federation = \"f\"\n{extra}{head}"),
            };
            std::fs::write(&path, text).unwrap();
            let err = CoordinatorConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains(expected), "{extra:?}: {err}");
        }
    }
}
