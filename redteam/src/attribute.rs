//! Tracing the coordinator's rejections back to the attacks.
//!
//! Each attack publishes under its own client id (`<prefix>-<kind>`, made-up ids of the same
//! attack add a suffix), so a rejection for one of those ids belongs to that attack. The
//! attacks that act under real devices' names (chunk-hijack and replay write on their update
//! topics, forged-status on its status topic; a device that trains a stale task answers it
//! under its own name) record a touch each time; a rejection for a real device goes to the
//! attack that touched that device last before it among those that can cause its reason
//! ([`AttackKind::causes`]), when the touch came at most [`TRACE_WINDOW_MS`] before it (the
//! coordinator's reassembly timeout, after which an incomplete stream is rejected, plus
//! margin), or failing that to the first such touch at most half a second after it (the
//! coordinator and the attacker's observer see a device's packet on different connections).
//! What is left is
//! reported as not traced. `id-takeover` and the broker's refusals are counted by the attacks
//! themselves (a connection refused or closed by the broker).

use std::collections::BTreeMap;

use super::kind::AttackKind;
use super::report::KindReport;
use super::view::Touch;

/// How long after a touch a rejection for the touched device is traced to it.
pub const TRACE_WINDOW_MS: u64 = 45_000;
/// How much earlier than the touch a rejection may be stamped (the coordinator and the
/// attacker's observer see the same packet on different connections).
const CLOCK_SLACK_MS: u64 = 500;

/// A rejection by the coordinator, as the driver's events or the metrics reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRejection {
    /// Milliseconds since the attack's origin.
    pub ms: u64,
    /// The client id in the topic.
    pub client: String,
    /// The reason's name.
    pub reason: String,
}

/// What an attack did by itself, before the coordinator's answer is traced to it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindTally {
    /// Packets (or connections) sent.
    pub sent: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Refusals it saw itself, by reason.
    pub refusals: BTreeMap<String, u64>,
    /// Effects it observed.
    pub effects: BTreeMap<String, u64>,
}

/// The attack a rejection belongs to, if any of `kinds`.
pub fn trace(
    prefix: &str,
    kinds: &[AttackKind],
    rejection: &SeenRejection,
    touches: &[Touch],
) -> Option<AttackKind> {
    if let Some(kind) = AttackKind::owning(prefix, &rejection.client) {
        return kinds.contains(&kind).then_some(kind);
    }
    let candidates = || {
        touches
            .iter()
            .filter(|t| t.client == rejection.client && kinds.contains(&t.kind))
            .filter(|t| t.kind.causes(&rejection.reason))
    };
    // The last touch before the rejection; failing that, the first one just after it.
    let before = candidates()
        .filter(|t| t.ms <= rejection.ms && rejection.ms <= t.ms.saturating_add(TRACE_WINDOW_MS))
        .max_by_key(|t| t.ms);
    before
        .or_else(|| {
            candidates()
                .filter(|t| t.ms > rejection.ms && t.ms <= rejection.ms + CLOCK_SLACK_MS)
                .min_by_key(|t| t.ms)
        })
        .map(|t| t.kind)
}

