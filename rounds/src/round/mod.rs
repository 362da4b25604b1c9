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
//!
//! # Files
//!
//! This file holds the machine and its public methods, grouped as getters, `handle_*` inputs
//! and `poll_*` outputs. [`types`] is its vocabulary (settings, phases, rejections, outputs),
//! [`saved`] what it hands out to be saved (checkpoint, journal records), `admit` who may send
//! and how far a payload is decoded before its sender is trusted, `validate` the checks of an
//! update, `guard` the round-end bounds on weights and on the aggregate, `open` the open
//! round's record, `lifecycle` the opening and closing of rounds, and `journaled` the inputs
//! that come from the journal (a round restored at start, a record that could not be written),
//! and `accept` an update taken into the open round.

mod accept;
mod admit;
mod buffered;
mod control;
mod guard;
mod journaled;
mod ledger;
mod lifecycle;
mod open;
mod pooled;
mod privacy;
mod relay;
mod release;
mod resume;
pub mod saved;
pub mod types;
mod upgrade;
mod validate;
mod views;

pub use saved::{
    Checkpoint, OpenRoundLog, OpenedRound, Record, SavedAccountant, params_fingerprint,
};
pub use types::{
    DEFAULT_MAX_NORM_RATIO, DEFAULT_MAX_WEIGHT_RATIO, DeviceKeys, MAX_ABS_VALUE, NormClip, Output,
    Phase, PrivacySpent, Rejection, RelayConfig, RelayError, RoundConfig, RoundReport,
};

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use fedge_wire::{DecodeError, Message, Reassembler};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::objectives::fedddl::GlobalPrototypes;
use crate::objectives::feddim::GlobalInsight;
use crate::strategy::Strategy;
use crate::updates::Arena;
use crate::updates::spill::SpillFile;
pub use buffered::TOP_UP_DELAY_MS;
pub use control::OperatorSettings;
use open::OpenRound;
pub use resume::ResumeError;

/// The round state machine.
pub struct Rounds {
    config: RoundConfig,
    strategy: Box<dyn Strategy>,
    params: Vec<f32>,
    online: BTreeSet<String>,
    control: types::Control,
    phase: Phase,
    next_round: u64,
    open: Option<OpenRound>,
    rejected_total: BTreeMap<&'static str, u64>,
    reassembler: Reassembler,
    rng: StdRng,
    outputs: VecDeque<Output>,
    last_report: Option<RoundReport>,
    aggregated_rounds: u64,
    last_closed: u64,
    /// The last round's delta arena (with the spill file, if the driver gave one), reused by
    /// the next round.
    spare_arena: Arena,
    /// FedDIM's server side (the global `Ī`), when devices train with FedDIM.
    insight: Option<GlobalInsight>,
    /// FedDDL's server side (the global `U_G`), when devices train with FedDDL.
    prototypes: Option<GlobalPrototypes>,
    /// The federation's pooled feature summary (`pooled`), once devices sent theirs.
    pooled: Option<fedge_wire::FeatureSummary>,
    /// True while [`Rounds::restore_round`] replays a journal: what it replays is in the
    /// journal already and is not written again.
    restoring: bool,
    /// With keys: the time stamp of each device's last believed status.
    status_stamps: BTreeMap<String, String>,
    /// The latest accuracy each evaluation-only device reported.
    site_accuracy: BTreeMap<String, f32>,
    /// A site aggregator's global task to answer (see `relay`).
    relayed: Option<types::Relayed>,
    /// A site aggregator's journal of an open round, kept until its global task comes again.
    deferred_log: Option<OpenRoundLog>,
    /// Central DP's accountant and the open round's draw (`ledger`, used by `privacy`).
    privacy: Option<ledger::Ledger>,
    /// From aggregate to served release (`release.rs`).
    releases: crate::release::ReleaseFlow,
    /// Buffered mode: the devices training a version (`buffered.rs`).
    in_flight: crate::buffer::InFlight,
    /// Buffered mode: accepted updates since start by staleness.
    staleness_total: Vec<u64>,
    /// Buffered mode: when the open round's task goes to the devices that came online.
    top_up_at: Option<u64>,
    /// Buffered mode: the version in which each device's last update counted.
    contributed: BTreeMap<String, u64>,
}

impl Rounds {
    /// A machine starting at round 1 from `initial` parameters.
    pub fn new(config: RoundConfig, mut strategy: Box<dyn Strategy>, initial: Vec<f32>) -> Self {
        let initial = strategy.initialize_parameters(initial);
        let rng = StdRng::seed_from_u64(config.seed);
        let reassembler =
            Reassembler::new(config.reassembly_timeout_ms, fedge_wire::MAX_MESSAGE_BYTES);
        Self {
            strategy,
            params: initial,
            online: BTreeSet::new(),
            control: types::Control::default(),
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
            insight: config.insight.map(GlobalInsight::new),
            prototypes: config.prototypes.map(GlobalPrototypes::new),
            pooled: None,
            restoring: false,
            status_stamps: BTreeMap::new(),
            site_accuracy: BTreeMap::new(),
            relayed: None,
            deferred_log: None,
            privacy: config.privacy.map(ledger::Ledger::new),
            releases: crate::release::ReleaseFlow::new(Default::default(), &config.federation),
            in_flight: Default::default(),
            staleness_total: Vec::new(),
            top_up_at: None,
            contributed: BTreeMap::new(),
            config,
        }
    }

