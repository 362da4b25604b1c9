//! What the machine hands out to be saved and takes back at a restart: the [`Checkpoint`]
//! after an aggregation, the journal's [`Record`]s of the open round and the [`OpenRoundLog`]
//! read back from them. Plain values; the file formats and the writing belong to the layer above.

use serde::{Deserialize, Serialize};

use crate::strategy::StrategyState;

/// Everything needed to continue a federation after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Federation name.
    pub federation: String,
    /// The federation's run ([`fedge_wire::RoundTask::run`]), kept across restarts.
    pub run: u64,
    /// Strategy name (`fedavg`, `fedomg+momentum`, ...).
    pub strategy: String,
    /// The next round to open.
    pub next_round: u64,
    /// Rounds aggregated so far.
    pub aggregated_rounds: u64,
    /// Global head parameters.
    pub params: Vec<f32>,
    /// The strategy's buffers.
    pub strategy_state: StrategyState,
    /// FedDIM's global insight matrices `[K, H, K]`; empty when there are none.
    pub insight: Vec<f32>,
    /// FedDDL's global causal prototypes `[K, H]`; empty when there are none.
    pub prototypes: Vec<f32>,
    /// Central DP's accountant (docs/algorithms.md §8); `None` without central DP.
    pub privacy: Option<SavedAccountant>,
    /// Central DP: the accounted rounds each device was selected in (its ε when its
    /// participation is known, no amplification); empty without central DP.
    pub participation: Vec<(String, u64)>,
    /// The federation's pooled feature summary (docs/algorithms.md §7), when it pools and
    /// devices sent theirs.
    pub pooled: Option<fedge_wire::FeatureSummary>,
    /// Buffered mode: the devices training a version before `next_round`, with that version
    /// (the open round's are in its journal); empty in synchronous mode.
    pub in_flight: Vec<(String, u64)>,
    /// Buffered mode: the version in which each device's last update counted (its
    /// participation interval's start); empty in synchronous mode.
    pub contributed: Vec<(String, u64)>,
}

/// A privacy accountant as plain values: its orders, the RDP spent at each (`+∞` kept as
/// is) and the steps composed, merged where consecutive steps are equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedAccountant {
    /// The Rényi orders α.
    pub orders: Vec<f64>,
    /// The RDP spent at each order.
    pub rdp: Vec<f64>,
    /// The composed steps.
    pub history: Vec<SavedSteps>,
}

/// Steps of one sampling and noise multiplier.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SavedSteps {
    /// How the devices were drawn.
    pub sampling: SavedSampling,
    /// The noise multiplier composed.
    pub noise_multiplier: f64,
    /// How many rounds.
    pub steps: u64,
}

/// A round's sampling, as the accountant composed it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum SavedSampling {
    /// Each device with probability `rate`.
    Poisson {
        /// The probability.
        rate: f64,
    },
    /// `sample` of `population` devices.
    FixedSize {
        /// Devices drawn.
        sample: u64,
        /// Devices that could be drawn.
        population: u64,
    },
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A round was opened with these clients; starts a fresh journal.
    Opened {
        /// Round number.
        round: u64,
        /// Selected clients, sorted.
        selected: Vec<String>,
        /// [`params_fingerprint`] of the global parameters the round started from: a journal
        /// is resumed only onto the same parameters (not onto a fresh start after the
        /// checkpoint was moved away, say).
        base: u64,
        /// The federation's run the round's task named: a coordinator killed before its first
        /// checkpoint takes it back, so that the updates answering it still count.
        run: u64,
    },
    /// An update was accepted in `round`: its plain frame (tag already checked).
    Accepted {
        /// Round number.
        round: u64,
        /// Client id.
        client: String,
        /// The framed `ClientUpdate`.
        #[serde(with = "serde_bytes")]
        frame: Vec<u8>,
    },
    /// Buffered mode: the open round's task was published again naming these clients too.
    Selected {
        /// Round number.
        round: u64,
        /// The clients added, sorted.
        clients: Vec<String>,
    },
}

/// The round a journal says was open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedRound {
    /// Round number.
    pub round: u64,
    /// Selected clients.
    pub selected: Vec<String>,
    /// Fingerprint of the parameters it started from.
    pub base: u64,
    /// The federation's run its task named.
    pub run: u64,
}

/// A fingerprint of global parameters: FNV-1a (64 bits) over their bit patterns. Tells a
/// journal's parameters from others; not a defence against anyone forging a file.
pub fn params_fingerprint(params: &[f32]) -> u64 {
    params.iter().fold(0xcbf2_9ce4_8422_2325, |hash, v| {
        v.to_bits().to_le_bytes().iter().fold(hash, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}

/// The journal of an open round, as read back at start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenRoundLog {
    /// The round, when one was open.
    pub opened: Option<OpenedRound>,
    /// Accepted updates of that round, in arrival order: client and frame.
    pub accepted: Vec<(String, Vec<u8>)>,
}

impl OpenRoundLog {
    /// Reads one more record of the journal, in the order written: `Opened` starts the log
    /// afresh; `Accepted` adds an update, and `Selected` (buffered mode: the task went to more
    /// devices) more selected clients, both only for the round opened.
    pub fn take(&mut self, record: Record) {
        match record {
            Record::Opened {
                round,
                selected,
                base,
                run,
            } => {
                *self = Self {
                    opened: Some(OpenedRound {
                        round,
                        selected,
                        base,
                        run,
                    }),
                    accepted: Vec::new(),
                };
            }
            Record::Accepted {
                round,
                client,
                frame,
            } => {
                if self.opened.as_ref().is_some_and(|o| o.round == round) {
                    self.accepted.push((client, frame));
                }
            }
            Record::Selected { round, clients } => {
                if let Some(opened) = self.opened.as_mut().filter(|o| o.round == round) {
                    opened.selected.extend(clients);
                }
            }
        }
    }
}
