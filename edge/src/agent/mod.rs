//! The device agent's I/O: the tokio and MQTT loop that feeds `fedge_device`'s agent machine and
//! performs its outputs ([`driver`]), the round state file ([`state`]), what a running agent
//! needs ([`setup`]), the labels and releases it serves with ([`labels`], [`serve`]) and the variant of each
//! release its site serves ([`variant`]), a
//! growing site folder taken in ([`refresh`]), what the driver adds to the machine's status
//! ([`stamp`]: the time, the data's loading and the files left out, the tag) and the
//! coordinator's word from before the agent connected, held back ([`backlog`]).
//!
//! It takes no decision (the machine in `fedge-device` does) and does not train (see
//! `fedge_device::train`).

pub mod backlog;
pub mod driver;
pub mod labels;
pub mod refresh;
pub mod serve;
pub mod setup;
pub mod stamp;
pub mod state;
pub mod variant;

pub use driver::{AgentError, run_agent};
pub use setup::{AgentSetup, Serving};
