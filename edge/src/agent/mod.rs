//! The device agent's I/O: the tokio and MQTT loop that feeds `fedge_device`'s agent machine and
//! performs its outputs ([`driver`]), the round state file ([`state`]), what a running agent
//! needs ([`setup`]), the labels and releases it serves with ([`labels`], [`serve`]) and a
//! growing site folder taken in ([`refresh`]).
//!
//! It takes no decision (the machine in `fedge-device` does) and does not train (see
//! `fedge_device::train`).

pub mod driver;
pub mod labels;
pub mod refresh;
pub mod serve;
pub mod setup;
pub mod state;

pub use driver::{AgentError, run_agent};
pub use setup::{AgentSetup, Serving};
