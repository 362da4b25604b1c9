//! What the machine hands out to be saved and takes back at a restart: the [`Checkpoint`]
//! after an aggregation, the journal's [`Record`]s of the open round and the [`OpenRoundLog`]
//! read back from them. Plain values; the file formats and the writing are in `crate::store`.

use serde::{Deserialize, Serialize};

use crate::strategy::StrategyState;

/// Everything needed to continue a federation after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Federation name.
    pub federation: String,
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
}

/// The journal of an open round, as read back at start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenRoundLog {
    /// Round number and selected clients, when a round was open.
    pub opened: Option<(u64, Vec<String>)>,
    /// Accepted updates of that round, in arrival order: client and frame.
    pub accepted: Vec<(String, Vec<u8>)>,
}
