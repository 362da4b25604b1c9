//! The round state machine: sans-IO, no clock.
//!
//! Inputs are method calls with the current time in milliseconds (from any monotonic
//! origin the driver chooses): [`Rounds::handle_client_status`], [`Rounds::handle_packet`],
//! [`Rounds::handle_timeout`]. Outputs are drained with [`Rounds::poll_output`], and
//! [`Rounds::poll_timeout`] says when `handle_timeout` must be called next. The machine never
//! reads a clock, never touches the network or the disk, and has no I/O error: the same
//! multi-round scenario replays identically with simulated time, without a broker.
//!
//! # Round life
//!
//! `Waiting` (fewer than `min_clients` online) → `Training` (task published, updates
//! collected until every selected client reported or the deadline passed) → aggregation →
//! next round's `Training`, until `rounds` are done (`Finished`). At the deadline with fewer
//! than `min_updates` accepted updates the deadline is extended once; if the quorum is still
//! missing, the round is abandoned, the model is kept and a new round re-samples clients.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use fedge_wire::{
    ClassStats, ClientUpdate, DecodeError, DeviceKey, Message, Reassembler, RoundTask, TensorF32,
    TrainParams,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;

use crate::checkpoint::Checkpoint;
use crate::insight::{ClientInsight, InsightConfig, round_insight, update_global};
use crate::journal::{OpenRoundLog, Record};
use crate::prototypes::{PrototypeConfig, average_prototypes};
use crate::strategy::{AggregationReport, Failure, Strategy};
use crate::updates::{RoundUpdates, UpdatesConfig};

/// Settings of the round logic.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundConfig {
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
    /// Most bytes of deltas held in one round (`N·M·4`); later updates are rejected with
    /// reason `memory_budget`.
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
    /// to write, so a restart can resume the open round with [`Rounds::restore_round`].
    pub journal: bool,
    /// Updates whose delta norm passes this bound are rejected on arrival (`norm`); 0: no bound.
    pub max_update_norm: f64,
    /// At the round's end, updates whose norm passes this multiple of the median norm of the
    /// round's accepted updates are dropped (`norm`), when there are at least 3; 0: off.
    pub max_norm_ratio: f64,
}

/// Device keys by client id.
pub type DeviceKeys = BTreeMap<String, DeviceKey>;

impl Default for RoundConfig {
    fn default() -> Self {
        Self {
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
            max_norm_ratio: 0.0,
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
    /// A plain update where authentication is required.
    Unauthenticated,
    /// A device with no key on the coordinator (updates and status).
    UnknownDevice,
    /// An HMAC tag that is missing for the device or does not verify.
    BadTag,
    /// A delta norm above the absolute bound, or far above the round's median.
    Norm,
    /// A chunk stream that did not complete within the reassembly timeout.
    Incomplete,
    /// A message, or a chunk stream's announced length, above the largest message accepted.
    Oversized,
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
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::UnknownDevice => "unknown_device",
            Rejection::BadTag => "bad_tag",
            Rejection::Norm => "norm",
            Rejection::Incomplete => "incomplete",
            Rejection::Oversized => "oversized",
        }
    }

    fn of_decode(e: &DecodeError) -> Self {
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

/// What happened to a round that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    /// Round number.
    pub round: u64,
    /// True when the model was updated; false when the round was abandoned below quorum.
    pub aggregated: bool,
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
}

/// Something the driver must do or may show.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Publish this framed round task (retained) on the task topic; chunk it if large.
    PublishTask {
        /// Round number.
        round: u64,
        /// Framed [`RoundTask`].
        frame: Vec<u8>,
    },
    /// A round ended.
    RoundEnded(RoundReport),
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
    /// All rounds are done.
    Finished,
    /// Write this record to the journal before acting on later outputs (only with
    /// `RoundConfig::journal`).
    Journal(Record),
}

struct OpenRound {
    round: u64,
    selected: BTreeSet<String>,
    accepted: RoundUpdates,
    failures: Vec<Failure>,
    /// FedDIM class statistics by client: counts and `[K, H]` means.
    class_stats: BTreeMap<String, (Vec<u32>, Vec<f32>)>,
    /// FedDDL local prototypes by client: counts and `[K, H]` means.
    prototypes: BTreeMap<String, (Vec<u32>, Vec<f32>)>,
    val: Vec<(f32, u32)>,
    loss: Vec<(f32, u32)>,
    opened_ms: u64,
    deadline_ms: u64,
    extended: bool,
    task_frame: Vec<u8>,
    bytes_up: u64,
    rejected: BTreeMap<&'static str, u64>,
}

