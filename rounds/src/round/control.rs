//! Operator control: pause and resume, ban and unban devices, change the number of rounds.
//! The driver checks a command's tag, federation and number (`fedge_wire::control`); the
//! machine applies it here, at round boundaries: a round that is open finishes as it started,
//! the next round opens (or not) under the new settings. The retained status says what holds.

use std::collections::BTreeSet;

use fedge_wire::control::Command;
use serde::{Deserialize, Serialize};

use super::Rounds;
use super::types::{Control, Output, Phase, Rejection};

impl Rounds {
    /// Applies an operator command whose tag and number the driver checked.
    pub fn apply_control(&mut self, command: &Command, now_ms: u64) {
        match command {
            Command::Pause => self.control.paused = true,
            Command::Resume => self.control.paused = false,
            Command::Ban { client } => {
                // With keys, a device is one of them: a ban of any other id is a typo.
                if let Some(keys) = &self.config.auth
                    && !keys.contains_key(client)
                {
                    let detail = format!(
                        "ban {client:?}: no device of that id in [auth] keys_file; a device's id \
                         is its client_id"
                    );
                    return self.reject_control(detail);
                }
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
            Command::SetBackbone { name, sha256 } => match fedge_wire::hex::decode_array(sha256) {
                Some(digest) => {
                    self.config.backbone = name.clone();
                    self.config.backbone_sha256 = Some(digest);
                    self.control.backbone = Some((name.clone(), digest));
                }
                None => {
                    let detail = format!("set-backbone {sha256:?}: not 64 hex digits");
                    return self.reject_control(detail);
                }
            },
            Command::NewRun { rounds } => {
                if let Err(detail) = self.new_run(*rounds) {
                    return self.reject_control(detail);
                }
            }
            Command::Rollback { release } => {
                if let Err(detail) = self.release_control(Some(release.as_deref()), now_ms) {
                    return self.reject_control(detail);
                }
            }
            Command::Promote => {
                if let Err(detail) = self.release_control(None, now_ms) {
                    return self.reject_control(detail);
                }
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
    }

    /// A command on the control topic that cannot be applied: counted and reported as
    /// `bad_control`, nothing else changes.
    pub fn reject_control(&mut self, detail: String) {
        self.control.refused = Some(detail.clone());
        self.reject("operator", Rejection::BadControl, detail);
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
        tracing::info!(devices = keys.len(), "device keys reloaded");
        self.config.auth = Some(std::sync::Arc::new(keys));
        self.outputs.push_back(Output::StatusChanged);
    }

    /// Starts a new run of `rounds` rounds from the model as it stands, once the federation
    /// has finished: a new run number (updates answering the old run are replays), the ended
    /// run kept in the history. The rounds' numbers, the strategy's state and the privacy
    /// accountant carry on.
    fn new_run(&mut self, rounds: u64) -> Result<(), String> {
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
        let (first_round, before) = self.control.run_start;
        self.control.runs.push(fedge_wire::RunSummary {
            run: format!("{:016x}", self.config.run),
            first_round,
            last_round: self.last_closed,
            aggregated: self.aggregated_rounds - before,
        });
        // Any value but the old one does: the run tells runs apart, it guards no secret.
        let mut run = rand::RngCore::next_u64(&mut self.rng) ^ self.config.run;
        if run == self.config.run {
            run = run.wrapping_add(1);
        }
        self.config.run = run;
        // Buffered: the old run's tasks are over (their updates would be `replay`); every
        // device is free, and participation intervals start again.
        self.in_flight = Default::default();
        self.contributed.clear();
        self.control.run_start = (self.next_round, self.aggregated_rounds);
        self.config.rounds = self.aggregated_rounds + rounds;
        self.control.rounds = Some(self.config.rounds);
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

    /// Whether `client` failed `max_missed_rounds` rounds in a row and has not reported
    /// healthy since.
    pub fn rests(&self, client: &str) -> bool {
        let limit = self.config.max_missed_rounds;
        limit > 0 && self.control.missed.get(client).is_some_and(|&n| n >= limit)
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
}