    /// Gives the machine a spill file for the deltas of rounds that outgrow
    /// `update_memory_bytes` (see `crate::updates::spill`); the driver's side of the
    /// machine's memory. Rounds opened after the call use it: give it before clients come
    /// online.
    pub fn set_spill(&mut self, file: SpillFile) {
        self.spare_arena = Arena::with_spill(file);
    }

    /// Sets the federation name tasks carry (the driver's, from its topics); call before the
    /// first round opens.
    pub fn name_federation(&mut self, federation: &str) {
        federation.clone_into(&mut self.config.federation);
        self.releases.name_federation(federation);
    }

    /// Whether the open round's deltas are in the spill file.
    pub fn round_spilled(&self) -> bool {
        self.open.as_ref().is_some_and(|o| o.accepted.is_spilled())
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

    /// The open round's deadline (machine time), if a round is open and has one (a buffered
    /// version has none: it closes when its buffer is full).
    pub fn deadline_ms(&self) -> Option<u64> {
        if self.buffered() {
            return None;
        }
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
        if admit::unknown_device(self.config.auth.as_deref(), client) {
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
        // Back after being away: it may be selected again.
        if changed && online {
            self.healthy(client);
        }
        if changed {
            self.selected_gone(client, !online, now_ms);
        }
        if changed {
            let online = self.online.len();
            match self.online.contains(client) {
                true => tracing::info!(client = %client.escape_debug(), online, "device online"),
                false => tracing::info!(client = %client.escape_debug(), online, "device offline"),
            }
            self.outputs.push_back(Output::StatusChanged);
            if self.buffered() {
                self.buffer_status_changed(now_ms);
            }
        }
        if self.phase == Phase::Waiting {
            self.try_start(now_ms);
        }
    }

    /// A device's status document arrived on `client`'s status topic: with keys it must carry
    /// the device's tag (and be newer than the last one when it says online), else it is
    /// rejected and changes nothing; then as [`Rounds::handle_client_status`].
    pub fn handle_edge_status(
        &mut self,
        client: &str,
        status: &fedge_wire::EdgeStatus,
        now_ms: u64,
    ) {
        let auth = self.config.auth.as_deref();
        let last = self.status_stamps.get(client).map(String::as_str);
        let federation = self.config.federation.as_str();
        match admit::status(auth, federation, client, status, last) {
            Ok(admit::Believed::Fresh) => {}
            Ok(admit::Believed::Again) => return,
            Err((reason, detail)) => {
                if reason != Rejection::UnknownDevice || status.online {
                    self.reject(client, reason, detail);
                }
                return;
            }
        }
        if auth.is_some() && status.online {
            self.status_stamps
                .insert(client.to_owned(), status.updated_at.clone());
        }
        self.note_protocol(client, status);
        // A fresh status without an error: a resting device may be selected again.
        if status.online && status.last_error.is_empty() {
            self.healthy(client);
        }
        // Only a score of a release this coordinator made: a retained status of another run
        // (or made up) says nothing of this one.
        if let (Some(evaluation), Some(sha)) = (&status.evaluation, &status.evaluated)
            && self.releases.knows(sha)
        {
            self.record_site_accuracy(client, evaluation.accuracy);
        }
        self.release_status(client, status, now_ms);
        if let (true, Some(declined)) = (status.online, &status.declined) {
            self.handle_declined(client, declined, now_ms);
        }
        // An evaluation-only device watches the model; it is never selected to train.
        let trains = status.online && status.role == fedge_wire::Role::Train;
        self.handle_client_status(client, trains, now_ms);
    }

    /// A device status that could not be read (too large, not JSON): counted as a rejection,
    /// and the device stays as it was.
    pub fn handle_bad_status(&mut self, client: &str, reason: Rejection, detail: String) {
        self.reject(client, reason, detail);
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
        if self.refused_protocol(client, payload) {
            return;
        }
        // Unknown devices are turned away before their chunks take reassembly memory.
        if admit::unknown_device(self.config.auth.as_deref(), client) {
            let detail = "update from a device without a key".to_owned();
            self.reject(client, Rejection::UnknownDevice, detail);
            return;
        }
        let message = match admit::decode(self.config.auth.as_deref(), payload) {
            Ok(Message::Chunk(chunk)) => {
                // Checked before the chunk takes reassembly memory or displaces another.
                let auth = self.config.auth.as_deref();
                let in_flight = self.buffered().then_some(&self.in_flight);
                if let Err((reason, detail)) =
                    admit::chunk(auth, self.open.as_ref(), in_flight, client, &chunk)
                {
                    self.reject(client, reason, detail);
                    return;
                }
                match self.reassemble(client, chunk, now_ms) {
                    Ok(Some(message)) => Ok(message),
                    Ok(None) => return,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        let auth = self.config.auth.as_deref();
        let update = message
            .map_err(|e| (Rejection::of_decode(&e), e.to_string()))
            .and_then(|m| admit::authenticated_update(auth, client, m));
        match update {
            Ok(update) => self.handle_update(client, update, now_ms),
            Err((reason, detail)) => self.reject(client, reason, detail),
        }
    }

    /// Adds an admitted chunk; the whole message once its last chunk is in.
    fn reassemble(
        &mut self,
        client: &str,
        chunk: fedge_wire::Chunk,
        now_ms: u64,
    ) -> Result<Option<Message>, DecodeError> {
        let auth = self.config.auth.as_deref();
        match self.reassembler.push(client, chunk, now_ms) {
            Ok(Some(frame)) => admit::decode(auth, &frame).and_then(|m| match m {
                Message::Chunk(_) => Err(DecodeError::Malformed("a chunk inside chunks".into())),
                other => Ok(Some(other)),
            }),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the open round's records go to the journal: asked for, not replaying it, and not
    /// under central DP (a journaled round is drawn afresh there, so the journal would only keep
    /// raw, un-noised updates on disk).
    fn journaling(&self) -> bool {
        self.config.journal && !self.restoring && self.privacy.is_none()
    }

    /// A selected device said it cannot train the open round: it counts as that round's
    /// failure `declined` (towards `max_missed_rounds`), and the round closes as soon as every
    /// other selected device has reported, instead of at its deadline.
    fn handle_declined(&mut self, client: &str, declined: &fedge_wire::Declined, now_ms: u64) {
        let run = format!("{:016x}", self.config.run);
        if self.buffered() {
            if declined.run == run && self.in_flight.round_of(client) == Some(declined.round) {
                self.in_flight.finish(client);
                self.buffer_status_changed(now_ms);
                self.outputs.push_back(Output::StatusChanged);
            }
            return;
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if declined.run != run || declined.round != open.round || !open.decline(client) {
            return;
        }
        tracing::warn!(
            client = %client.escape_debug(),
            round = open.round,
            reason = %declined.reason.escape_debug(),
            "device declined the round"
        );
        self.outputs.push_back(Output::StatusChanged);
        if open.all_answered(self.config.min_updates.max(1)) {
            self.close_round(now_ms);
        }
    }

    /// A selected device went offline (its Last Will) or came back while the round waits for
    /// it: gone, it is its failure `offline`, and the round closes at once when it was the
    /// last one missing and the others make a quorum (else it waits for its deadline, for the
    /// device to come back with its update, which still counts).
    fn selected_gone(&mut self, client: &str, gone: bool, now_ms: u64) {
        let quorum = self.config.min_updates.max(1);
        let buffered = self.buffered();
        let Some(open) = self.open.as_mut().filter(|_| !buffered) else {
            return;
        };
        if !open.set_gone(client, gone) || !gone {
            return;
        }
        let round = open.round;
        tracing::info!(client = %client.escape_debug(), round, "a selected device went offline");
        if open.all_answered(quorum) {
            self.close_round(now_ms);
        }
    }

    /// Time passed; closes rounds whose deadline is due and drops stale partial chunks.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.control.clock_ms = self.control.clock_ms.max(now_ms);
        for sender in self.reassembler.expire_senders(now_ms) {
            let detail = "chunk stream did not complete in time".to_owned();
            self.reject(&sender, Rejection::Incomplete, detail);
        }
        self.release_tick(now_ms);
        let buffered = self.buffered();
        let Some(open) = self.open.as_mut() else {
            if self.phase == Phase::Waiting {
                self.try_start(now_ms);
            }
            return;
        };
        if now_ms < open.deadline_ms {
            return;
        }
        if buffered {
            self.top_up(now_ms);
            return;
        }
        if open.accepted.len() >= self.config.min_updates.max(1) {
            self.close_round(now_ms);
        } else if !open.extended && self.config.relay.is_none() {
            // A site's round has no time to give: the global round closes on its own clock.
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
        // `u64::MAX`: a buffered version with nothing to wait for.
        let deadline = (self.open.as_ref().map(|o| o.deadline_ms)).filter(|&d| d != u64::MAX);
        [
            deadline,
            self.reassembler.next_expiry(),
            self.releases.next_deadline(),
            self.next_rest_end(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// FedDDL's global prototypes `U_G`, if any.
    pub fn prototypes(&self) -> Option<&[f32]> {
        self.prototypes.as_ref()?.global()
    }

    /// FedDIM's global `Ī`, if any.
    pub fn insight(&self) -> Option<&[f32]> {
        self.insight.as_ref()?.global()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod objectives_tests;

#[cfg(test)]
mod guard_tests;

#[cfg(test)]
mod restart_tests;

#[cfg(test)]
mod hostile_tests;

#[cfg(test)]
mod release_tests;

#[cfg(test)]
mod relay_tests;

#[cfg(test)]
mod task_codec_tests;

#[cfg(test)]
mod control_tests;

#[cfg(test)]
mod upgrade_tests;

#[cfg(test)]
mod buffered_tests;
#[cfg(test)]
mod pooled_tests;
#[cfg(test)]
mod privacy_tests;
