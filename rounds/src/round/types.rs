//! The round machine's vocabulary: its settings ([`RoundConfig`]), where it is ([`Phase`]),
//! why an update was not used ([`Rejection`]), what a round did ([`RoundReport`]) and what the
//! driver must do ([`Output`]). Plain data; the behaviour is in the sibling modules.

use std::collections::BTreeMap;
use std::sync::Arc;

use fedge_wire::{DecodeError, DeviceKey, HeadConfig, Objective, TensorF32, TrainParams};

use super::saved::Record;
use crate::objectives::fedddl::PrototypeConfig;
use crate::objectives::feddim::InsightConfig;
use crate::strategy::{AggregationReport, CentralDp};

/// Settings of the round logic.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundConfig {
    /// Federation name, written into every task (devices refuse another federation's).
    pub federation: String,
    /// The federation's class names in output order, written into every task and release.
    pub classes: Vec<String>,
    /// The backbone's name, written into every release (empty: not told).
    pub backbone: String,
    /// The SHA-256 of the backbone's ONNX file: with it, every task names the backbone
    /// (`fedge_wire::BackboneRef`) and devices running another sit the round out.
    pub backbone_sha256: Option<[u8; 32]>,
    /// The head's sizes: after each aggregation the machine releases the first
    /// `head.num_params()` parameters with `classes` ([`super::Output::Release`]); none
    /// releases nothing.
    pub head: Option<HeadConfig>,
    /// The federation's run (see [`fedge_wire::RoundTask::run`]): every update must echo it
    /// (`replay` otherwise). The driver draws it at random for a fresh federation; a resumed
    /// checkpoint brings its own.
    pub run: u64,
    /// Rounds that must aggregate before the federation finishes (abandoned rounds do not
    /// count); 0 runs until stopped.
    pub rounds: u64,
    /// Fraction of online clients selected per round.
    pub fraction: f32,
    /// Clients that must be online before a round starts, and the least selected per round.
    pub min_clients: usize,
    /// Accepted updates needed to aggregate at the deadline (quorum).
    pub min_updates: usize,
    /// Time a round stays open, in milliseconds.
    pub round_timeout_ms: u64,
    /// Local training parameters sent with each task.
    pub train: TrainParams,
    /// Seed of client sampling.
    pub seed: u64,
    /// Time a partly received chunked update waits for its other chunks.
    pub reassembly_timeout_ms: u64,
    /// Most bytes of deltas held in one round (`N·M·2` in f16, `N·M·4` in f32 or int8);
    /// later updates are rejected with reason `memory_budget`.
    pub update_memory_bytes: usize,
    /// FedDIM's server side, when devices train with the `FedDim` objective: updates must carry
    /// class statistics, and the global `Ī` goes down with each task.
    pub insight: Option<InsightConfig>,
    /// FedDDL's server side, when devices train with the `FedDdl` objective: updates must carry
    /// local causal prototypes, and the global `U_G` goes down with each task.
    pub prototypes: Option<PrototypeConfig>,
    /// Device keys by client id. When set, only these devices are selected, every update must
    /// be sealed with its device's key, and each task carries one tag per selected device.
    /// When unset, plain and sealed updates are both accepted (sealed ones unverified).
    pub auth: Option<Arc<DeviceKeys>>,
    /// Emit [`Output::Journal`] records (the opened round, each accepted update) for the driver
    /// to write, so a restart can resume the open round with `super::Rounds::restore_round`.
    pub journal: bool,
    /// Updates whose delta norm passes this bound are rejected on arrival (`norm`); 0: no bound.
    pub max_update_norm: f64,
    /// At the round's end, a delta longer than this multiple of the median norm of the round's
    /// other accepted updates is scaled down to that length (the round-end guard), when there
    /// are at least 2; 0: off.
    pub max_norm_ratio: f64,
    /// At the round's end, a sample count above this multiple of the round's lower median
    /// sample count is cut down to it before aggregation, so that no device weighs more than
    /// that multiple of a typical one whatever count it claims; 0: off.
    pub max_weight_ratio: f64,
    /// A device selected and failing (no update, or a refused one) this many rounds in a row
    /// rests: no round selects it until it reports healthy (a status without an error, or
    /// back online after being away), so that one broken device does not make every round
    /// wait out its deadline; 0: off.
    pub max_missed_rounds: u32,
    /// A site aggregator's settings: rounds open only when the global federation's task
    /// arrives (`super::Rounds::relay_task`), and each aggregate goes upstream as one update
    /// ([`Output::Upstream`]) instead of becoming a release. `None`: a global coordinator.
    pub relay: Option<RelayConfig>,
    /// Central DP (docs/algorithms.md §8): devices drawn by the configured sampling, the
    /// strategy told each round's expected participants, an accountant composed per aggregated
    /// round, the federation finished before `target_epsilon` would be passed. The norm-ratio
    /// drop and the weight cap are off (clipping bounds every device), and the devices' own
    /// training loss and validation accuracy are left out of the report (they are not noised).
    /// The composition root builds the strategy with these same settings (its `Plan`). `None`:
    /// off.
    pub privacy: Option<CentralDp>,
    /// Synchronous rounds, or buffered asynchronous aggregation (FedBuff; `crate::buffer`).
    pub aggregation: crate::buffer::AggregationConfig,
}

