//! What an attacker sees of the release pipeline: the releases and candidates on
//! `model/current` and `model/candidate` (digest, round, pooled feature summary), the serving
//! pointers on `model/serving` (sealed ones read without their tags: the attacker has no key),
//! and what the coordinator's status says of the pipeline and of the evaluation-only sites.
//! The attacks judged by what the coordinator did with their statuses and summaries read it.

use std::collections::BTreeMap;

use fedge_wire::{FeatureSummary, Message, ModelRelease, Reassembler, ServingPointer};
use serde_json::Value;

/// Most releases, pointers, pooled summaries and verdicts kept (the oldest go first).
const KEPT: usize = 64;

/// A release or candidate seen on the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseSeen {
    /// The round whose aggregate it is.
    pub round: u64,
    /// Whether it came as a candidate (`model/candidate`) rather than a release.
    pub candidate: bool,
    /// When it was first seen.
    pub seen_ms: u64,
}

/// A serving pointer, when it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerSeen {
    /// The pointer.
    pub pointer: ServingPointer,
    /// When it was seen.
    pub seen_ms: u64,
}

/// A gate verdict in the coordinator's status.
#[derive(Debug, Clone, PartialEq)]
pub struct GateSeen {
    /// SHA-256 (hex) of the candidate judged.
    pub candidate: String,
    /// `waiting`, `promoted` or `held`.
    pub outcome: String,
    /// The verdict as the status spelled it (its numbers, its reason).
    pub verdict: Value,
    /// When this outcome for this candidate was first seen.
    pub first_ms: u64,
}

impl GateSeen {
    /// Whether the verdict says something no truthful evaluation-only sites could have made
    /// it say: a mean accuracy outside 0–100 points, or more sites than the `honest` ones the
    /// attacker saw.
    pub fn swayed(&self, honest: usize) -> bool {
        let points = |field: &str| self.verdict.get(field).and_then(Value::as_f64);
        let out_of_range = ["candidate_accuracy", "serving_accuracy"]
            .into_iter()
            .filter_map(points)
            .any(|p| !(0.0..=100.0).contains(&p));
        let sites = self.verdict.get("sites").and_then(Value::as_u64);
        out_of_range || sites.is_some_and(|s| s > honest as u64)
    }
}

/// A release named in the coordinator's status: digest and round.
pub type Named = (String, u64);

/// The release pipeline as the attacker sees it.
#[derive(Debug)]
pub struct ReleasesSeen {
    /// Releases and candidates by SHA-256 (hex).
    pub releases: BTreeMap<String, ReleaseSeen>,
    /// The federation's pooled feature summary in force once round `r` was folded in (read
    /// from round `r + 1`'s task and from round `r`'s release or candidate).
    pub pooled_after: BTreeMap<u64, FeatureSummary>,
    /// Serving pointers, in the order seen (each `seq` once).
    pub pointers: Vec<PointerSeen>,
    /// The coordinator's `site_accuracy`, as last seen.
    pub site_accuracy: BTreeMap<String, f64>,
    /// The release every device serves, per the coordinator's status.
    pub serving: Option<Named>,
    /// The candidate waiting for the gate, per the coordinator's status.
    pub candidate: Option<Named>,
    /// The release in its canary stage, per the coordinator's status.
    pub canary: Option<Named>,
    /// Every distinct gate verdict (candidate and outcome), in the order seen.
    pub gates: Vec<GateSeen>,
    /// When the coordinator's status was last seen.
    pub status_ms: Option<u64>,
    reassembler: Reassembler,
}

impl Default for ReleasesSeen {
    fn default() -> Self {
        Self {
            releases: BTreeMap::new(),
            pooled_after: BTreeMap::new(),
            pointers: Vec::new(),
            site_accuracy: BTreeMap::new(),
            serving: None,
            candidate: None,
            canary: None,
            gates: Vec::new(),
            status_ms: None,
            reassembler: Reassembler::new(60_000, fedge_wire::MAX_MESSAGE_BYTES),
        }
    }
}

impl ReleasesSeen {
    /// A payload on `model/current` (`candidate` false) or `model/candidate`, or one of their
    /// chunk topics.
    pub fn absorb_release(&mut self, candidate: bool, payload: &[u8], now_ms: u64) {
        let frame = match fedge_wire::decode(payload) {
            Ok(Message::Chunk(chunk)) => {
                let sender = if candidate { "candidate" } else { "current" };
                match self.reassembler.push(sender, chunk, now_ms) {
                    Ok(Some(frame)) => frame,
                    _ => return,
                }
            }
            Ok(_) => payload.to_vec(),
            Err(_) => return,
        };
        let Some(release) = read_release(&frame) else {
            return;
        };
        self.releases
            .entry(release.sha256_hex())
            .or_insert(ReleaseSeen {
                round: release.round,
                candidate,
                seen_ms: now_ms,
            });
        trim_map(&mut self.releases, |r| r.seen_ms);
        if let Some(pooled) = release.pooled {
            self.note_pooled(release.round, pooled);
        }
    }

