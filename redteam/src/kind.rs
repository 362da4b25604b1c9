//! The closed set of attacks, with one spelling on the command line and in JSON, and the
//! client ids each attack uses so that what the federation rejects can be traced back to it.

use serde::{Deserialize, Serialize};

/// One attack `fedge attack` and `fedge demo --attack` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttackKind {
    /// A retained status of about 200 KB, and a retained status that is not JSON.
    OversizedStatus,
    /// A single update publish of about 200 KB, and one above 1 MiB.
    OversizedUpdate,
    /// Goes online, waits to be selected, answers with a huge finite delta and the largest
    /// sample count.
    PoisonWeight,
    /// Goes online, waits to be selected, answers with NaN and infinite values.
    Nan,
    /// Goes online, waits to be selected, answers with a valid delta of small norm and a
    /// feature summary of 10 samples whose every value is 1e9 (once), then of 1 sample whose
    /// every value is 1e4: a poisoned pooled summary wrecks how every site standardises its
    /// features.
    PoisonSummary,
    /// Many chunk streams that never complete, under its own id and many made-up ones.
    ChunkFlood,
    /// Forged chunks on real devices' update topics, with the message ids they are about to
    /// use.
    ChunkHijack,
    /// Genuine updates captured and published again in a later round and in another
    /// federation.
    Replay,
    /// Retained statuses saying real devices are offline, and made-up devices online.
    ForgedStatus,
    /// An evaluation-only site's statuses scoring the candidate (or the release served) at
    /// accuracy 1e30, −1e30, and in range with paired counts all for or all against it, each
    /// after a score of the release served, so that the gate pairs them.
    LyingScore,
    /// A serving device (it declines the rounds that select it) whose status raises a drift
    /// alarm on the release the serving pointer names (a canary's, when a canary stage is under
    /// way), so that the fleet rolls back.
    CanaryVeto,
    /// A retained evaluation-only status of an earlier run: accuracy 0.99 of a release this run
    /// never published.
    StaleStatus,
    /// A genuine round task captured and published again (retained) in later rounds.
    StaleTask,
    /// Random bytes on every fedge topic.
    Junk,
    /// Connects with the coordinator's MQTT client id to push it off the broker.
    IdTakeover,
    /// Operator commands captured on the control topic published again at every round (a
    /// forged one when none was seen), the way a replay after a coordinator restart would.
    ControlReplay,
    /// Prediction requests on every device's MQTT inference topic, many at once.
    InferenceFlood,
    /// A prediction request whose PNG says 8192 × 8192 RGBA (256 MiB decoded) in 65 bytes.
    ImageBomb,
}

