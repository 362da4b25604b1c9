//! One line of the audit trail: the events, the line's bytes and hash, and the `who` values.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// What follows a line's content: `,"hash":"` 64 hex digits `"}`.
pub(super) const HASH_SUFFIX_LEN: usize = 9 + 64 + 2;

impl Event {
    /// An operator command taken, as the trail keeps it: applied or refused, and the run a
    /// `new-run` started (from what the machine noted, `noted`).
    pub fn control(
        message: fedge_wire::control::ControlMessage,
        outcome: Result<(), String>,
        noted: Option<&fedge_wire::control::CommandOutcome>,
    ) -> Self {
        let run = noted
            .filter(|n| n.seq == message.seq)
            .and_then(|n| n.run.clone());
        Event::Control {
            command_seq: message.seq,
            command: message.command,
            refused: outcome.err(),
            run,
        }
    }
}

/// What happened. One kebab-case spelling in `event`, the fields beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// `fedge-coordinator run` started (or restarted) a federation.
    RunStarted {
        /// The federation's name.
        federation: String,
        /// The run, 16 hex digits (a resumed checkpoint's own).
        run: String,
        /// `global` or `site`.
        role: String,
        /// SHA-256 of the configuration file's bytes.
        config_sha256: Option<String>,
        /// The round it resumes at, when it resumed from a checkpoint.
        resumed_at: Option<u64>,
    },
    /// A device key came into force.
    Enrolled {
        /// The device.
        client: String,
        /// `token` (`fedge-edge enroll`) or `keys-file` (a key added to the file).
        how: String,
    },
    /// A device key left the keys file: the device is served and heard no more.
    Revoked {
        /// The device.
        client: String,
    },
    /// An operator command taken (`fedge-coordinator ctl`): its tag and number checked, then
    /// applied, or refused with why (nothing changed).
    Control {
        /// The command's number.
        command_seq: u64,
        /// The command, as it travels.
        command: fedge_wire::control::Command,
        /// Why it was refused; absent when it was applied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
        /// The run a `new-run` started (16 hex digits).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
    },
    /// A backbone distributed with `publish-backbone`.
    BackbonePublished {
        /// The card's name.
        name: String,
        /// SHA-256 of its ONNX file.
        sha256: String,
    },
    /// A model released on `model/current` (and kept as `model.bin`): what devices serve from
    /// then on.
    Released {
        /// The round whose aggregate it is.
        round: u64,
        /// The run, 16 hex digits.
        run: String,
        /// The release's SHA-256 of its parameters (`ModelRelease::sha256`).
        sha256: String,
        /// The clients whose updates that round aggregated (empty for a relayed release).
        built_by: Vec<String>,
        /// A site aggregator relaying the global release: the global coordinator's trail
        /// names who built it.
        relayed: bool,
    },
    /// Central DP's accountant after an aggregated round.
    PrivacyStep {
        /// The round.
        round: u64,
        /// ε spent so far (against an observer who reads the tasks).
        epsilon: f64,
        /// ε with amplification by subsampling.
        amplified_epsilon: f64,
        /// The configured δ.
        delta: f64,
        /// Rounds composed.
        rounds: u64,
    },
    /// A torn last line (a crash mid-append) was cut off before this append.
    TornTailCut {
        /// Bytes cut.
        bytes: u64,
    },
    /// An aggregate proposed for release (`[release] mode = "gated"`, or held by a rollback).
    Candidate {
        /// The round.
        round: u64,
        /// Its SHA-256.
        sha256: String,
    },
    /// The evaluation gate's verdict on a candidate.
    GateVerdict {
        /// The candidate's round.
        #[serde(default)]
        round: u64,
        /// The candidate's SHA-256.
        sha256: String,
        /// Passed (promoted) or not (held).
        passed: bool,
        /// The candidate's mean accuracy on the evaluation-only sites, in points.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        candidate_accuracy: Option<f64>,
        /// The served release's, on the same sites.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serving_accuracy: Option<f64>,
        /// Why.
        reason: String,
    },
    /// A candidate promoted: it goes to a canary share first, or to every device.
    Promoted {
        /// Its SHA-256.
        sha256: String,
    },
    /// A staged rollout's step: the canary devices, or `*` for every device.
    Rollout {
        /// The release.
        sha256: String,
        /// The devices it goes to.
        devices: Vec<String>,
    },
    /// Back to an earlier release: `ctl rollback`, or a canary that failed.
    Rollback {
        /// The release returned to.
        sha256: String,
        /// Why.
        reason: String,
    },
}

/// One line as written, without its hash (which follows as the last member).
#[derive(Serialize)]
struct Unsigned<'a> {
    seq: u64,
    at: &'a str,
    who: &'a str,
    #[serde(flatten)]
    event: &'a Event,
    prev: &'a str,
}

/// One line read back.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Entry {
    /// Its number, from 1.
    pub seq: u64,
    /// When, RFC 3339 UTC.
    pub at: String,
    /// Who (see the module's documentation).
    pub who: String,
    /// What.
    #[serde(flatten)]
    pub event: Event,
}

/// The `who` of a device.
pub fn device(client: &str) -> String {
    format!("device:{client}")
}

/// The `who` of an operator command tagged with `key`.
pub fn operator(key: &fedge_wire::DeviceKey) -> String {
    format!("operator:{}", operator_id(key))
}

/// 16 hex digits naming an operator key: the start of the SHA-256 of the key (a hash of a
/// 256-bit random key reveals nothing of it).
pub fn operator_id(key: &fedge_wire::DeviceKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    fedge_wire::hex::encode(&digest[..8])
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    fedge_wire::hex::encode(&Sha256::digest(bytes))
}

/// The bytes of one line (no newline): `seq`, `at`, `who`, the event, `prev`, then `hash`.
pub fn encode_line(seq: u64, at: &str, who: &str, event: &Event, prev: &str) -> Vec<u8> {
    let unsigned = Unsigned {
        seq,
        at,
        who,
        event,
        prev,
    };
    // Strings, numbers and derived enums always serialise (a non-finite ε becomes null).
    let mut line = serde_json::to_vec(&unsigned).unwrap_or_default();
    let hash = sha256_hex(&line);
    line.pop();
    line.extend_from_slice(format!(",\"hash\":\"{hash}\"}}").as_bytes());
    line
}

/// What verification reads of each line besides its bytes.
#[derive(Deserialize)]
pub(super) struct Head {
    pub(super) seq: u64,
    pub(super) at: String,
    pub(super) prev: String,
}

/// A line's hashed content (the line without its `hash` member) and that hash.
pub(super) fn split_hash(line: &[u8]) -> Option<(Vec<u8>, &str)> {
    let cut = line.len().checked_sub(HASH_SUFFIX_LEN)?;
    let suffix = &line[cut..];
    let hash = suffix.strip_prefix(b",\"hash\":\"")?.strip_suffix(b"\"}")?;
    let hash = std::str::from_utf8(hash).ok()?;
    let mut content = line[..cut].to_vec();
    content.push(b'}');
    Some((content, hash))
}
