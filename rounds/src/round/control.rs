//! Operator control: pause and resume, ban and unban devices, change the number of rounds,
//! start a new run, roll back or promote a release, reset the pooled feature summary.
//! The driver checks a command's tag, federation and number (`fedge_wire::control`), asks the
//! machine what the command will leave ([`Rounds::settings_after`], which refuses a command
//! that cannot be applied), keeps that in the state folder, and only then has the machine
//! apply it ([`Rounds::try_control`]): a crash between the two finds the command kept, never
//! its effects published without it. Commands take effect at round boundaries: a round that is
//! open finishes as it started, the next round opens (or not) under the new settings. The
//! retained status says what holds.

use std::collections::BTreeSet;

use fedge_wire::control::Command;
use serde::{Deserialize, Serialize};

use super::Rounds;
use super::types::{Control, Output, Phase, Rejection};

impl Rounds {
    /// Applies an operator command whose tag and number the driver checked; one that cannot be
    /// applied is refused as `bad_control` ([`Rounds::reject_control`]).
    pub fn apply_control(&mut self, command: &Command, now_ms: u64) {
        if let Err(detail) = self.try_control(command, now_ms) {
            self.reject_control(detail);
        }
    }

    /// Why `command` cannot be applied now, if it cannot (what does not depend on the release
    /// pipeline: `rollback` and `promote` are judged as they are applied).
    fn check_control(&self, command: &Command) -> Result<(), String> {
        match command {
            // With keys, a device is one of them: a ban of any other id is a typo.
            Command::Ban { client } => match &self.config.auth {
                Some(keys) if !keys.contains_key(client) => Err(format!(
                    "ban {client:?}: no device of that id in [auth] keys_file; a device's id is \
                     its client_id"
                )),
                _ => Ok(()),
            },
            Command::SetBackbone { sha256, .. } => fedge_wire::hex::decode_array::<32>(sha256)
                .map(drop)
                .ok_or_else(|| format!("set-backbone {sha256:?}: not 64 hex digits")),
            Command::NewRun { rounds } => self.new_run_total(*rounds).map(drop),
            Command::ResetPool if self.is_site() => Err(
                "reset-pool: a site aggregator keeps no pool of its own (it passes the global \
                 coordinator's on to its devices): send reset-pool to the global coordinator"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// What the operator settings will be once `command`, numbered `seq`, is applied, or why
    /// it cannot be (nothing changes): what the driver keeps before applying it. A `rollback`
    /// pins only once the pipeline took it (kept again after [`Rounds::try_control`]); a
    /// `promote` unpins even when no candidate waits.
    pub fn settings_after(&self, command: &Command, seq: u64) -> Result<OperatorSettings, String> {
        self.check_control(command)?;
        let mut settings = self.operator_settings(seq);
        match command {
            Command::Pause => settings.paused = true,
            Command::Resume => settings.paused = false,
            Command::Ban { client } => {
                settings.banned.insert(client.clone());
            }
            Command::Unban { client } => {
                settings.banned.remove(client);
            }
            Command::SetRounds { rounds } => settings.rounds = Some(*rounds),
            Command::SetBackbone { name, sha256 } => {
                // Checked above; spelled as the settings keep it (lower-case hex).
                let digest = fedge_wire::hex::decode_array::<32>(sha256).unwrap_or_default();
                settings.backbone = Some((name.clone(), fedge_wire::hex::encode(&digest)));
            }
            Command::NewRun { rounds } => {
                settings.runs.push(self.ended_run());
                settings.run_start = Some((self.next_round, self.aggregated_rounds));
                settings.rounds = Some(self.new_run_total(*rounds)?);
                // The number `new_run` will take: derived from the same state.
                settings.run = Some(format!("{:016x}", self.next_run_id()));
            }
            Command::ResetPool => settings.pool_reset = Some(self.aggregated_rounds),
            Command::Promote => settings.pinned = false,
            Command::Rollback { .. } | Command::Status => {}
        }
        Ok(settings)
    }

    /// Applies an operator command whose tag and number the driver checked, or says why it
    /// cannot be applied, changing nothing (but that a refused `promote` unpins, as the release
    /// pipeline does); the caller counts the refusal ([`Rounds::reject_control`]).
    pub fn try_control(&mut self, command: &Command, now_ms: u64) -> Result<(), String> {
        self.check_control(command)?;
        match command {
            Command::Pause => self.control.paused = true,
            Command::Resume => self.control.paused = false,
            Command::Ban { client } => {
                if !self.online.contains(client) {
                    tracing::warn!(%client, "banned a device that is not online: it will be selected for no round when it comes");
                }
                self.control.banned.insert(client.clone());
            }
            Command::Unban { client } => {
                self.control.banned.remove(client);
            }
            Command::SetRounds { rounds } => {
                self.config.rounds = *rounds;
                self.control.rounds = Some(*rounds);
            }
            Command::SetBackbone { name, sha256 } => {
                let digest = fedge_wire::hex::decode_array(sha256).unwrap_or_default();
                self.config.backbone = name.clone();
                self.config.backbone_sha256 = Some(digest);
                self.control.backbone = Some((name.clone(), digest));
            }
            Command::NewRun { rounds } => self.new_run(*rounds)?,
            Command::Rollback { release } => {
                self.release_control(Some(release.as_deref()), now_ms)?;
            }
            Command::Promote => self.release_control(None, now_ms)?,
            Command::ResetPool => {
                // pooled.rs owns the pool
                self.pooled = None;
                self.control.pool_reset = Some(self.aggregated_rounds);
                tracing::info!(
                    aggregated = self.aggregated_rounds,
                    "pooled feature summary reset: the next tasks carry none, and it is built \
                     again from the rounds that follow"
                );
            }
            Command::Status => {}
        }
        // As it travels (JSON), not in Rust's Debug syntax.
        let command = serde_json::to_string(command).unwrap_or_default();
        tracing::info!(%command, "operator command applied");
        if self.phase == Phase::Waiting {
            let done = self.config.rounds > 0 && self.aggregated_rounds >= self.config.rounds;
            if done {
                self.phase = Phase::Finished;
                self.outputs.push_back(Output::Finished);
            } else {
                self.try_start(now_ms);
            }
        }
        self.outputs.push_back(Output::StatusChanged);
        Ok(())
    }

    /// A command on the control topic that cannot be applied: counted and reported as
    /// `bad_control`, nothing else changes.
    pub fn reject_control(&mut self, detail: String) {
        self.control.refused = Some(detail.clone());
        self.reject("operator", Rejection::BadControl, detail);
        self.outputs.push_back(Output::StatusChanged);
    }

    /// Notes what became of the operator command numbered `seq` (applied, or refused with
    /// why), for the status that `ctl` waits for; a `new-run` names the run it started.
    pub fn note_command(&mut self, seq: u64, command: &Command, outcome: &Result<(), String>) {
        let started = matches!(command, Command::NewRun { .. }) && outcome.is_ok();
        self.control.last_command = Some(fedge_wire::control::CommandOutcome {
            seq,
            command: command.clone(),
            applied: outcome.is_ok(),
            refused: outcome.clone().err(),
            run: started.then(|| format!("{:016x}", self.config.run)),
        });
        self.outputs.push_back(Output::StatusChanged);
    }

    /// An enrolment request that cannot be answered with a key: counted and reported as
    /// `bad_enrolment` against the client it names, nothing else changes.
    pub fn reject_enrolment(&mut self, client: &str, detail: String) {
        self.reject(client, Rejection::BadEnrolment, detail);
    }

    /// Replaces the device keys (the keys file changed: a device enrolled or revoked). A device
    /// no longer listed goes offline at once, is selected for no round, and its next update or
    /// status is rejected as `unknown_device`; an update already accepted stays. Without
    /// authentication (no keys file) nothing changes.
    pub fn set_device_keys(&mut self, keys: super::types::DeviceKeys) {
        if self.config.auth.is_none() {
            return;
        }
        if let Some(old) = &self.config.auth {
            for gone in old.keys().filter(|c| !keys.contains_key(*c)) {
                self.outputs
                    .push_back(Output::ClearDeviceStatus(gone.clone()));
            }
        }
        self.online.retain(|c| keys.contains_key(c));
        self.status_stamps.retain(|c, _| keys.contains_key(c));
        // A revoked device is neither a canary nor a voter from now on.
        self.releases.forget_unless(|c| keys.contains_key(c));
        tracing::info!(devices = keys.len(), "device keys reloaded");
        self.config.auth = Some(std::sync::Arc::new(keys));
        self.outputs.push_back(Output::StatusChanged);
    }

    /// The total of rounds once a new run of `rounds` more starts, or why it cannot start:
    /// the run is not over, no rounds, the privacy budget spent, or more rounds than a count
    /// holds.
    fn new_run_total(&self, rounds: u64) -> Result<u64, String> {
        if self.phase != Phase::Finished {
            return Err(format!(
                "new-run: the run is not over ({} of {} rounds aggregated); set-rounds changes \
                 its length",
                self.aggregated_rounds, self.config.rounds
            ));
        }
        if rounds == 0 {
            return Err("new-run 0: give the number of rounds to run".into());
        }
        if self.privacy.is_some() && self.privacy_exhausted() {
            return Err("new-run: the privacy budget (target_epsilon) is spent".into());
        }
        self.aggregated_rounds.checked_add(rounds).ok_or_else(|| {
            format!(
                "new-run {rounds}: at most {} more rounds can be counted after the {} \
                 aggregated; give fewer",
                u64::MAX - self.aggregated_rounds,
                self.aggregated_rounds
            )
        })
    }

    /// The number of the run a `new-run` would start now ([`run_id`]).
    fn next_run_id(&self) -> u64 {
        let federation = &self.config.federation;
        let (next, aggregated) = (self.next_round, self.aggregated_rounds);
        run_id(
            federation,
            self.config.run,
            next,
            aggregated,
            &self.control.runs,
        )
    }

    /// The run that ends at a `new-run`, as the history keeps it.
    fn ended_run(&self) -> fedge_wire::RunSummary {
        let (first_round, before) = self.control.run_start;
        fedge_wire::RunSummary {
            run: format!("{:016x}", self.config.run),
            first_round,
            last_round: self.last_closed,
            aggregated: self.aggregated_rounds.saturating_sub(before),
        }
    }

    /// Starts a new run of `rounds` rounds from the model as it stands, once the federation
    /// has finished: a new run number (updates answering the old run are replays), the ended
    /// run kept in the history. The rounds' numbers, the strategy's state and the privacy
    /// accountant carry on.
    fn new_run(&mut self, rounds: u64) -> Result<(), String> {
        let total = self.new_run_total(rounds)?;
        // Before the history grows: the number `settings_after` planned.
        let run = self.next_run_id();
        let ended = self.ended_run();
        self.control.runs.push(ended);
        self.config.run = run;
        // Buffered: the old run's tasks are over (their updates would be `replay`); every
        // device is free, and participation intervals start again.
        self.in_flight = Default::default();
        self.contributed.clear();
        self.control.run_start = (self.next_round, self.aggregated_rounds);
        self.config.rounds = total;
        self.control.rounds = Some(total);
        self.phase = Phase::Waiting;
        tracing::info!(run = %format!("{run:016x}"), rounds, "new run");
        Ok(())
    }

    /// What the operator has set.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// What the operator's commands set, as kept across a restart (with `last_seq`, the
    /// number of the last command taken).
    pub fn operator_settings(&self, last_seq: u64) -> OperatorSettings {
        OperatorSettings {
            last_seq,
            paused: self.control.paused,
            banned: self.control.banned.clone(),
            rounds: self.control.rounds,
            backbone: (self.control.backbone.as_ref())
                .map(|(name, digest)| (name.clone(), fedge_wire::hex::encode(digest))),
            runs: self.control.runs.clone(),
            run_start: Some(self.control.run_start),
            pinned: self.releases.pinned(),
            pool_reset: self.control.pool_reset,
            // Only a run `new-run` started: the first is the checkpoint's.
            run: (!self.control.runs.is_empty()).then(|| format!("{:016x}", self.config.run)),
        }
    }

    /// Puts back what the operator had set before a restart; called before [`Rounds::start`].
    /// The settings override the configuration's rounds and backbone. Refuses a backbone
    /// digest that is not 64 hex digits (a damaged file), changing nothing.
    pub fn restore_operator_settings(&mut self, saved: &OperatorSettings) -> Result<(), String> {
        let backbone = match &saved.backbone {
            Some((name, hex)) => match fedge_wire::hex::decode_array(hex) {
                Some(digest) => Some((name.clone(), digest)),
                None => return Err(format!("backbone sha256 {hex:?} is not 64 hex digits")),
            },
            None => None,
        };
        let run = match &saved.run {
            Some(hex) => match fedge_wire::hex::decode_array::<8>(hex) {
                Some(bytes) => Some(u64::from_be_bytes(bytes)),
                None => return Err(format!("run {hex:?} is not 16 hex digits")),
            },
            None => None,
        };
        // A checkpoint saved before the last `new-run` is of the run it ended: the new one goes
        // on (devices that took its tasks have left the old one).
        let ended = |run: u64| saved.runs.iter().any(|r| r.run == format!("{run:016x}"));
        if let Some(run) = run
            && ended(self.config.run)
        {
            self.config.run = run;
        }
        self.control.paused = saved.paused;
        self.control.banned = saved.banned.clone();
        if let Some(rounds) = saved.rounds {
            self.config.rounds = rounds;
            self.control.rounds = Some(rounds);
        }
        if let Some((name, digest)) = backbone {
            self.config.backbone = name.clone();
            self.config.backbone_sha256 = Some(digest);
            self.control.backbone = Some((name, digest));
        }
        self.control.runs = saved.runs.clone();
        self.releases.pin(saved.pinned);
        // A checkpoint saved by the time of the last `reset-pool` holds the pool from before
        // it; one saved after an aggregation since holds the pool built again.
        if let Some(at) = saved.pool_reset {
            self.control.pool_reset = Some(at);
            if self.aggregated_rounds <= at {
                // pooled.rs owns the pool
                self.pooled = None;
            }
        }
        if let Some(start) = saved.run_start {
            self.control.run_start = start;
        }
        // A checkpoint past the configuration's rounds but short of the operator's (set-rounds,
        // new-run) is not finished.
        let short = self.aggregated_rounds < self.config.rounds || self.config.rounds == 0;
        if self.phase == Phase::Finished && short && !self.privacy_exhausted() {
            self.phase = Phase::Waiting;
            self.outputs.retain(|o| !matches!(o, Output::Finished));
        }
        Ok(())
    }

    /// Why no round is open while the machine waits, in words for the status; `None` while a
    /// round is open or the federation finished.
    pub fn waiting_reason(&self) -> Option<String> {
        if self.phase != Phase::Waiting {
            return None;
        }
        if self.control.paused {
            return Some("paused by the operator (fedge-coordinator ctl resume)".into());
        }
        if self.config.relay.is_some() {
            return Some("waiting for the global coordinator's next task".into());
        }
        let eligible = self.eligible().len();
        let needed = self.config.min_clients.max(1);
        if eligible >= needed {
            return None;
        }
        let banned = (self.online.iter())
            .filter(|c| self.control.banned.contains(*c))
            .count();
        let resting = (self.online.iter())
            .filter(|c| !self.control.banned.contains(*c) && self.rests(c))
            .count();
        let old = self.online.len() - banned - resting - eligible;
        let mut why = format!(
            "{eligible} device(s) can be selected, min_clients is {needed} ({} online",
            self.online.len()
        );
        if banned > 0 {
            why.push_str(&format!(", {banned} of them banned"));
        }
        if resting > 0 {
            why.push_str(&format!(
                ", {resting} resting after failing max_missed_rounds rounds in a row"
            ));
        }
        if old > 0 {
            why.push_str(&format!(
                ", {old} on the previous protocol after its window closed"
            ));
        }
        why.push(')');
        Some(why)
    }

    /// The online devices a round may select: not banned, not resting.
    pub(super) fn eligible(&self) -> Vec<String> {
        let banned = &self.control.banned;
        self.online
            .iter()
            .filter(|c| !banned.contains(*c) && !self.rests(c) && self.admits_protocol(c))
            .cloned()
            .collect()
    }

    /// Whether `client` failed `max_missed_rounds` rounds in a row, has not reported healthy
    /// since, and its rest has not ended.
    pub fn rests(&self, client: &str) -> bool {
        let limit = self.config.max_missed_rounds;
        let failed = limit > 0 && self.control.missed.get(client).is_some_and(|&n| n >= limit);
        let until = self
            .control
            .rest_until
            .get(client)
            .copied()
            .unwrap_or(u64::MAX);
        failed && self.control.clock_ms < until
    }

    /// When the first resting device's rest ends, while the machine waits for devices.
    pub(super) fn next_rest_end(&self) -> Option<u64> {
        (self.phase == Phase::Waiting).then_some(())?;
        (self.control.rest_until.iter())
            .filter(|(c, _)| self.rests(c))
            .map(|(_, &until)| until)
            .min()
    }

    /// The devices resting now.
    pub fn resting(&self) -> Vec<String> {
        (self.control.missed.keys())
            .filter(|c| self.rests(c))
            .cloned()
            .collect()
    }

    /// `client` reported healthy: it may be selected again.
    pub(super) fn healthy(&mut self, client: &str) {
        self.control.rest_until.remove(client);
        if self.control.missed.remove(client).is_some() && self.phase == Phase::Waiting {
            self.outputs.push_back(Output::StatusChanged);
        }
    }
}

/// What operator commands set, kept in the state folder across a restart so that a restart
/// neither unbans a device, nor resumes a paused federation, nor forgets `set-rounds` and
/// `set-backbone`, nor lets a captured command be applied a second time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorSettings {
    /// Number of the last command taken: a command must be numbered above it.
    pub last_seq: u64,
    /// No new round opens.
    pub paused: bool,
    /// Devices no round selects.
    #[serde(default)]
    pub banned: BTreeSet<String>,
    /// `set-rounds`, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u64>,
    /// `set-backbone`, if given: the card's name and its SHA-256 in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backbone: Option<(String, String)>,
    /// Runs that ended (`new-run`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<fedge_wire::RunSummary>,
    /// Where the current run began: its first round and the rounds aggregated before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_start: Option<(u64, u64)>,
    /// `rollback` pinned the release served, until `promote`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// `reset-pool`: the rounds aggregated when the pooled feature summary was last reset. A
    /// checkpoint of no more rounds still holds the pool from before, which a restart forgets
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_reset: Option<u64>,
    /// The run the last `new-run` started (16 hex digits): a restart from a checkpoint saved
    /// before it (of the run it ended) goes on with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// The number of the run a `new-run` starts now: a digest of the federation, the run that
/// ends, the round it starts at and the runs that ended, never one of those runs. It depends on
/// nothing a restart resets (a generator seeded from `seed` would draw an earlier run's number
/// again, whose rounds every device has answered), and a restart computes the same number the
/// driver kept before applying the command. The run tells runs apart; it guards no secret.
fn run_id(
    federation: &str,
    ended: u64,
    next_round: u64,
    aggregated: u64,
    runs: &[fedge_wire::RunSummary],
) -> u64 {
    use sha2::{Digest, Sha256};
    let taken = |run: u64| run == ended || runs.iter().any(|r| r.run == format!("{run:016x}"));
    (0u64..)
        .map(|attempt| {
            let mut hash = Sha256::new();
            hash.update(b"fedge new-run\0");
            hash.update(federation.as_bytes());
            for n in [ended, next_round, aggregated, runs.len() as u64, attempt] {
                hash.update(n.to_be_bytes());
            }
            let digest = hash.finalize();
            u64::from_be_bytes(digest[..8].try_into().unwrap_or_default())
        })
        .find(|run| !taken(*run))
        .unwrap_or(ended.wrapping_add(1))
}
