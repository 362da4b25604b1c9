//! fedge-rounds: the coordinator's core, without I/O. Its manifest names no tokio, rumqttc,
//! rumqttd, axum or fedge-mqtt, so nothing here can reach the network; the daemon around it
//! (drivers, files, configuration) is fedge-coordinator, which re-exports these modules.
//!
//! The modules depend on each other in one direction, from the composition root down to the
//! arithmetic:
//!
//! - [`boot`]: the one way a round machine is made and started (fresh, or from its checkpoint
//!   and journal), used by the daemon, the demo and the simulator.
//! - [`round`]: the round state machine. It does no I/O and reads no clock: inputs are method
//!   calls carrying the time, outputs are drained from it. Everything the coordinator decides
//!   (sampling, admission, validation, deadlines, quorum, aggregation) happens there.
//! - [`buffer`]: buffered asynchronous aggregation's settings, staleness weight and the
//!   devices in flight (plain values the round machine drives).
//! - [`release`]: from aggregate to served model: the evaluation gate, the canary stage,
//!   rollback (fed by the round machine; it knows only the wire's types).
//! - [`strategy`]: server strategies behind one trait (FedAvg, FedOMG, server momentum, the
//!   robust rewrites, central DP-FedAvg) and the configuration that builds them.
//! - [`objectives`]: the server sides of FedDIM and FedDDL (global tensors the tasks carry).
//! - [`updates`]: a round's deltas held compactly (heap or spill file), dot products streamed
//!   as they arrive, and their norms.
//!
//! `boot` uses everything; `round` uses `buffer`, `release`, `strategy`, `objectives` and `updates`; `strategy` and
//! `objectives` use `updates`; nothing points back up (`layering_tests`). Nothing but the spill
//! file's creation touches files; nothing reads a clock.

pub mod boot;
pub mod buffer;
pub mod objectives;
pub mod release;
pub mod round;
pub mod strategy;
pub mod updates;

pub use objectives::fedddl::PrototypeConfig;
pub use objectives::feddim::InsightConfig;
pub use round::{
    Checkpoint, DeviceKeys, Output, Phase, Rejection, ResumeError, RoundConfig, RoundReport, Rounds,
};
pub use strategy::{Aggregated, AggregationReport, FedAvg, Strategy, StrategyConfig, StrategyKind};
pub use updates::RoundUpdates;

#[cfg(test)]
mod layering_tests;