/// The round state machine.
pub struct Rounds {
    config: RoundConfig,
    strategy: Box<dyn Strategy>,
    params: Vec<f32>,
    online: BTreeSet<String>,
    phase: Phase,
    next_round: u64,
    open: Option<OpenRound>,
    rejected_total: BTreeMap<&'static str, u64>,
    reassembler: Reassembler,
    rng: StdRng,
    outputs: std::collections::VecDeque<Output>,
    last_report: Option<RoundReport>,
    aggregated_rounds: u64,
    last_closed: u64,
    /// The last round's delta arena (with the spill file, if the driver gave one), reused by
    /// the next round.
    spare_arena: crate::updates::Arena,
    /// FedDIM's global class-mean insight matrices `[K, H, K]`, once a round produced them.
    insight: Option<Vec<f32>>,
    /// FedDDL's global causal prototypes `[K, H]`, once a round produced them.
    prototypes: Option<Vec<f32>>,
}

impl Rounds {
    /// A machine starting at round 1 from `initial` parameters.
    pub fn new(config: RoundConfig, mut strategy: Box<dyn Strategy>, initial: Vec<f32>) -> Self {
        let initial = strategy.initialize_parameters(initial);
        let rng = StdRng::seed_from_u64(config.seed);
        let reassembler =
            Reassembler::new(config.reassembly_timeout_ms, fedge_wire::MAX_MESSAGE_BYTES);
        Self {
            config,
            strategy,
            params: initial,
            online: BTreeSet::new(),
            phase: Phase::Waiting,
            next_round: 1,
            open: None,
            rejected_total: BTreeMap::new(),
            reassembler,
            rng,
            outputs: Default::default(),
            last_report: None,
            aggregated_rounds: 0,
            last_closed: 0,
            spare_arena: Default::default(),
            insight: None,
            prototypes: None,
        }
    }

    /// Gives the machine a spill file for the deltas of rounds that outgrow
    /// `update_memory_bytes` (see [`crate::spill`]); the driver's side of the machine's memory.
    /// Rounds opened after the call use it: give it before clients come online.
    pub fn set_spill(&mut self, file: crate::spill::SpillFile) {
        self.spare_arena = crate::updates::Arena::with_spill(file);
    }

    /// Whether the open round's deltas are in the spill file.
    pub fn round_spilled(&self) -> bool {
        self.open.as_ref().is_some_and(|o| o.accepted.is_spilled())
    }

    /// A machine continuing from a checkpoint: its parameters, next round and strategy
    /// buffers. Errors when the checkpoint belongs to another strategy or head size.
    pub fn resume(
        config: RoundConfig,
        mut strategy: Box<dyn Strategy>,
        checkpoint: Checkpoint,
        expected_params: usize,
    ) -> Result<Self, String> {
        if checkpoint.strategy != strategy.name() {
            return Err(format!(
                "the checkpoint was written by strategy {:?}, this coordinator runs {:?}",
                checkpoint.strategy,
                strategy.name()
            ));
        }
        if checkpoint.params.len() != expected_params {
            return Err(format!(
                "the checkpoint holds {} parameters, the configured head has {expected_params}",
                checkpoint.params.len()
            ));
        }
        strategy.restore(&checkpoint.strategy_state)?;
        let insight = match (&config.insight, checkpoint.insight.is_empty()) {
            (_, true) => None,
            (Some(c), false) if checkpoint.insight.len() == c.classes * c.hidden * c.classes => {
                Some(checkpoint.insight)
            }
            (_, false) => {
                return Err(format!(
                    "the checkpoint holds {} insight values, which do not fit this configuration",
                    checkpoint.insight.len()
                ));
            }
        };
        let prototypes = match (&config.prototypes, checkpoint.prototypes.is_empty()) {
            (_, true) => None,
            (Some(c), false) if checkpoint.prototypes.len() == c.classes * c.hidden => {
                Some(checkpoint.prototypes)
            }
            (_, false) => {
                return Err(format!(
                    "the checkpoint holds {} prototype values, which do not fit this configuration",
                    checkpoint.prototypes.len()
                ));
            }
        };
        let mut rounds = Self::new(config, strategy, Vec::new());
        rounds.params = checkpoint.params;
        rounds.next_round = checkpoint.next_round.max(1);
        rounds.last_closed = rounds.next_round - 1;
        rounds.aggregated_rounds = checkpoint.aggregated_rounds;
        rounds.insight = insight;
        rounds.prototypes = prototypes;
        if rounds.config.rounds > 0 && rounds.aggregated_rounds >= rounds.config.rounds {
            rounds.phase = Phase::Finished;
            rounds.outputs.push_back(Output::StatusChanged);
            rounds.outputs.push_back(Output::Finished);
        }
        Ok(rounds)
    }