impl RoundConfig {
    /// The same settings with the server sides the devices' `objective` needs, for a head of
    /// `head`'s sizes: FedDIM's insight matrices (averaged with `insight_momentum`) or FedDDL's
    /// prototypes; neither for the other objectives.
    pub fn with_objective(
        mut self,
        objective: Objective,
        head: &HeadConfig,
        insight_momentum: f32,
    ) -> Self {
        let (hidden, classes) = (head.hidden, head.classes);
        self.insight = (objective == Objective::FedDim).then_some(InsightConfig {
            hidden,
            classes,
            momentum: insight_momentum,
        });
        self.prototypes =
            (objective == Objective::FedDdl).then_some(PrototypeConfig { hidden, classes });
        self
    }
}

/// Central DP's spending, in the status and the round's metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrivacySpent {
    /// ε spent so far at [`PrivacySpent::delta`], for an observer who knows which devices
    /// each round selected (round tasks name them): the larger of the amplified ε and the most
    /// selected device's unamplified one.
    pub epsilon: f64,
    /// ε with amplification by subsampling: what holds only against an observer who does not
    /// know whether a device took part.
    pub amplified_epsilon: f64,
    /// The most accounted rounds any one device was selected in.
    pub most_selected: u64,
    /// The configured δ.
    pub delta: f64,
    /// The configured budget, if any.
    pub target_epsilon: Option<f64>,
    /// Rounds composed.
    pub rounds: u64,
    /// One more round would pass `target_epsilon`: the federation finished.
    pub exhausted: bool,
}

/// How a site aggregator answers the global federation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The site's client id in the global federation.
    pub site: String,
    /// The site's round closes this long before the global round's deadline (at the latest
    /// halfway through it), so its update reaches the global coordinator in time.
    pub margin_ms: u64,
}

/// Default [`RoundConfig::max_missed_rounds`].
pub const DEFAULT_MAX_MISSED_ROUNDS: u32 = 3;

/// Default [`RoundConfig::max_norm_ratio`]: room for honest heterogeneity (`fedge demo --rounds
/// 10` drops no update with it), while a poisoned delta is longer by orders of magnitude.
pub const DEFAULT_MAX_NORM_RATIO: f64 = 10.0;
/// Default [`RoundConfig::max_weight_ratio`].
pub const DEFAULT_MAX_WEIGHT_RATIO: f64 = 10.0;
/// Largest magnitude of any value of an update (delta, class statistics): far above any
/// trained head's, and low enough that squares and dot products of a whole delta stay finite
/// in f32 partial sums and f64 totals.
pub const MAX_ABS_VALUE: f32 = 1e9;

/// Device keys by client id.
pub type DeviceKeys = BTreeMap<String, DeviceKey>;

impl Default for RoundConfig {
    fn default() -> Self {
        Self {
            federation: "fedge".into(),
            classes: Vec::new(),
            backbone: String::new(),
            backbone_sha256: None,
            head: None,
            run: 0,
            rounds: 20,
            fraction: 1.0,
            min_clients: 1,
            min_updates: 1,
            round_timeout_ms: 60_000,
            train: TrainParams::default(),
            seed: 0,
            reassembly_timeout_ms: fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
            update_memory_bytes: 1 << 30,
            insight: None,
            prototypes: None,
            auth: None,
            journal: false,
            max_update_norm: 0.0,
            max_norm_ratio: DEFAULT_MAX_NORM_RATIO,
            max_missed_rounds: DEFAULT_MAX_MISSED_ROUNDS,
            max_weight_ratio: DEFAULT_MAX_WEIGHT_RATIO,
            relay: None,
            privacy: None,
            aggregation: Default::default(),
        }
    }
}

