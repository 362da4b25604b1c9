//! fedge-edge: the device agent.
//!
//! It loads local data, runs the frozen backbone once per sample (the feature cache), trains
//! the head with Burn when the coordinator selects it, and talks to the coordinator over MQTT.
//! The trainer is plain library code: `fedge demo` and `fedge bench` call it in process, the
//! agent calls it over MQTT, so both run the same numbers.
//!
//! This crate does not aggregate and does not decide who trains: the coordinator does.

pub mod agent;
pub mod check;
pub mod config;
pub mod data;
pub mod features;
pub mod fedddl;
pub mod feddim;
pub mod resources;
pub mod stable;
pub mod train;

pub use agent::{AgentSetup, AgentSummary, run_agent};
pub use fedddl::DdlViews;
pub use train::{
    FeatureSet, LocalState, RoundInputs, TrainOutcome, accuracy, train_head, train_head_with,
    train_local,
};
