//! fedge-coordinator: runs the rounds of a federation.
//!
//! - [`round`]: the round state machine. It does no I/O and reads no clock: inputs are method
//!   calls carrying the time, outputs are drained from it. Everything the coordinator decides
//!   (sampling, validation, deadlines, quorum, aggregation) happens there.
//! - [`strategy`]: server strategies behind one trait; the arithmetic in free functions.
//! - [`fedomg`]: FedOMG's solvers and strategy.
//! - [`robust`]: norm clipping, trimmed mean and median around any strategy.
//! - [`insight`]: FedDIM's class insight matrices, rebuilt from compact statistics.
//! - [`updates`], [`gram`]: a round's deltas held compactly, dot products streamed as they
//!   arrive.
//! - [`driver`]: the thin tokio + rumqttc driver around the machine.
//! - [`broker`]: the optional embedded rumqttd broker.
//! - [`discovery`]: Home Assistant MQTT discovery messages.
//! - [`config`]: the coordinator's TOML configuration.
//! - [`watch`]: the terminal view of a federation's topics.
//! - [`keys`]: device keys (the keys file, `keygen`).
//! - [`replay`], [`npy`]: one aggregation re-run offline from `.npy` files.
//! - [`journal`]: the open round's accepted updates, so a restart resumes the same round.
//! - [`checkpoint`]: the saved state (head, round, strategy buffers), written atomically.

pub mod broker;
pub mod checkpoint;
pub mod config;
pub mod discovery;
pub mod driver;
pub mod fedomg;
pub mod gram;
pub mod insight;
pub mod journal;
pub mod keys;
pub mod npy;
pub mod prototypes;
pub mod replay;
pub mod robust;
pub mod round;
pub mod spill;
pub mod strategy;
pub mod updates;
pub mod watch;

pub use driver::{DriverError, DriverEvent, DriverOptions, Evaluator};
pub use round::{DeviceKeys, Output, Phase, Rejection, RoundConfig, RoundReport, Rounds};
pub use strategy::{Aggregated, AggregationReport, FedAvg, Strategy};
pub use updates::RoundUpdates;