/// Why an update was not used. The `name` is the key in the status JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rejection {
    /// Not a decodable fedge frame (bad magic, CRC, body).
    Malformed,
    /// A protocol version this coordinator does not speak.
    Version,
    /// A valid frame of a kind devices must not send.
    WrongKind,
    /// A chunk that does not fit the other chunks of its message.
    BadChunk,
    /// `client_id` differs from the client in the topic.
    ClientMismatch,
    /// For a round that is not open (late, early or unknown).
    WrongRound,
    /// From a client not selected this round.
    NotSelected,
    /// A second update from the same client in the same round.
    Duplicate,
    /// Parameter count differs from the global head's.
    Shape,
    /// NaN or infinite values.
    NonFinite,
    /// A sample count of zero.
    NoSamples,
    /// Holding the update would pass the round's memory budget for deltas.
    MemoryBudget,
    /// FedDIM class statistics missing, misshapen or not finite.
    Insight,
    /// FedDDL prototypes missing or misshapen.
    Prototypes,
    /// A feature summary missing, misshapen or out of range where the federation pools
    /// (`feature_norm`, docs/algorithms.md §7).
    Features,
    /// A plain update where authentication is required.
    Unauthenticated,
    /// A device with no key on the coordinator (updates and status).
    UnknownDevice,
    /// An update's HMAC tag that does not verify.
    BadTag,
    /// A chunk's HMAC tag that does not verify (kept apart from [`Rejection::BadTag`]: a forged
    /// chunk on a device's stream and a tampered whole update are different attacks).
    BadChunkTag,
    /// A device status whose HMAC tag does not verify (kept apart from [`Rejection::BadTag`]:
    /// a forged status and a forged update are different attacks).
    BadStatusTag,
    /// A delta norm above the absolute bound, or far above the round's median.
    Norm,
    /// A chunk stream that did not complete within the reassembly timeout.
    Incomplete,
    /// A message, or a chunk stream's announced length, above the largest message accepted.
    Oversized,
    /// An update answering another run's task: captured in another federation, or before a
    /// coordinator started afresh.
    Replay,
    /// An operator command that does not verify (tag, federation) or was applied already.
    BadControl,
    /// An enrolment request without a pending token, with an expired one, or whose tag does
    /// not verify with it (a wrong or used token).
    BadEnrolment,
    /// Accepted, but the journal could not be written: the update does not count (a restart
    /// would not have it).
    Storage,
    /// Buffered mode: started from a model version more than `max_staleness` versions old.
    Stale,
    /// An evaluation score the gate cannot take: from a device not named in `[release]
    /// evaluators` or banned, of a release this coordinator did not make, out of range or not
    /// tied to its counts.
    Score,
}

impl Rejection {
    /// The reason's key in status JSON.
    pub fn name(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::Version => "version",
            Rejection::WrongKind => "wrong_kind",
            Rejection::BadChunk => "bad_chunk",
            Rejection::ClientMismatch => "client_mismatch",
            Rejection::WrongRound => "wrong_round",
            Rejection::NotSelected => "not_selected",
            Rejection::Duplicate => "duplicate",
            Rejection::Shape => "shape",
            Rejection::NonFinite => "non_finite",
            Rejection::NoSamples => "no_samples",
            Rejection::MemoryBudget => "memory_budget",
            Rejection::Insight => "insight",
            Rejection::Prototypes => "prototypes",
            Rejection::Features => "features",
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::UnknownDevice => "unknown_device",
            Rejection::BadTag => "bad_tag",
            Rejection::BadChunkTag => "bad_chunk_tag",
            Rejection::BadStatusTag => "bad_status_tag",
            Rejection::BadControl => "bad_control",
            Rejection::BadEnrolment => "bad_enrolment",
            Rejection::Norm => "norm",
            Rejection::Incomplete => "incomplete",
            Rejection::Oversized => "oversized",
            Rejection::Replay => "replay",
            Rejection::Storage => "storage",
            Rejection::Stale => "stale",
            Rejection::Score => "score",
        }
    }

    /// The reason a frame that does not decode is rejected for.
    pub(super) fn of_decode(e: &DecodeError) -> Self {
        match e {
            DecodeError::UnsupportedVersion(_) => Rejection::Version,
            DecodeError::BadChunk(_) => Rejection::BadChunk,
            DecodeError::Unauthenticated => Rejection::Unauthenticated,
            DecodeError::TooLarge(_) => Rejection::Oversized,
            _ => Rejection::Malformed,
        }
    }
}

