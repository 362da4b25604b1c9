//! fedge-edge: the device daemon.
//!
//! It loads local data, runs the frozen backbone once per sample (the feature cache), and
//! talks to the coordinator over MQTT, feeding `fedge-device`'s agent machine and calling its
//! trainer when the coordinator selects the device. The decisions and the training are
//! `fedge-device`'s, without I/O: `fedge eval` runs the same machine and the same round in the
//! simulator (`fedge-sim`), so both run the same numbers.
//!
//! Modules, leaves first: [`data`] (local images), [`features`] (the backbone and the feature
//! cache), [`views`] (FedDDL's counterfactual and object-only images), [`rescan`] (a growing
//! site folder), [`resources`], [`config`] (a device profile), [`agent`] (the MQTT driver of
//! the machine, and the round state file), [`check`] (a profile's pre-flight checks),
//! [`fetch`] (a backbone published over MQTT), [`enrol`], and [`inference`] (predictions with
//! the released head: the kept release, the predictor, the HTTP endpoint), [`labelling`] (the
//! site's labelling queue and its page), with [`metrics`] (what the device reports to
//! Prometheus).
//!
//! This crate does not aggregate and does not decide who trains: the coordinator does.

pub mod agent;
pub mod check;
pub mod config;
pub mod data;
pub mod enrol;
pub mod features;
pub mod fetch;
pub mod inference;
pub mod labelling;
pub mod metrics;
pub mod rescan;
pub mod resources;
pub mod views;
pub mod web_guard;

pub use agent::{AgentSetup, run_agent};