    /// The state to save after an aggregation.
    pub fn checkpoint(&self, federation: &str) -> Checkpoint {
        Checkpoint {
            federation: federation.to_owned(),
            strategy: self.strategy.name().to_owned(),
            // The round opened after the last close is redone after a restart.
            next_round: self.last_closed + 1,
            aggregated_rounds: self.aggregated_rounds,
            params: self.params.clone(),
            strategy_state: self.strategy.state(),
            insight: self.insight.clone().unwrap_or_default(),
            prototypes: self.prototypes.clone().unwrap_or_default(),
        }
    }

    /// Rounds aggregated so far.
    pub fn aggregated_rounds(&self) -> u64 {
        self.aggregated_rounds
    }

    /// Current global parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The open round's deadline (machine time), if a round is open.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.deadline_ms)
    }

    /// Finer than [`Phase`]: `waiting`, `collecting`, `extended` (past the first deadline below
    /// quorum), `finished`.
    pub fn phase_detail(&self) -> &'static str {
        match (&self.phase, &self.open) {
            (Phase::Training, Some(open)) if open.extended => "extended",
            (Phase::Training, _) => "collecting",
            (phase, _) => phase.name(),
        }
    }

    /// The round open now, or the last one started.
    pub fn round(&self) -> u64 {
        self.open
            .as_ref()
            .map(|o| o.round)
            .unwrap_or(self.next_round.saturating_sub(1))
    }

    /// The strategy's name.
    pub fn strategy_name(&self) -> &str {
        self.strategy.name()
    }

    /// The strategy's solver, if it has one.
    pub fn strategy_solver(&self) -> Option<&str> {
        self.strategy.solver()
    }

    /// The configuration.
    pub fn config(&self) -> &RoundConfig {
        &self.config
    }

    /// Clients known to be online.
    pub fn online(&self) -> &BTreeSet<String> {
        &self.online
    }

    /// Clients selected in the open round.
    pub fn selected(&self) -> usize {
        self.open.as_ref().map(|o| o.selected.len()).unwrap_or(0)
    }

    /// Updates accepted in the open round.
    pub fn reported(&self) -> usize {
        self.open.as_ref().map(|o| o.accepted.len()).unwrap_or(0)
    }

    /// All rejections since start, by reason.
    pub fn rejected_total(&self) -> &BTreeMap<&'static str, u64> {
        &self.rejected_total
    }

    /// The last round's report.
    pub fn last_report(&self) -> Option<&RoundReport> {
        self.last_report.as_ref()
    }

    /// A client's retained status said it is (or is no longer) online.
    ///
    /// With authentication on, a device without a key is never selected: its status is
    /// rejected as `unknown_device`.
    pub fn handle_client_status(&mut self, client: &str, online: bool, now_ms: u64) {
        if self.unknown_device(client) {
            if online {
                let detail = "status from a device without a key; not selected".to_owned();
                self.reject(client, Rejection::UnknownDevice, detail);
            }
            return;
        }
        let changed = if online {
            self.online.insert(client.to_owned())
        } else {
            self.online.remove(client)
        };
        if changed {
            self.outputs.push_back(Output::StatusChanged);
        }
        if self.phase == Phase::Waiting {
            self.try_start(now_ms);
        }
    }

    /// Starts rounds once enough clients are online; call once after construction too.
    pub fn start(&mut self, now_ms: u64) {
        if self.phase == Phase::Waiting {
            self.try_start(now_ms);
        }
    }

    /// A payload arrived on `client`'s update topic.
    pub fn handle_packet(&mut self, client: &str, payload: &[u8], now_ms: u64) {
        if let Some(open) = self.open.as_mut() {
            open.bytes_up += payload.len() as u64;
        }
        // Unknown devices are turned away before their chunks take reassembly memory.
        if self.unknown_device(client) {
            let detail = "update from a device without a key".to_owned();
            self.reject(client, Rejection::UnknownDevice, detail);
            return;
        }
        let message = match self.decode(payload) {
            Ok(Message::Chunk(chunk)) => match self.reassembler.push(client, chunk, now_ms) {
                Ok(Some(frame)) => self.decode(&frame).and_then(|m| match m {
                    Message::Chunk(_) => {
                        Err(DecodeError::Malformed("a chunk inside chunks".into()))
                    }
                    other => Ok(other),
                }),
                Ok(None) => return,
                Err(e) => Err(e),
            },
            other => other,
        };
        let update = message
            .map_err(|e| (Rejection::of_decode(&e), e.to_string()))
            .and_then(|m| self.authenticated_update(client, m));
        match update {
            Ok(update) => self.handle_update(client, update, now_ms),
            Err((reason, detail)) => self.reject(client, reason, detail),
        }
    }

    /// With device keys, whether `client` has none.
    fn unknown_device(&self, client: &str) -> bool {
        (self.config.auth.as_ref()).is_some_and(|keys| !keys.contains_key(client))
    }

    /// Decodes a frame; with device keys, a plain update is refused without decoding its body
    /// (`authenticated_update` then rejects it as `unauthenticated`).
    fn decode(&self, bytes: &[u8]) -> Result<Message, DecodeError> {
        let frame = fedge_wire::decode_frame(bytes)?;
        if self.config.auth.is_some() && frame.kind == fedge_wire::Kind::ClientUpdate {
            return Err(DecodeError::Unauthenticated);
        }
        fedge_wire::decode_checked(frame)
    }

    /// The update inside a decoded message, its tag checked when authentication is on.
    fn authenticated_update(
        &self,
        client: &str,
        message: Message,
    ) -> Result<ClientUpdate, (Rejection, String)> {
        let sealed = match message {
            Message::ClientUpdate(update) => {
                return match self.config.auth {
                    None => Ok(update),
                    Some(_) => Err((
                        Rejection::Unauthenticated,
                        "update without a tag; this federation requires device keys".into(),
                    )),
                };
            }
            Message::Sealed(sealed) => sealed,
            Message::RoundTask(_) => {
                return Err((Rejection::WrongKind, "round task on an update topic".into()));
            }
            Message::Chunk(_) => {
                return Err((
                    Rejection::WrongKind,
                    "chunk where a message was expected".into(),
                ));
            }
        };
        let inner = match self.config.auth.as_deref() {
            // Without keys there is nothing to check a tag against.
            None => &sealed.inner[..],
            Some(keys) => {
                let key = keys
                    .get(client)
                    .ok_or_else(|| (Rejection::UnknownDevice, "device without a key".to_owned()))?;
                sealed
                    .open(client, key)
                    .map_err(|e| (Rejection::BadTag, e.to_string()))?
            }
        };
        match fedge_wire::decode(inner) {
            Ok(Message::ClientUpdate(update)) => Ok(update),
            Ok(_) => Err((
                Rejection::WrongKind,
                "sealed message is not an update".into(),
            )),
            Err(e) => Err((Rejection::of_decode(&e), e.to_string())),
        }
    }

    fn handle_update(&mut self, client: &str, update: ClientUpdate, now_ms: u64) {
        if let Err((reason, detail)) = self.validate(client, &update) {
            self.reject(client, reason, detail);
            return;
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let n = update.num_samples;
        if let Err(e) = open.accepted.push_tensor(client, n, &update.delta) {
            self.reject(client, Rejection::MemoryBudget, e.to_string());
            return;
        }
        if let Some(stats) = &update.class_stats
            && self.config.insight.is_some()
        {
            open.class_stats.insert(
                client.to_owned(),
                (stats.counts.clone(), stats.means.to_vec()),
            );
        }
        if let Some(stats) = &update.prototypes
            && self.config.prototypes.is_some()
        {
            open.prototypes.insert(
                client.to_owned(),
                (stats.counts.clone(), stats.means.to_vec()),
            );
        }
        open.val
            .push((update.metrics.val_accuracy, update.metrics.val_samples));
        open.loss.push((update.metrics.train_loss, n));
        if self.config.journal {
            let round = open.round;
            let frame = fedge_wire::encode(&Message::ClientUpdate(update));
            let client = client.to_owned();
            self.outputs.push_back(Output::Journal(Record::Accepted {
                round,
                client,
                frame,
            }));
        }
        self.outputs.push_back(Output::StatusChanged);
        if open.accepted.len() == open.selected.len() {
            self.close_round(now_ms);
        }
    }

    fn validate(&self, client: &str, update: &ClientUpdate) -> Result<(), (Rejection, String)> {
        if update.client_id != client {
            return Err((
                Rejection::ClientMismatch,
                format!("update names {:?}", update.client_id),
            ));
        }
        let Some(open) = self.open.as_ref() else {
            return Err((
                Rejection::WrongRound,
                format!("round {} but no round is open", update.round),
            ));
        };
        if update.round != open.round {
            return Err((
                Rejection::WrongRound,
                format!("round {} but round {} is open", update.round, open.round),
            ));
        }
        if !open.selected.contains(client) {
            return Err((
                Rejection::NotSelected,
                format!("not selected for round {}", open.round),
            ));
        }
        if open.accepted.contains(client) {
            return Err((
                Rejection::Duplicate,
                format!("second update for round {}", open.round),
            ));
        }
        if update.delta.len() != self.params.len() {
            return Err((
                Rejection::Shape,
                format!(
                    "{} parameters, the head has {}",
                    update.delta.len(),
                    self.params.len()
                ),
            ));
        }
        if let Some(i) = update.delta.first_non_finite() {
            return Err((Rejection::NonFinite, format!("parameter {i} is not finite")));
        }
        if update.num_samples == 0 {
            return Err((Rejection::NoSamples, "zero samples".into()));
        }
        if self.config.max_update_norm > 0.0 {
            let norm = update.delta.l2_norm();
            if norm > self.config.max_update_norm {
                return Err((
                    Rejection::Norm,
                    format!(
                        "delta norm {norm:.4} above max_update_norm {}",
                        self.config.max_update_norm
                    ),
                ));
            }
        }
        if let Some(insight) = &self.config.insight {
            let shape = (insight.hidden, insight.classes);
            let what = "FedDIM class statistics";
            check_class_stats(update.class_stats.as_ref(), shape, Rejection::Insight, what)?;
        }
        if let Some(prototypes) = &self.config.prototypes {
            let shape = (prototypes.hidden, prototypes.classes);
            let what = "FedDDL prototypes";
            check_class_stats(
                update.prototypes.as_ref(),
                shape,
                Rejection::Prototypes,
                what,
            )?;
        }
        Ok(())
    }

    fn reject(&mut self, client: &str, reason: Rejection, detail: String) {
        let mut open = self.open.take();
        self.count_rejection(open.as_mut(), client, reason, detail);
        self.open = open;
    }

    /// The bookkeeping of a rejection: totals, the round's counts and failures (when `open` is
    /// the round it happened in), the output for the driver.
    fn count_rejection(
        &mut self,
        open: Option<&mut OpenRound>,
        client: &str,
        reason: Rejection,
        detail: String,
    ) {
        *self.rejected_total.entry(reason.name()).or_default() += 1;
        if let Some(open) = open {
            *open.rejected.entry(reason.name()).or_default() += 1;
            if open.selected.contains(client) {
                open.failures.push(Failure {
                    client: client.to_owned(),
                    reason: reason.name().to_owned(),
                });
            }
        }
        self.outputs.push_back(Output::Rejected {
            client: client.to_owned(),
            reason,
            detail,
        });
        self.outputs.push_back(Output::StatusChanged);
    }

    /// Time passed; closes rounds whose deadline is due and drops stale partial chunks.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        for sender in self.reassembler.expire_senders(now_ms) {
            let detail = "chunk stream did not complete in time".to_owned();
            self.reject(&sender, Rejection::Incomplete, detail);
        }
        let Some(open) = self.open.as_mut() else {
            if self.phase == Phase::Waiting {
                self.try_start(now_ms);
            }
            return;
        };
        if now_ms < open.deadline_ms {
            return;
        }
        if open.accepted.len() >= self.config.min_updates.max(1) {
            self.close_round(now_ms);
        } else if !open.extended {
            open.extended = true;
            open.deadline_ms = now_ms + self.config.round_timeout_ms;
            self.outputs.push_back(Output::StatusChanged);
        } else {
            self.close_round(now_ms);
        }
    }

    /// Asks for the open round's task to be published again (after a broker reconnect).
    pub fn republish_task(&mut self) {
        if let Some(open) = &self.open {
            self.outputs.push_back(Output::PublishTask {
                round: open.round,
                frame: open.task_frame.clone(),
            });
        }
    }

    /// Asks for the status document to be published again.
    pub fn touch_status(&mut self) {
        self.outputs.push_back(Output::StatusChanged);
    }

    /// When `handle_timeout` must be called next, if ever.
    pub fn poll_timeout(&self) -> Option<u64> {
        let deadline = self.open.as_ref().map(|o| o.deadline_ms);
        match (deadline, self.reassembler.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    fn try_start(&mut self, now_ms: u64) {
        if self.online.len() >= self.config.min_clients.max(1) {
            self.open_round(now_ms);
        }
    }

    fn open_round(&mut self, now_ms: u64) {
        let online = self.online.len();
        // The epsilon keeps 0.3 × 10 at 3 despite f32 rounding.
        let share =
            (self.config.fraction.clamp(0.0, 1.0) as f64 * online as f64 - 1e-6).ceil() as usize;
        let wanted = share
            .max(self.config.min_clients.min(online))
            .max(1)
            .min(online);
        if online == 0 {
            self.phase = Phase::Waiting;
            self.outputs.push_back(Output::StatusChanged);
            return;
        }
        let mut selected: Vec<String> = self
            .online
            .iter()
            .cloned()
            .choose_multiple(&mut self.rng, wanted);
        selected.sort();
        self.open_with(selected, now_ms);
    }

    /// Resumes the round a journal says was open, with its clients and the updates it had
    /// accepted (validated again); returns the round and how many updates it holds. Does
    /// nothing (`None`) unless the machine is waiting and the journal's round is not older than
    /// the next round (a journal left from before the last checkpoint is stale).
    pub fn restore_round(&mut self, log: OpenRoundLog, now_ms: u64) -> Option<(u64, usize)> {
        let (round, mut selected) = log.opened?;
        if self.phase != Phase::Waiting || round < self.next_round || selected.is_empty() {
            return None;
        }
        selected.sort();
        selected.dedup();
        self.next_round = round;
        self.last_closed = round - 1;
        self.open_with(selected, now_ms);
        for (client, frame) in log.accepted {
            if self.open.is_none() {
                break;
            }
            match fedge_wire::decode(&frame) {
                Ok(Message::ClientUpdate(update)) => self.handle_update(&client, update, now_ms),
                _ => self.reject(
                    &client,
                    Rejection::Malformed,
                    "damaged journal record".into(),
                ),
            }
        }
        // Every selected client may already be in: the round then closed above.
        Some((round, self.open.as_ref().map_or(0, |o| o.accepted.len())))
    }

    /// Opens the next round with these (sorted) clients.
    fn open_with(&mut self, selected: Vec<String>, now_ms: u64) {
        // Every selected client may be halfway through a chunked update at the same moment (a
        // fleet answering one task); with room for fewer, the oldest partial updates would be
        // evicted and time out as `incomplete` (seen with 1,000 devices and the journal on).
        let room = (2 * selected.len()).max(fedge_wire::DEFAULT_MAX_PENDING);
        self.reassembler.set_max_pending(room);
        let round = self.next_round;
        self.next_round += 1;
        let task = RoundTask {
            round,
            selected: selected.clone(),
            params: TensorF32::from_slice(&self.params),
            train: self.strategy.configure_round(round, &self.config.train),
            deadline_ms: self.config.round_timeout_ms,
            insight: self.insight_tensor(),
            prototypes: self.prototypes_tensor(),
        };
        let mut frame = fedge_wire::encode(&Message::RoundTask(task));
        if let Some(keys) = &self.config.auth {
            // Selected clients are online, and only devices with keys go online.
            let signers: Vec<(&str, &DeviceKey)> = selected
                .iter()
                .filter_map(|c| keys.get(c).map(|k| (c.as_str(), k)))
                .collect();
            frame = fedge_wire::seal(frame, &signers);
        }
        let held = UpdatesConfig {
            dots: self.strategy.needs_dots(),
            budget_bytes: self.config.update_memory_bytes,
            ..UpdatesConfig::default()
        };
        self.open = Some(OpenRound {
            round,
            accepted: RoundUpdates::reusing(
                std::mem::take(&mut self.spare_arena),
                self.params.len(),
                selected.len(),
                held,
            ),
            failures: Vec::new(),
            class_stats: BTreeMap::new(),
            prototypes: BTreeMap::new(),
            selected: selected.into_iter().collect(),
            val: Vec::new(),
            loss: Vec::new(),
            opened_ms: now_ms,
            deadline_ms: now_ms + self.config.round_timeout_ms,
            extended: false,
            task_frame: frame.clone(),
            bytes_up: 0,
            rejected: BTreeMap::new(),
        });
        self.phase = Phase::Training;
        if self.config.journal {
            let selected = self
                .open
                .as_ref()
                .map(|o| o.selected.iter().cloned().collect());
            self.outputs.push_back(Output::Journal(Record::Opened {
                round,
                selected: selected.unwrap_or_default(),
            }));
        }
        self.outputs.push_back(Output::PublishTask { round, frame });
        self.outputs.push_back(Output::StatusChanged);
    }

    fn close_round(&mut self, now_ms: u64) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        self.last_closed = open.round;
        // Views are in client order whatever the arrival order, so a seeded run reproduces.
        open.accepted.finish();
        self.drop_norm_outliers(&mut open);
        let aggregated =
            !open.accepted.is_empty() && open.accepted.len() >= self.config.min_updates.max(1);
        let reported: Vec<String> = (0..open.accepted.len())
            .map(|i| open.accepted.client(i).to_owned())
            .collect();
        let mut aggregation = None;
        if aggregated {
            for client in &open.selected {
                let failed = open.failures.iter().any(|f| &f.client == client);
                if !failed && !open.accepted.contains(client) {
                    open.failures.push(Failure {
                        client: client.clone(),
                        reason: "no_report".into(),
                    });
                }
            }
            let result = self
                .strategy
                .aggregate(&self.params, &open.accepted, &open.failures);
            self.update_insight(&open);
            self.update_prototypes(&open);
            self.params = result.params;
            aggregation = Some(result.report);
        }
        let mut failures: BTreeMap<String, String> = open
            .selected
            .iter()
            .filter(|c| !reported.contains(c))
            .map(|c| (c.clone(), "no_report".to_owned()))
            .collect();
        for failure in &open.failures {
            if let Some(reason) = failures.get_mut(&failure.client) {
                reason.clone_from(&failure.reason);
            }
        }
        let report = RoundReport {
            round: open.round,
            aggregated,
            failures,
            selected: open.selected.iter().cloned().collect(),
            reported,
            rejected: open.rejected,
            bytes_up: open.bytes_up,
            bytes_down: open.task_frame.len() as u64 * open.selected.len() as u64,
            duration_ms: now_ms.saturating_sub(open.opened_ms),
            source_val_accuracy: weighted_mean(&open.val),
            train_loss: weighted_mean(&open.loss),
            params_norm: l2_norm(&self.params),
            aggregation,
        };
        self.spare_arena = open.accepted.into_arena();
        self.last_report = Some(report.clone());
        self.outputs.push_back(Output::RoundEnded(report));
        if aggregated {
            self.aggregated_rounds += 1;
        }
        let done = self.config.rounds > 0 && self.aggregated_rounds >= self.config.rounds;
        if done {
            self.phase = Phase::Finished;
            self.outputs.push_back(Output::StatusChanged);
            self.outputs.push_back(Output::Finished);
        } else {
            self.phase = Phase::Waiting;
            self.try_start(now_ms);
            if self.phase == Phase::Waiting {
                self.outputs.push_back(Output::StatusChanged);
            }
        }
    }
}