/// Where the machine is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for enough clients.
    Waiting,
    /// A round is open.
    Training,
    /// All rounds done.
    Finished,
}

impl Phase {
    /// Name used in status JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Training => "training",
            Phase::Finished => "finished",
        }
    }
}

/// What the operator has set (`control.rs`), and the upgrade window (`upgrade.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// No new round opens.
    pub paused: bool,
    /// Devices no round selects.
    pub banned: std::collections::BTreeSet<String>,
    /// Devices of the previous protocol version take part (the upgrade window is open).
    pub previous_protocol: bool,
    /// Devices whose status says they speak the previous protocol version.
    pub previous_speakers: std::collections::BTreeSet<String>,
    /// The total of rounds `set-rounds` set (over the configuration's), if it did.
    pub rounds: Option<u64>,
    /// The backbone `set-backbone` named (over the configuration's), if it did.
    pub backbone: Option<(String, [u8; 32])>,
    /// Runs that ended before the current one (`new-run`), oldest first.
    pub runs: Vec<fedge_wire::RunSummary>,
    /// Where the current run began: its first round and the rounds aggregated before it.
    pub run_start: (u64, u64),
    /// Rounds in a row each device was selected in and failed; at `max_missed_rounds` it
    /// rests until it reports healthy or its rest ends ([`rest_ms`]).
    pub missed: std::collections::BTreeMap<String, u32>,
    /// Until when (the machine's ms) each resting device rests: then it is tried again in
    /// one round (a probe), and rests twice as long if it fails that one too.
    pub rest_until: std::collections::BTreeMap<String, u64>,
    /// The latest time the machine was given (ms), for what depends on time without being
    /// handed it (who rests).
    pub clock_ms: u64,
    /// What became of the last operator command taken (its number checked), for the status.
    pub last_command: Option<fedge_wire::control::CommandOutcome>,
    /// Why the last operator command was refused (`bad_control`), for the status, so that
    /// `ctl` can say it.
    pub refused: Option<String>,
    /// The rounds aggregated when `reset-pool` last cleared the pooled feature summary.
    pub pool_reset: Option<u64>,
}

impl Default for Control {
    /// Running, nobody banned, the upgrade window open.
    fn default() -> Self {
        Self {
            paused: false,
            banned: Default::default(),
            previous_protocol: true,
            previous_speakers: Default::default(),
            rounds: None,
            backbone: None,
            runs: Vec::new(),
            run_start: (1, 0),
            missed: Default::default(),
            rest_until: Default::default(),
            clock_ms: 0,
            last_command: None,
            refused: None,
            pool_reset: None,
        }
    }
}

/// An update's delta scaled down at the round's end by the norm guard.
#[derive(Debug, Clone, PartialEq)]
pub struct NormClip {
    /// The client.
    pub client: String,
    /// Its delta's L2 norm as sent.
    pub norm: f64,
    /// What it was scaled down to: `max_norm_ratio` × the median norm of the round's other
    /// updates.
    pub bound: f64,
}

/// What happened to a round that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    /// Round number.
    pub round: u64,
    /// True when the model was updated; false when the round was abandoned.
    pub aggregated: bool,
    /// Why an abandoned round was abandoned: `quorum` (too few usable updates) or
    /// `non_finite_aggregate` / `exploding_aggregate` (the aggregate was refused and the model
    /// kept).
    pub abandoned: Option<&'static str>,
    /// Clients whose sample count was cut to the round's weight bound.
    pub capped: Vec<String>,
    /// Updates whose delta the norm guard scaled down, with what they were compared with.
    pub norm_clipped: Vec<NormClip>,
    /// Clients selected.
    pub selected: Vec<String>,
    /// Clients whose update was used.
    pub reported: Vec<String>,
    /// Updates rejected during the round, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Bytes of update payloads received during the round (all chunks, rejected ones too).
    pub bytes_up: u64,
    /// Bytes of round-task payload, times the clients selected.
    pub bytes_down: u64,
    /// Milliseconds from the task's publication to the aggregation.
    pub duration_ms: u64,
    /// Sample-weighted mean of the validation accuracy the clients measured on the global head
    /// they received (so it describes the previous round's model).
    pub source_val_accuracy: Option<f32>,
    /// Sample-weighted mean training loss of the clients.
    pub train_loss: Option<f32>,
    /// L2 norm of the global parameters after the round.
    pub params_norm: f32,
    /// What the strategy reported (FedOMG's Γ, momentum norm), when the round aggregated.
    pub aggregation: Option<AggregationReport>,
    /// Selected clients whose update did not count, with the last reason (a rejection's name
    /// or `no_report`).
    pub failures: BTreeMap<String, String>,
    /// Central DP's spending after the round; `None` without central DP.
    pub privacy: Option<PrivacySpent>,
    /// Buffered mode: the accepted updates by staleness (index `s`: started `s` versions
    /// before this one); empty in synchronous mode.
    pub staleness: Vec<u64>,
}

