//! Why local training could not run: one error type for the dispatch and every objective.
//!
//! It does not log or retry; the agent reports the message in the device's status.

use fedge_models::FlatLayoutError;

/// Why local training could not run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The global parameters do not fit the head.
    #[error(transparent)]
    Layout(#[from] FlatLayoutError),
    /// Feature size differs from the head's input.
    #[error("features have size {got}, the head expects {expected}")]
    FeatureSize {
        /// Head input size.
        expected: usize,
        /// Size found.
        got: usize,
    },
    /// A label outside the head's classes.
    #[error("label {label} is out of range for {classes} classes")]
    Label {
        /// The label.
        label: u32,
        /// Number of classes.
        classes: usize,
    },
    /// Nothing to train on.
    #[error("no training samples")]
    Empty,
    /// Hyper-parameters that make no sense.
    #[error("invalid training parameters: {0}")]
    Params(String),
    /// Training diverged.
    #[error("training diverged (loss {0})")]
    Diverged(f32),
    /// The model has a trainable tail, and the job was given no backbone tail of its sizes.
    #[error(
        "the model has a trainable tail, and this device was not given the backbone's tail \
         weights (or its tail has other sizes)"
    )]
    NoTail,
    /// A trainable tail under a task that standardises features: the statistics would be of
    /// the cut's activations, not of the moving tail's output.
    #[error(
        "this device trains the backbone's tail, and the task standardises features \
         (feature_norm = \"{}\"): set feature_norm = \"none\" in the coordinator's [train] \
         (site statistics after a moving tail are not built yet)",
        .0.name()
    )]
    TailWithNorm(fedge_wire::FeatureNorm),
    /// The task's pooled feature summary does not fit the head it trains (sizes, or a value
    /// that is not finite): a malformed or forged task, never trained on.
    #[error(
        "the task's pooled feature statistics do not fit this device's head: {0} (the \
         coordinator's pool is damaged: `fedge-coordinator ctl reset-pool` clears it)"
    )]
    Pooled(String),
    /// The device has a class the task's class list lacks.
    #[error(transparent)]
    Classes(#[from] crate::classes::UnknownClasses),
    /// The rescan of the device's folder failed.
    #[error("rescan of the data folder failed: {0}")]
    Rescan(String),
    /// Stopped at the round's deadline: the update would have arrived after the round closed.
    #[error("training stopped at the round's deadline after {0} batches")]
    Cancelled(usize),
    /// Local DP could not privatise the trained delta (the update is not sent).
    #[error("local differential privacy: {0}")]
    Privacy(fedge_privacy::PrivacyError),
}