impl Rounds {
    /// Drops updates whose norm passes `max_norm_ratio` × the round's median norm.
    fn drop_norm_outliers(&mut self, open: &mut OpenRound) {
        let ratio = self.config.max_norm_ratio;
        if ratio <= 0.0 || open.accepted.len() < 3 {
            return;
        }
        let norms = crate::robust::norms(&open.accepted);
        let bound = ratio * crate::robust::median(&norms);
        if norms.iter().all(|n| *n <= bound) {
            return;
        }
        let held = &open.accepted;
        let dropped: Vec<(String, f64)> = (0..held.len())
            .filter(|&i| norms[i] > bound)
            .map(|i| (held.client(i).to_owned(), norms[i]))
            .collect();
        let keep: Vec<bool> = norms.iter().map(|n| *n <= bound).collect();
        open.accepted.retain(&keep);
        for (client, norm) in dropped {
            open.class_stats.remove(&client);
            open.prototypes.remove(&client);
            let detail = format!("delta norm {norm:.4} above {ratio} × the round's median norm");
            self.count_rejection(Some(open), &client, Rejection::Norm, detail);
        }
    }

    /// The global `Ī` as sent with a task.
    fn insight_tensor(&self) -> Option<TensorF32> {
        let (config, insight) = (self.config.insight.as_ref()?, self.insight.as_ref()?);
        let (h, k) = (config.hidden as u32, config.classes as u32);
        TensorF32::new(vec![k, h, k], insight).ok()
    }