/// Something the driver must do or may show.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Publish this framed round task (retained) on the task topic; chunk it if large.
    PublishTask {
        /// Round number.
        round: u64,
        /// Framed [`fedge_wire::RoundTask`].
        frame: Vec<u8>,
    },
    /// A round ended.
    RoundEnded(Box<RoundReport>),
    /// A release to serve (an aggregate in `direct` mode, a promotion, a rollback): publish it
    /// retained on `model/current` and keep it in the state folder (after the round's
    /// checkpoint).
    Release(Box<fedge_wire::ModelRelease>),
    /// An aggregate waiting for the evaluation gate: publish it retained on
    /// `model/candidate`.
    Candidate(Box<fedge_wire::ModelRelease>),
    /// Which release each device serves: number it and publish it retained on
    /// `model/serving` (sealed with the device keys when there are keys).
    Serving(fedge_wire::ServingPointer),
    /// Something happened to a release: log it and write it to the audit trail.
    ReleaseEvent(crate::release::ReleaseEvent),
    /// An update was rejected.
    Rejected {
        /// Client named by the topic.
        client: String,
        /// Why.
        reason: Rejection,
        /// Details for the log line.
        detail: String,
    },
    /// The status changed; publish a fresh status document.
    StatusChanged,
    /// A device left the federation (its key revoked): clear its retained status, so that
    /// dashboards stop showing it.
    ClearDeviceStatus(String),
    /// All rounds are done.
    Finished,
    /// Write this record to the journal before acting on later outputs (only with
    /// `RoundConfig::journal`).
    Journal(Record),
    /// A site aggregator's round aggregated: send this update upstream, as the site, for the
    /// global round it answers (only with [`RoundConfig::relay`]).
    Upstream(Box<fedge_wire::ClientUpdate>),
}

/// The global task the site's next (or open) round answers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Relayed {
    /// The global round, which is also the site round's number.
    pub(crate) round: u64,
    /// The global federation's run, echoed by the site's update.
    pub(crate) run: u64,
    pub(crate) train: TrainParams,
    pub(crate) insight: Option<TensorF32>,
    pub(crate) prototypes: Option<TensorF32>,
    /// The federation's pooled feature summary, passed on to the site's devices.
    pub(crate) pooled: Option<fedge_wire::FeatureSummary>,
    /// When the task arrived and the time the site's round may take from then.
    pub(crate) received_ms: u64,
    pub(crate) budget_ms: u64,
}

/// Why a site does not answer a global task; its status says so upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The global head has another size.
    #[error(
        "the global task carries {got} parameters, this site's [head] makes {expected}: give the \
         site the global coordinator's [head] and [train] objective"
    )]
    Params {
        /// Parameters in the task.
        got: usize,
        /// Parameters of the site's configuration.
        expected: usize,
    },
    /// FedDIM's compact class statistics do not merge.
    #[error(
        "the federation trains with feddim, whose compact class statistics cannot be merged at a \
         site (the coordinator rebuilds each participant's insight from its own classifier); run \
         FedDIM with devices as participants, or another objective across sites"
    )]
    FedDim,
    /// The site is not configured to check what its devices send for this objective.
    #[error(
        "the federation trains with {0}; set the site's [train] objective to {0} so it checks \
         its devices' statistics"
    )]
    Objective(Objective),
}

/// How long a device rests after failing `max_missed_rounds` selected rounds in a row, and
/// `again` more probes after each rest: twice the round timeout (at least a second), doubled at
/// each failed probe up to 64 times. A device that declines every task (its cause not yet fixed,
/// or fixed without a fresh status) is tried again now and then, instead of never; one whose
/// cause stays costs the federation one round's wait per rest, ever more rarely.
pub fn rest_ms(round_timeout_ms: u64, again: u32) -> u64 {
    let base = round_timeout_ms.saturating_mul(2).max(1_000);
    base.saturating_mul(1 << again.min(6))
}
