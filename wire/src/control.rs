//! Operator commands on `fedge/<f>/coordinator/control`: JSON, tagged with the operator's key
//! (HMAC-SHA256 in a domain of its own, bound to the federation), numbered so that a command
//! is applied once.
//!
//! ```json
//! {"federation": "plant-7", "seq": 1764115200000, "command": "ban", "client": "cam-07",
//!  "tag": "<64 hex digits>"}
//! ```
//!
//! `seq` must grow from one command to the next (`fedge-coordinator ctl` uses the time in
//! milliseconds); the coordinator refuses a command whose `seq` is not above the last it
//! applied, or more than [`MAX_AGE_MS`] older than its clock, so a captured command cannot be
//! replayed, even after a restart.

use serde::{Deserialize, Serialize};

use crate::DeviceKey;

/// Oldest command the coordinator applies, relative to its clock.
pub const MAX_AGE_MS: u64 = 5 * 60 * 1000;

/// How far ahead of the coordinator's clock a command may be dated (clock skew between the
/// operator's machine and the coordinator). A command dated further ahead is refused: applied,
/// its `seq` would lock out every later command until the clock caught up.
pub const MAX_AHEAD_MS: u64 = 60 * 1000;

/// What the operator asks. Applied at round boundaries: a round that is open finishes first.
/// One spelling in JSON and on `fedge-coordinator ctl`'s command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
pub enum Command {
    /// Open no new round until `resume`.
    Pause,
    /// Open rounds again.
    Resume,
    /// Select `client` for no round, and reject its updates as `not_selected`.
    Ban {
        /// The device.
        client: String,
    },
    /// Let `client` take part again.
    Unban {
        /// The device.
        client: String,
    },
    /// Run `rounds` rounds in all (finishing at the next boundary when that many are done).
    SetRounds {
        /// The new total.
        rounds: u64,
    },
    /// Name this backbone in the next round tasks (`fedge-coordinator publish-backbone`
    /// distributes it first): devices that take the federation's backbone fetch it.
    SetBackbone {
        /// The card's name.
        name: String,
        /// SHA-256 of its ONNX file, 64 hex digits.
        sha256: String,
    },
    /// Once the federation has run its rounds, start a new run of `rounds` more rounds from
    /// the model as it stands (a coordinator with `stay_up = true` waits for this).
    NewRun {
        /// Rounds in the new run.
        rounds: u64,
    },
    /// Serve an earlier release again, on every device at once, and hold it (no candidate
    /// is promoted) until `promote`: the release before the one served now, or the one named
    /// by its round or the start of its SHA-256 (at least 8 hex digits). Taken at once, not at
    /// a round boundary.
    Rollback {
        /// A round number, or the start of a release's SHA-256; absent: the one before.
        release: Option<String>,
    },
    /// Promote the latest candidate now, past the evaluation gate and the canary stage, and
    /// let the gate promote again after a rollback. Taken at once.
    Promote,
    /// Forget the pooled feature statistics; the rounds that follow build them again.
    ///
    /// For `feature_norm = "pooled"` or `"balanced"`, after a change of backbone or of the
    /// sites' data (or a damaged pool): the next round task carries no pooled summary (a
    /// training device standardises with its own rows' class-balanced statistics), and the
    /// pool is built again from the updates of that round on, older rounds forgotten. A round
    /// open now finishes with the summary it was sent. A site aggregator refuses it: send it to
    /// the global coordinator.
    ResetPool,
    /// Change nothing; print the coordinator's status.
    Status,
}

/// What became of the last operator command the coordinator took (its tag, federation and
/// number checked), as its status says: `ctl` waits for its own number here, and prints the
/// reason of a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandOutcome {
    /// The command's number (`ControlMessage::seq`).
    pub seq: u64,
    /// The command, as it travels.
    #[serde(flatten)]
    pub command: Command,
    /// Applied (`true`), or refused and nothing changed (`false`, counted as `bad_control`).
    pub applied: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The run `new-run` started (16 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// A command as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlMessage {
    /// The federation it is for.
    pub federation: String,
    /// Grows from one command to the next.
    pub seq: u64,
    /// What to do.
    #[serde(flatten)]
    pub command: Command,
    /// HMAC-SHA256 of the fields above with the operator key, hex.
    pub tag: String,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not a command.
    #[error("not an operator command: {0}")]
    Malformed(String),
    /// For another federation.
    #[error("a command for federation {0:?}")]
    Federation(String),
    /// The tag does not verify with the operator key.
    #[error(
        "the command's tag does not verify with the operator key (give ctl the key file the \
         coordinator's [auth] operator_key_file names)"
    )]
    Tag,
    /// Already applied, or older than the last one applied.
    #[error("seq {seq} is not above {last}, the last command applied (a replay?)")]
    Replay {
        /// The command's.
        seq: u64,
        /// The last applied.
        last: u64,
    },
    /// Dated more than [`MAX_AHEAD_MS`] ahead of the coordinator's clock.
    #[error(
        "seq {seq} is more than a minute ahead of the coordinator's clock ({now}): check the \
         operator machine's clock (ctl uses it)"
    )]
    Future {
        /// The command's.
        seq: u64,
        /// The coordinator's clock, in ms since the Unix epoch.
        now: u64,
    },
    /// Older than [`MAX_AGE_MS`].
    #[error("seq {seq} is more than 5 minutes older than the coordinator's clock ({now})")]
    Stale {
        /// The command's.
        seq: u64,
        /// The coordinator's clock, in ms since the Unix epoch.
        now: u64,
    },
}