    /// FedDIM: rebuilds each client's class insight from `W_g + ΔW_c` (the parameters before
    /// this round's aggregation) and its class means, and folds the round into `Ī`.
    fn update_insight(&mut self, open: &OpenRound) {
        let Some(config) = self.config.insight else {
            return;
        };
        let (h, k) = (config.hidden, config.classes);
        let len = self.params.len();
        let Some(start) = len.checked_sub(k + h * k) else {
            return;
        };
        let w_range = start..start + h * k;
        let clients: Vec<ClientInsight> = (0..open.accepted.len())
            .filter_map(|i| {
                let (counts, means) = open.class_stats.get(open.accepted.client(i))?;
                let delta = &open.accepted.delta(i)[w_range.clone()];
                let classifier = self.params[w_range.clone()]
                    .iter()
                    .zip(delta)
                    .map(|(g, d)| g + d)
                    .collect();
                Some(ClientInsight {
                    classifier,
                    counts: counts.clone(),
                    means: means.clone(),
                })
            })
            .collect();
        if clients.is_empty() {
            return;
        }
        let (round, seen) = round_insight(&clients, &config);
        self.insight = Some(update_global(
            self.insight.as_deref(),
            &round,
            &seen,
            &config,
        ));
    }

    /// FedDDL's global `U_G` as sent with a task.
    fn prototypes_tensor(&self) -> Option<TensorF32> {
        let (config, values) = (self.config.prototypes.as_ref()?, self.prototypes.as_ref()?);
        TensorF32::new(vec![config.classes as u32, config.hidden as u32], values).ok()
    }

