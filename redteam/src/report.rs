//! What an attack run reports: per attack, what it sent and what the federation answered
//! (rejections by reason, refusals by the broker, effects it observed), and for the
//! federation as a whole whether the coordinator stayed online and rounds kept aggregating.
//! The same values are printed as a table and written as JSON.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::kind::AttackKind;

/// One attack's tally.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KindReport {
    /// Packets sent (connections, for `id-takeover`).
    pub sent: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Packets or connections refused: the sum of `reasons`.
    pub rejected: u64,
    /// Rejections by reason: the coordinator's reasons traced to this attack;
    /// `broker_refused`/`broker_dropped` when the broker refused a connection or closed it;
    /// `coordinator_unmoved` for a takeover that displaced no one; `device_refused` and
    /// `device_reasserted` when devices refused a stale task or put a forged status right.
    pub reasons: BTreeMap<String, u64>,
    /// What the attack observed, by name (`selected`, `connected_as_coordinator`,
    /// `stale_updates`, …): evidence of success as much as of failure.
    pub effects: BTreeMap<String, u64>,
}

impl KindReport {
    /// Adds `n` rejections for `reason`.
    pub fn reject(&mut self, reason: &str, n: u64) {
        if n > 0 {
            *self.reasons.entry(reason.to_owned()).or_insert(0) += n;
            self.rejected += n;
        }
    }
}

/// The federation's side of the run, from its metrics and the coordinator's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FederationAnswer {
    /// Rounds whose task appeared during the run.
    pub rounds_opened: u64,
    /// Rounds whose metrics say they aggregated.
    pub rounds_aggregated: u64,
    /// Rounds whose metrics say they were abandoned.
    pub rounds_abandoned: u64,
    /// The newest round seen.
    pub last_round: u64,
    /// The coordinator's last state (`training`, `waiting`, `finished`, `offline`; empty when
    /// no status was seen).
    pub coordinator_state: String,
    /// Whether that state is anything but `offline`.
    pub coordinator_online: bool,
    /// Times the coordinator's status turned `offline` (its Last Will: it lost the broker).
    pub coordinator_offline_events: u64,
    /// Rejections by reason the coordinator counted during the run (all senders).
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Coordinator rejections for real devices that no attack could be traced to.
    pub unattributed: BTreeMap<String, u64>,
}

/// A whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttackReport {
    /// Federation attacked.
    pub federation: String,
    /// Broker, as `host:port`.
    pub broker: String,
    /// Seconds the attacks ran.
    pub seconds: f64,
    /// Per attack.
    pub kinds: BTreeMap<AttackKind, KindReport>,
    /// The federation's answer.
    pub federation_answer: FederationAnswer,
}

fn reasons(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}×{v}")).collect();
    parts.join(" ")
}

impl fmt::Display for AttackReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<17} {:>7} {:>10} {:>8}  rejections / effects",
            "attack", "sent", "bytes", "rejected"
        )?;
        for (kind, r) in &self.kinds {
            writeln!(
                f,
                "{:<17} {:>7} {:>10} {:>8}  {} / {}",
                kind.name(),
                r.sent,
                r.bytes,
                r.rejected,
                reasons(&r.reasons),
                reasons(&r.effects)
            )?;
        }
        let a = &self.federation_answer;
        writeln!(
            f,
            "federation {}: rounds opened {}, aggregated {}, abandoned {} (last round {}); coordinator {} ({} times offline)",
            self.federation,
            a.rounds_opened,
            a.rounds_aggregated,
            a.rounds_abandoned,
            a.last_round,
            if a.coordinator_state.is_empty() {
                "not seen"
            } else {
                a.coordinator_state.as_str()
            },
            a.coordinator_offline_events
        )?;
        writeln!(
            f,
            "coordinator rejections during the run: {}",
            reasons(&a.rejected_by_reason)
        )?;
        if !a.unattributed.is_empty() {
            writeln!(f, "not traced to an attack: {}", reasons(&a.unattributed))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_names_every_attack_by_its_spelling_and_reads_back() {
        let mut report = AttackReport {
            federation: "lab".into(),
            broker: "127.0.0.1:1883".into(),
            seconds: 2.5,
            ..AttackReport::default()
        };
        for kind in AttackKind::ALL {
            let mut r = KindReport {
                sent: 3,
                ..KindReport::default()
            };
            r.reject("not_selected", 2);
            r.reject("norm", 0);
            report.kinds.insert(kind, r);
        }
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["kinds"]["poison-weight"]["rejected"], 2);
        assert_eq!(json["kinds"]["id-takeover"]["reasons"]["not_selected"], 2);
        assert!(json["kinds"]["nan"]["reasons"].get("norm").is_none());
        let back: AttackReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        let table = report.to_string();
        for kind in AttackKind::ALL {
            assert!(table.contains(kind.name()), "{table}");
        }
    }
}
