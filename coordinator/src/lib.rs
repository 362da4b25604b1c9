//! fedge-coordinator: runs the rounds of a federation.
//!
//! - [`round`]: the round state machine. It does no I/O and reads no clock: inputs are method
//!   calls carrying the time, outputs are drained from it. Everything the coordinator decides
//!   (sampling, validation, deadlines, quorum, aggregation) happens there.
//! - [`strategy`]: server strategies behind one trait; the arithmetic in free functions.
//! - [`driver`]: the thin tokio + rumqttc driver around the machine.
//! - [`broker`]: the optional embedded rumqttd broker.
//! - [`config`]: the coordinator's TOML configuration.

pub mod broker;
pub mod config;
pub mod driver;
pub mod fedomg;
pub mod round;
pub mod strategy;

pub use driver::{DriverError, DriverEvent, DriverOptions, Evaluator};
pub use round::{Output, Phase, Rejection, RoundConfig, RoundReport, Rounds};
pub use strategy::{AcceptedUpdate, FedAvg, Strategy};