/// Every attack's report: its own tally plus the rejections traced to it; and the
/// rejections traced to none, by reason.
pub fn reports(
    prefix: &str,
    tallies: &BTreeMap<AttackKind, KindTally>,
    rejections: &[SeenRejection],
    touches: &[Touch],
) -> (BTreeMap<AttackKind, KindReport>, BTreeMap<String, u64>) {
    let kinds: Vec<AttackKind> = tallies.keys().copied().collect();
    let mut out: BTreeMap<AttackKind, KindReport> = tallies
        .iter()
        .map(|(kind, tally)| {
            let mut report = KindReport {
                sent: tally.sent,
                bytes: tally.bytes,
                effects: tally.effects.clone(),
                ..KindReport::default()
            };
            for (reason, n) in &tally.refusals {
                report.reject(reason, *n);
            }
            (*kind, report)
        })
        .collect();
    let mut untraced = BTreeMap::new();
    for rejection in rejections {
        match trace(prefix, &kinds, rejection, touches).and_then(|k| out.get_mut(&k)) {
            Some(report) => report.reject(&rejection.reason, 1),
            None => *untraced.entry(rejection.reason.clone()).or_insert(0) += 1,
        }
    }
    (out, untraced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(ms: u64, client: &str, reason: &str) -> SeenRejection {
        SeenRejection {
            ms,
            client: client.into(),
            reason: reason.into(),
        }
    }

    fn touch(ms: u64, kind: AttackKind, client: &str) -> Touch {
        Touch {
            ms,
            kind,
            client: client.into(),
        }
    }

    #[test]
    fn own_ids_go_to_their_attack_and_touched_devices_to_the_last_toucher() {
        let kinds = [
            AttackKind::PoisonWeight,
            AttackKind::ChunkFlood,
            AttackKind::ChunkHijack,
            AttackKind::Replay,
        ];
        let touches = [
            touch(1_000, AttackKind::ChunkHijack, "site-0"),
            touch(5_000, AttackKind::Replay, "site-0"),
            touch(5_000, AttackKind::ChunkHijack, "site-1"),
            touch(5_010, AttackKind::ChunkHijack, "site-2"),
            touch(5_000, AttackKind::Replay, "site-2"),
        ];
        let cases = [
            (
                rejection(10, "mallory-poison-weight", "norm"),
                Some(AttackKind::PoisonWeight),
            ),
            (
                rejection(10, "mallory-chunk-flood-12", "not_selected"),
                Some(AttackKind::ChunkFlood),
            ),
            (rejection(10, "mallory-junk", "malformed"), None),
            (
                rejection(1_500, "site-0", "bad_chunk"),
                Some(AttackKind::ChunkHijack),
            ),
            (
                rejection(5_100, "site-0", "wrong_round"),
                Some(AttackKind::Replay),
            ),
            (
                rejection(4_600, "site-1", "malformed"),
                Some(AttackKind::ChunkHijack),
            ),
            (
                rejection(40_000, "site-1", "incomplete"),
                Some(AttackKind::ChunkHijack),
            ),
            (rejection(60_000, "site-1", "incomplete"), None),
            (rejection(2_000, "site-2", "shape"), None),
            (rejection(5_020, "site-1", "shape"), None),
            (
                rejection(4_990, "site-0", "wrong_round"),
                Some(AttackKind::Replay),
            ),
            (
                rejection(5_005, "site-2", "malformed"),
                Some(AttackKind::ChunkHijack),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(trace("mallory", &kinds, &r, &touches), want, "{r:?}");
        }
    }

    #[test]
    fn reports_add_refusals_and_traced_rejections_and_keep_the_rest_apart() {
        let mut tallies = BTreeMap::new();
        tallies.insert(
            AttackKind::Nan,
            KindTally {
                sent: 4,
                bytes: 100,
                refusals: [("broker_dropped".to_string(), 1)].into(),
                effects: [("selected".to_string(), 2)].into(),
            },
        );
        let rejections = [
            rejection(1, "mallory-nan", "non_finite"),
            rejection(2, "mallory-nan", "non_finite"),
            rejection(3, "site-0", "duplicate"),
        ];
        let (reports, untraced) = reports("mallory", &tallies, &rejections, &[]);
        let nan = &reports[&AttackKind::Nan];
        assert_eq!(nan.sent, 4);
        assert_eq!(nan.rejected, 3);
        assert_eq!(nan.reasons["non_finite"], 2);
        assert_eq!(nan.reasons["broker_dropped"], 1);
        assert_eq!(nan.effects["selected"], 2);
        assert_eq!(untraced, [("duplicate".to_string(), 1)].into());
    }
}