    /// FedDDL: folds the accepted clients' local prototypes into `U_G`.
    fn update_prototypes(&mut self, open: &OpenRound) {
        let Some(config) = self.config.prototypes else {
            return;
        };
        let clients: Vec<(&[u32], &[f32])> = (0..open.accepted.len())
            .filter_map(|i| open.prototypes.get(open.accepted.client(i)))
            .map(|(counts, means)| (counts.as_slice(), means.as_slice()))
            .collect();
        if !clients.is_empty() {
            let previous = self.prototypes.as_deref();
            self.prototypes = Some(average_prototypes(previous, &clients, &config));
        }
    }

    /// FedDDL's global prototypes `U_G`, if any.
    pub fn prototypes(&self) -> Option<&[f32]> {
        self.prototypes.as_deref()
    }

    /// FedDIM's global `Ī`, if any.
    pub fn insight(&self) -> Option<&[f32]> {
        self.insight.as_deref()
    }
}

/// Checks per-class statistics of shape `(H, K)`: present, `K` counts, `K·H` finite means.
fn check_class_stats(
    stats: Option<&ClassStats>,
    (h, k): (usize, usize),
    reason: Rejection,
    what: &str,
) -> Result<(), (Rejection, String)> {
    let Some(stats) = stats else {
        return Err((reason, format!("no {what}")));
    };
    if stats.counts.len() != k || stats.means.len() != k * h {
        return Err((
            reason,
            format!(
                "{what}: {} class counts and {} mean values, expected {k} and {}",
                stats.counts.len(),
                stats.means.len(),
                k * h
            ),
        ));
    }
    if let Some(i) = stats.means.first_non_finite() {
        return Err((
            Rejection::NonFinite,
            format!("{what}: mean {i} is not finite"),
        ));
    }
    Ok(())
}

fn weighted_mean(values: &[(f32, u32)]) -> Option<f32> {
    let total: f64 = values.iter().map(|(_, n)| *n as f64).sum();
    (total > 0.0).then(|| {
        (values
            .iter()
            .map(|(v, n)| *v as f64 * *n as f64)
            .sum::<f64>()
            / total) as f32
    })
}

/// Euclidean norm, accumulated in f64.
pub fn l2_norm(values: &[f32]) -> f32 {
    l2_norm_f64(values) as f32
}

/// Euclidean norm, accumulated and returned in f64.
pub fn l2_norm_f64(values: &[f32]) -> f64 {
    values
        .iter()
        .map(|v| (*v as f64) * (*v as f64))
        .sum::<f64>()
        .sqrt()
}

#[cfg(test)]
#[path = "round_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "round_guard_tests.rs"]
mod guard_tests;

#[cfg(test)]
#[path = "round_restart_tests.rs"]
mod restart_tests;
