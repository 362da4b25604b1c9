//! fedge-edge: the device agent.
//!
//! It loads local data, runs the frozen backbone once per sample (the feature cache), trains
//! the head with Burn when the coordinator selects it, and talks to the coordinator over MQTT.
//! The trainer is plain library code: `fedge demo` and `fedge eval` call it in process, the
//! agent calls it over MQTT, so both run the same numbers.
//!
//! Modules, leaves first: [`random`] (shared draws), [`data`] (local images), [`features`] (the
//! backbone cache and [`FeatureSet`]), [`classes`] (a device's labels on the federation's class list), [`rescan`]
//! (a growing site folder), [`site_norm`] (standardising features with a site's own statistics),
//! [`train`] (local rounds: SGD and the objectives), [`resources`],
//! [`agent`] (the decisions as a state machine, and its MQTT driver), [`config`] (a device
//! profile), [`local_dp`] (local differential privacy: the `[privacy]` section and what is done
//! to an update before it leaves), [`check`] (a profile's pre-flight checks), and [`inference`] (predictions with the
//! released head: the kept release, the predictor, the HTTP endpoint), with [`metrics`] (what
//! the device reports to Prometheus).
//!
//! This crate does not aggregate and does not decide who trains: the coordinator does.

pub mod agent;
pub mod check;
pub mod classes;
pub mod config;
pub mod data;
pub mod enrol;
pub mod features;
pub mod fetch;
pub mod inference;
pub mod local_dp;
pub mod metrics;
pub mod random;
pub mod rescan;
pub mod resources;
pub mod site_norm;
pub mod train;

pub use agent::{AgentSetup, AgentSummary, run_agent};
pub use features::FeatureSet;
pub use train::{
    DdlViews, LocalState, RoundInputs, TrainJob, TrainOutcome, accuracy, train_head, train_local,
};
