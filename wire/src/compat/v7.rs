//! Protocol 7, as released: the round task before protocol 8 named the backbone.
//!
//! Only the round task's body changed between 7 and 8; client updates, chunks, sealed frames
//! and releases have the same bodies, under version byte 7. That release's codec, for
//! the tests that play an old device, is built on these types.

use serde::{Deserialize, Serialize};

use crate::messages::TrainParams;
use crate::tensor::TensorF32;

/// This module's version byte.
pub const VERSION: u8 = 7;

/// Protocol 7's round task: [`crate::RoundTask`] without `backbone`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundTask {
    /// The federation's name.
    pub federation: String,
    /// The federation's run.
    pub run: u64,
    /// Round number.
    pub round: u64,
    /// Clients asked to train this round.
    pub selected: Vec<String>,
    /// The federation's class names in output order.
    pub classes: Vec<String>,
    /// Global head parameters.
    pub params: TensorF32,
    /// Local training hyper-parameters.
    pub train: TrainParams,
    /// Milliseconds from publication until the round closes.
    pub deadline_ms: u64,
    /// FedDIM's `Ī`.
    pub insight: Option<TensorF32>,
    /// FedDDL's `U_G`.
    pub prototypes: Option<TensorF32>,
}

impl From<crate::RoundTask> for RoundTask {
    /// Drops what protocol 7 cannot carry (the backbone).
    fn from(task: crate::RoundTask) -> Self {
        Self {
            federation: task.federation,
            run: task.run,
            round: task.round,
            selected: task.selected,
            classes: task.classes,
            params: task.params,
            train: task.train,
            deadline_ms: task.deadline_ms,
            insight: task.insight,
            prototypes: task.prototypes,
        }
    }
}

impl From<RoundTask> for crate::RoundTask {
    /// A protocol-7 task names no backbone.
    fn from(task: RoundTask) -> Self {
        Self {
            federation: task.federation,
            run: task.run,
            round: task.round,
            selected: task.selected,
            classes: task.classes,
            params: task.params,
            train: task.train,
            deadline_ms: task.deadline_ms,
            insight: task.insight,
            prototypes: task.prototypes,
            backbone: None,
        }
    }
}
