//! Operator control: pause and resume, ban and unban devices, change the number of rounds.
//! The driver checks a command's tag, federation and number (`fedge_wire::control`); the
//! machine applies it here, at round boundaries: a round that is open finishes as it started,
//! the next round opens (or not) under the new settings. The retained status says what holds.

use fedge_wire::control::Command;

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
            Command::SetRounds { rounds } => self.config.rounds = *rounds,
            Command::SetBackbone { name, sha256 } => match fedge_wire::hex::decode_array(sha256) {
                Some(digest) => {
                    self.config.backbone = name.clone();
                    self.config.backbone_sha256 = Some(digest);
                }
                None => {
                    let detail = format!("set-backbone {sha256:?}: not 64 hex digits");
                    return self.reject_control(detail);
                }
            },
            Command::Status => {}
        }
        tracing::info!(?command, "operator command applied");
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
        self.reject("operator", Rejection::BadControl, detail);
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
        self.online.retain(|c| keys.contains_key(c));
        self.status_stamps.retain(|c, _| keys.contains_key(c));
        tracing::info!(devices = keys.len(), "device keys reloaded");
        self.config.auth = Some(std::sync::Arc::new(keys));
        self.outputs.push_back(Output::StatusChanged);
    }

    /// What the operator has set.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The online devices a round may select: not banned.
    pub(super) fn eligible(&self) -> Vec<String> {
        let banned = &self.control.banned;
        self.online
            .iter()
            .filter(|c| !banned.contains(*c) && self.admits_protocol(c))
            .cloned()
            .collect()
    }
}