fn signed_bytes(federation: &str, seq: u64, command: &Command) -> Vec<u8> {
    let mut bytes = format!("{federation}\0{seq}\0").into_bytes();
    // A derived enum always serialises.
    bytes.extend(serde_json::to_vec(command).unwrap_or_default());
    bytes
}

impl ControlMessage {
    /// `command` for `federation`, numbered `seq` and tagged with `key`.
    pub fn signed(federation: &str, seq: u64, command: Command, key: &DeviceKey) -> Self {
        let tag = key.control_tag(federation, &signed_bytes(federation, seq, &command));
        Self {
            federation: federation.into(),
            seq,
            command,
            tag: crate::hex::encode(&tag),
        }
    }

    /// The command in `payload` if it is for `federation`, tagged with `key`, above `last_seq`
    /// and not older than [`MAX_AGE_MS`] at `now_ms` (ms since the Unix epoch).
    pub fn open(
        payload: &[u8],
        federation: &str,
        key: &DeviceKey,
        last_seq: u64,
        now_ms: u64,
    ) -> Result<Self, ControlError> {
        let message: Self =
            serde_json::from_slice(payload).map_err(|e| ControlError::Malformed(e.to_string()))?;
        if message.federation != federation {
            return Err(ControlError::Federation(message.federation));
        }
        let tag = DeviceKey::from_hex(&message.tag).map_err(|_| ControlError::Tag)?;
        let signed = signed_bytes(federation, message.seq, &message.command);
        if !key.verify_control(federation, &signed, tag.as_bytes()) {
            return Err(ControlError::Tag);
        }
        if message.seq <= last_seq {
            let (seq, last) = (message.seq, last_seq);
            return Err(ControlError::Replay { seq, last });
        }
        if message.seq > now_ms.saturating_add(MAX_AHEAD_MS) {
            let seq = message.seq;
            return Err(ControlError::Future { seq, now: now_ms });
        }
        if message.seq.saturating_add(MAX_AGE_MS) < now_ms {
            let seq = message.seq;
            return Err(ControlError::Stale { seq, now: now_ms });
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_command_opens_once_and_nothing_else_does() {
        let key = DeviceKey::from_bytes([7; 32]);
        let now = 1_764_115_200_000;
        let ban = Command::Ban {
            client: "cam-07".into(),
        };
        let message = ControlMessage::signed("plant-7", now, ban.clone(), &key);
        let json = serde_json::to_vec(&message).unwrap();
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(
            text.contains("\"command\":\"ban\",\"client\":\"cam-07\""),
            "{text}"
        );
        let opened = ControlMessage::open(&json, "plant-7", &key, 0, now).unwrap();
        assert_eq!(opened.command, ban);
        // Replayed, another federation, another key, a changed field, stale, junk.
        let replay = ControlMessage::open(&json, "plant-7", &key, now, now);
        assert!(matches!(replay, Err(ControlError::Replay { .. })));
        let other = ControlMessage::open(&json, "plant-8", &key, 0, now);
        assert!(matches!(other, Err(ControlError::Federation(_))));
        let wrong = DeviceKey::from_bytes([8; 32]);
        let forged = ControlMessage::open(&json, "plant-7", &wrong, 0, now);
        assert_eq!(forged, Err(ControlError::Tag));
        let changed = text.replace("cam-07", "cam-08");
        let changed = ControlMessage::open(changed.as_bytes(), "plant-7", &key, 0, now);
        assert_eq!(changed, Err(ControlError::Tag));
        let later = now + MAX_AGE_MS + 1;
        let stale = ControlMessage::open(&json, "plant-7", &key, 0, later);
        assert!(matches!(stale, Err(ControlError::Stale { .. })));
        // Dated ten minutes ahead: applied, it would lock out every command until then.
        let early = now - 10 * 60 * 1000;
        let ahead = ControlMessage::open(&json, "plant-7", &key, 0, early);
        assert!(
            matches!(ahead, Err(ControlError::Future { .. })),
            "{ahead:?}"
        );
        let skewed = ControlMessage::open(&json, "plant-7", &key, 0, now - 30_000);
        assert!(skewed.is_ok(), "half a minute of skew is tolerated");
        let junk = ControlMessage::open(b"{\"command\":\"pause\"}", "plant-7", &key, 0, now);
        assert!(matches!(junk, Err(ControlError::Malformed(_))));
    }

    #[test]
    fn every_command_has_one_spelling() {
        for (command, json) in [
            (Command::Pause, r#"{"command":"pause"}"#),
            (Command::Resume, r#"{"command":"resume"}"#),
            (
                Command::SetRounds { rounds: 9 },
                r#"{"command":"set-rounds","rounds":9}"#,
            ),
            (Command::Status, r#"{"command":"status"}"#),
            (Command::ResetPool, r#"{"command":"reset-pool"}"#),
            (
                Command::SetBackbone {
                    name: "m".into(),
                    sha256: "ab".into(),
                },
                r#"{"command":"set-backbone","name":"m","sha256":"ab"}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&command).unwrap(), json);
        }
    }
}

#[cfg(test)]
mod outcome_tests {
    use super::*;

    #[test]
    fn a_command_outcome_reads_back_as_written() {
        for command in [
            Command::Status,
            Command::NewRun { rounds: 5 },
            Command::Rollback { release: None },
        ] {
            let outcome = CommandOutcome {
                seq: 7,
                command,
                applied: false,
                refused: Some("no".into()),
                run: None,
            };
            let json = serde_json::to_string(&outcome).unwrap();
            let back: CommandOutcome = serde_json::from_str(&json).unwrap();
            assert_eq!(back, outcome, "{json}");
        }
    }
}