impl AttackKind {
    /// Every attack, in the order reports list them.
    pub const ALL: [AttackKind; 18] = [
        AttackKind::OversizedStatus,
        AttackKind::OversizedUpdate,
        AttackKind::PoisonWeight,
        AttackKind::Nan,
        AttackKind::PoisonSummary,
        AttackKind::ChunkFlood,
        AttackKind::ChunkHijack,
        AttackKind::Replay,
        AttackKind::ForgedStatus,
        AttackKind::LyingScore,
        AttackKind::CanaryVeto,
        AttackKind::StaleStatus,
        AttackKind::StaleTask,
        AttackKind::Junk,
        AttackKind::IdTakeover,
        AttackKind::ControlReplay,
        AttackKind::InferenceFlood,
        AttackKind::ImageBomb,
    ];

    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            AttackKind::OversizedStatus => "oversized-status",
            AttackKind::OversizedUpdate => "oversized-update",
            AttackKind::PoisonWeight => "poison-weight",
            AttackKind::Nan => "nan",
            AttackKind::PoisonSummary => "poison-summary",
            AttackKind::ChunkFlood => "chunk-flood",
            AttackKind::ChunkHijack => "chunk-hijack",
            AttackKind::Replay => "replay",
            AttackKind::ForgedStatus => "forged-status",
            AttackKind::LyingScore => "lying-score",
            AttackKind::CanaryVeto => "canary-veto",
            AttackKind::StaleStatus => "stale-status",
            AttackKind::StaleTask => "stale-task",
            AttackKind::Junk => "junk",
            AttackKind::IdTakeover => "id-takeover",
            AttackKind::ControlReplay => "control-replay",
            AttackKind::InferenceFlood => "inference-flood",
            AttackKind::ImageBomb => "image-bomb",
        }
    }

    /// One line for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            AttackKind::OversizedStatus => {
                "retained ~200 KB status, and a retained status that is not JSON"
            }
            AttackKind::OversizedUpdate => "one ~200 KB update publish and one above 1 MiB",
            AttackKind::PoisonWeight => {
                "goes online; when selected, a delta of 1e30 everywhere with u32::MAX samples"
            }
            AttackKind::Nan => {
                "goes online; when selected, a delta (and statistics) of NaN and inf"
            }
            AttackKind::PoisonSummary => {
                "goes online; when selected, a small delta with a feature summary of 1e9 (then 1e4)"
            }
            AttackKind::ChunkFlood => "partial chunk streams, never completed, under many ids",
            AttackKind::ChunkHijack => {
                "forged chunks on real devices' update topics with their next message ids"
            }
            AttackKind::Replay => {
                "captured genuine updates again in later rounds and in --replay-into"
            }
            AttackKind::ForgedStatus => {
                "retained offline statuses for real devices, online ones for made-up devices"
            }
            AttackKind::LyingScore => {
                "an evaluation-only site scoring the candidate 1e30, -1e30, or all for/against it"
            }
            AttackKind::CanaryVeto => {
                "a drift alarm on the release the serving pointer names (the canary's)"
            }
            AttackKind::StaleStatus => {
                "a retained evaluation status of 0.99 for a release this run never published"
            }
            AttackKind::StaleTask => "a captured round task re-published (retained) later",
            AttackKind::Junk => "random bytes (up to 64 KiB) on every fedge topic",
            AttackKind::IdTakeover => "connects with the coordinator's client id to kick it off",
            AttackKind::ControlReplay => {
                "captured operator commands published again every round (forged when none seen)"
            }
            AttackKind::InferenceFlood => {
                "bursts of prediction requests on every device's MQTT inference topic"
            }
            AttackKind::ImageBomb => "a 65-byte PNG that decodes to 256 MiB, to every device",
        }
    }

    /// Whether the coordinator itself can see (and so reject) this attack's packets: they
    /// arrive on update or status topics it reads. The others are for the broker (client ids)
    /// or the devices (tasks) to refuse, and for forged statuses without authentication the
    /// coordinator cannot tell them from real ones.
    pub fn coordinator_sees(self) -> bool {
        !matches!(
            self,
            AttackKind::ForgedStatus
                | AttackKind::StaleTask
                | AttackKind::IdTakeover
                | AttackKind::InferenceFlood
                | AttackKind::ImageBomb
        )
    }

    /// Whether the attack acts under real devices' ids (or the coordinator's), so its
    /// rejections are attributed by what it touched rather than by its own id.
    pub fn acts_as_others(self) -> bool {
        matches!(
            self,
            AttackKind::ChunkHijack
                | AttackKind::Replay
                | AttackKind::StaleTask
                | AttackKind::IdTakeover
                | AttackKind::ControlReplay
        )
    }

    /// Whether the attack plays a device of the federation (one that trains in rounds, an
    /// evaluation-only site, a device serving releases), and so signs its statuses and updates
    /// with an insider key when it has one, as a compromised device would.
    pub fn takes_part(self) -> bool {
        matches!(
            self,
            AttackKind::PoisonWeight
                | AttackKind::Nan
                | AttackKind::PoisonSummary
                | AttackKind::LyingScore
                | AttackKind::CanaryVeto
                | AttackKind::StaleStatus
        )
    }

    /// The effects that mean the attack got through, for the attacks judged by what the
    /// coordinator did with what they said (its status, its pointers, the summary it sent
    /// out): a poisoned pooled summary, an impossible score the coordinator showed, a gate
    /// verdict the lies moved, a rollback the alarm caused, another run's score taken as this
    /// one's. Their refusals (`pooled_unmoved`, `score_ignored`, `gate_unswayed`,
    /// `canary_survived`, `release_kept`, `stale_score_ignored`) are the same judgements the
    /// other way. Empty for the other attacks, whose effects are evidence either way and whose
    /// rejections the coordinator counts.
    pub fn breaches(self) -> &'static [&'static str] {
        match self {
            AttackKind::PoisonSummary => &["pooled_poisoned"],
            AttackKind::LyingScore => &["score_believed", "gate_swayed"],
            AttackKind::CanaryVeto => &["canary_vetoed", "rolled_back"],
            AttackKind::StaleStatus => &["stale_score_believed"],
            _ => &[],
        }
    }

    /// The coordinator's rejection reasons this attack can cause for a real device whose
    /// streams it touched: forged chunks' tags and decoding failures for `chunk-hijack`; an update
    /// answering another round, a second one, one from a device not selected, or a re-dated
    /// one whose tag no longer verifies for `replay`; a device's own update answering an old task for `stale-task`; a status
    /// without the device's valid tag for `forged-status`.
    pub fn causes(self, reason: &str) -> bool {
        let reasons: &[&str] = match self {
            AttackKind::ChunkHijack => &[
                "bad_chunk_tag",
                "bad_tag",
                "unauthenticated",
                "malformed",
                "bad_chunk",
                "incomplete",
                "version",
                "wrong_kind",
                "oversized",
            ],
            AttackKind::Replay => &[
                "wrong_round",
                "duplicate",
                "not_selected",
                "replay",
                "bad_tag",
            ],
            AttackKind::StaleTask => &["wrong_round", "replay"],
            AttackKind::ForgedStatus => &["bad_status_tag", "unauthenticated"],
            AttackKind::ControlReplay => &["bad_control"],
            _ => &[],
        };
        reasons.contains(&reason)
    }

    /// The client id this attack publishes under: `<prefix>-<name>` (made-up ids of the same
    /// attack add `-<suffix>` to it).
    pub fn client_id(self, prefix: &str) -> String {
        format!("{prefix}-{}", self.name())
    }

    /// The attack whose client ids `client` is one of, for the ids `prefix` makes.
    pub fn owning(prefix: &str, client: &str) -> Option<AttackKind> {
        AttackKind::ALL.into_iter().find(|kind| {
            let id = kind.client_id(prefix);
            client
                .strip_prefix(id.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        })
    }
}