    /// The pooled summary a task of `round` carried, or a release of `round - 1`.
    pub fn note_task_pooled(&mut self, round: u64, pooled: &FeatureSummary) {
        if let Some(after) = round.checked_sub(1) {
            self.note_pooled(after, pooled.clone());
        }
    }

    fn note_pooled(&mut self, after: u64, pooled: FeatureSummary) {
        self.pooled_after.insert(after, pooled);
        while self.pooled_after.len() > KEPT {
            self.pooled_after.pop_first();
        }
    }

    /// A payload on `model/serving`.
    pub fn absorb_pointer(&mut self, payload: &[u8], now_ms: u64) {
        // Without a key, a sealed pointer's inside is read as it is.
        let Some(pointer) = fedge_wire::decode_serving(payload, "", None) else {
            return;
        };
        if self.pointers.iter().any(|p| p.pointer.seq == pointer.seq) {
            return;
        }
        self.pointers.push(PointerSeen {
            pointer,
            seen_ms: now_ms,
        });
        if self.pointers.len() > KEPT {
            self.pointers.remove(0);
        }
    }

    /// The newest pointer seen (by `seq`).
    pub fn pointer(&self) -> Option<&PointerSeen> {
        self.pointers.iter().max_by_key(|p| p.pointer.seq)
    }

    /// The coordinator's status document: its `site_accuracy` and `release` sections.
    /// Its Last Will (`offline`), or a document without a state, says nothing of them.
    pub fn absorb_coordinator(&mut self, status: &Value, now_ms: u64) {
        match status.get("state").and_then(Value::as_str) {
            None | Some("offline") => return,
            Some(_) => {}
        }
        self.status_ms = Some(now_ms);
        self.site_accuracy = status
            .get("site_accuracy")
            .and_then(Value::as_object)
            .map(|sites| {
                sites
                    .iter()
                    .filter_map(|(c, a)| Some((c.clone(), a.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        let release = status.get("release");
        let section = |field: &str| release.and_then(|r| named(r.get(field)?));
        self.serving = section("serving");
        self.candidate = section("candidate");
        self.canary = section("canary");
        let Some(gate) = release.and_then(|r| r.get("gate")) else {
            return;
        };
        let (Some((candidate, _)), Some(outcome)) = (
            gate.get("candidate").and_then(named),
            gate.get("outcome").and_then(Value::as_str),
        ) else {
            return;
        };
        let known = self
            .gates
            .iter()
            .any(|g| g.candidate == candidate && g.outcome == outcome);
        if !known {
            self.gates.push(GateSeen {
                candidate,
                outcome: outcome.to_owned(),
                verdict: gate.clone(),
                first_ms: now_ms,
            });
            if self.gates.len() > KEPT {
                self.gates.remove(0);
            }
        }
    }

    /// The round of the newest release (not candidate) seen.
    pub fn newest_round(&self) -> Option<u64> {
        (self.releases.values())
            .filter(|r| !r.candidate)
            .map(|r| r.round)
            .max()
    }

    /// The newest release seen before the one named `sha` (by round), if any.
    pub fn before(&self, sha: &str) -> Option<String> {
        let round = self.releases.get(sha)?.round;
        (self.releases.iter())
            .filter(|(_, r)| !r.candidate && r.round < round)
            .max_by_key(|(_, r)| r.round)
            .map(|(s, _)| s.clone())
    }
}

/// `{"sha256": .., "round": ..}` as a digest and a round.
fn named(value: &Value) -> Option<Named> {
    let sha = value.get("sha256")?.as_str()?;
    let round = value.get("round")?.as_u64()?;
    Some((sha.to_owned(), round))
}

/// The release in a frame, sealed or not (tags are not checked: the attacker has no key).
fn read_release(frame: &[u8]) -> Option<ModelRelease> {
    match fedge_wire::decode(frame).ok()? {
        Message::Model(release) => Some(release),
        Message::Sealed(sealed) => match fedge_wire::decode(&sealed.inner).ok()? {
            Message::Model(release) => Some(release),
            _ => None,
        },
        _ => None,
    }
}

/// Drops the oldest entries (by `age`) beyond [`KEPT`].
fn trim_map<V>(map: &mut BTreeMap<String, V>, age: impl Fn(&V) -> u64) {
    while map.len() > KEPT {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| age(v))
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        map.remove(&oldest);
    }
}
