//! What local training reports back to the agent machine when a round ends.

use crate::train::{RoundOutcome, TrainError, TrainOutcome};

/// What local training reports back to the machine.
#[derive(Debug)]
pub struct Trained {
    /// The task's round.
    pub round: u64,
    /// The trained update, or why training failed.
    pub result: Result<TrainOutcome, TrainError>,
    /// Accuracy of the task's global head on the local validation split.
    pub val_accuracy: f32,
    /// Seconds the training took.
    pub seconds: f32,
    /// The process's peak memory in MiB after training, when known.
    pub peak_memory_mb: Option<f64>,
    /// What a rescan of the device's folder found before training, when it rescans.
    pub data: Option<DataSummary>,
}

impl Trained {
    /// A round that failed before training.
    pub fn failed(round: u64, error: TrainError) -> Self {
        Self {
            round,
            result: Err(error),
            val_accuracy: 0.0,
            seconds: 0.0,
            peak_memory_mb: None,
            data: None,
        }
    }

    /// What [`crate::train::run_round`] produced for `round` in `seconds`, with what a rescan
    /// found.
    pub fn of_round(
        round: u64,
        outcome: RoundOutcome,
        seconds: f32,
        data: Option<DataSummary>,
    ) -> Self {
        Self {
            round,
            result: outcome.result,
            val_accuracy: outcome.val_accuracy,
            seconds,
            peak_memory_mb: None,
            data,
        }
    }

    /// The same, with the process's peak memory after training.
    pub fn with_peak_memory(self, peak_memory_mb: Option<f64>) -> Self {
        Self {
            peak_memory_mb,
            ..self
        }
    }
}

/// The device's data after a rescan.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSummary {
    /// Training samples (the update's weight).
    pub samples: u32,
    /// Validation samples.
    pub val_samples: u32,
    /// Samples the rescan added.
    pub new_samples: u32,
    /// The classes the device now has samples of.
    pub classes: Vec<String>,
}