impl std::fmt::Display for AttackKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AttackKind {
    type Err = fedge_wire::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttackKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                fedge_wire::UnknownName::new("attack", s, AttackKind::ALL.map(AttackKind::name))
            })
    }
}

/// One word of a `--kind`/`--attack` list: an attack, or `all` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindChoice {
    /// Every attack.
    All,
    /// One attack.
    One(AttackKind),
}

const CHOICES: [KindChoice; 19] = [
    KindChoice::All,
    KindChoice::One(AttackKind::OversizedStatus),
    KindChoice::One(AttackKind::OversizedUpdate),
    KindChoice::One(AttackKind::PoisonWeight),
    KindChoice::One(AttackKind::Nan),
    KindChoice::One(AttackKind::PoisonSummary),
    KindChoice::One(AttackKind::ChunkFlood),
    KindChoice::One(AttackKind::ChunkHijack),
    KindChoice::One(AttackKind::Replay),
    KindChoice::One(AttackKind::ForgedStatus),
    KindChoice::One(AttackKind::LyingScore),
    KindChoice::One(AttackKind::CanaryVeto),
    KindChoice::One(AttackKind::StaleStatus),
    KindChoice::One(AttackKind::StaleTask),
    KindChoice::One(AttackKind::Junk),
    KindChoice::One(AttackKind::IdTakeover),
    KindChoice::One(AttackKind::ControlReplay),
    KindChoice::One(AttackKind::InferenceFlood),
    KindChoice::One(AttackKind::ImageBomb),
];

impl clap::ValueEnum for KindChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &CHOICES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            KindChoice::All => clap::builder::PossibleValue::new("all").help("every attack"),
            KindChoice::One(kind) => {
                clap::builder::PossibleValue::new(kind.name()).help(kind.help())
            }
        })
    }
}

/// The attacks a list of choices names: each once, in [`AttackKind::ALL`]'s order.
pub fn expand(choices: &[KindChoice]) -> Vec<AttackKind> {
    AttackKind::ALL
        .into_iter()
        .filter(|kind| {
            choices
                .iter()
                .any(|c| matches!(c, KindChoice::All) || *c == KindChoice::One(*kind))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    #[test]
    fn one_spelling_in_json_on_the_command_line_and_in_from_str() {
        for kind in AttackKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<AttackKind>(&json).unwrap(), kind);
            assert_eq!(kind.name().parse::<AttackKind>().unwrap(), kind);
            let choice = KindChoice::from_str(kind.name(), false).unwrap();
            assert_eq!(choice, KindChoice::One(kind));
        }
        assert_eq!(KindChoice::from_str("all", false).unwrap(), KindChoice::All);
        let err = "poison".parse::<AttackKind>().unwrap_err().to_string();
        assert!(err.contains("poison-weight"), "{err}");
    }

    #[test]
    fn all_expands_to_every_kind_once() {
        assert_eq!(expand(&[KindChoice::All]), AttackKind::ALL.to_vec());
        let two = [
            KindChoice::One(AttackKind::Junk),
            KindChoice::One(AttackKind::Nan),
            KindChoice::One(AttackKind::Junk),
        ];
        assert_eq!(expand(&two), vec![AttackKind::Nan, AttackKind::Junk]);
    }

    #[test]
    fn client_ids_lead_back_to_their_attack() {
        for kind in AttackKind::ALL {
            let id = kind.client_id("mallory");
            assert!(fedge_wire::valid_client_id(&id), "{id}");
            assert_eq!(AttackKind::owning("mallory", &id), Some(kind));
            assert_eq!(
                AttackKind::owning("mallory", &format!("{id}-17")),
                Some(kind)
            );
            assert_eq!(AttackKind::owning("eve", &id), None);
        }
        assert_eq!(AttackKind::owning("mallory", "mallory-nanny"), None);
        assert_eq!(AttackKind::owning("mallory", "site-0-0"), None);
    }
}
