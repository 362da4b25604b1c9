//! fedge-device: what a device decides and computes, without I/O.
//!
//! The agent's decisions as a sans-IO state machine ([`machine`], with the round state it keeps
//! across restarts, [`state`]), the local round and its objectives ([`train`]: SGD, FedProx,
//! FedDIM, FedDDL, Stable-FedADG, and [`train::run_round`], the device's round as one function),
//! standardising features with a site's statistics ([`site_norm`]), a device's labels on the
//! federation's class list ([`classes`]), local differential privacy ([`local_dp`]) and the
//! cached features everything trains on ([`features`]), the drift alarm on what a device
//! serves ([`drift`]) and which served inputs a site asks a person to label ([`labelling`]).
//!
//! Nothing here reads a clock, a file or the network: `fedge-edge` (the daemon: MQTT, the
//! backbone, the feature cache on disk, inference) and `fedge-sim` (the deterministic
//! simulator) drive the same machine and the same round. This crate's manifest names no tokio,
//! rumqttc, rumqttd, axum or fedge-mqtt, and the architecture test checks its dependency tree.

pub mod classes;
pub mod drift;
pub mod features;
pub mod labelling;
pub mod local_dp;
pub mod machine;
pub mod random;
pub mod site_choice;
pub mod site_head;
pub mod site_norm;
pub mod state;
pub mod train;

pub use features::{FeatureSet, Fnv64};
pub use machine::{
    Agent, AgentSummary, Identity, InvalidIdentity, Output, TaskError, Trained, class_stats,
    decode_task, over_budget, rejection_of, too_slow_for,
};
pub use state::RoundState;
pub use train::{
    DdlViews, DeviceData, LocalState, RoundInputs, RoundOutcome, TrainJob, TrainOutcome, Trainer,
    accuracy, accuracy_with, run_round, train_head, train_local,
};
