//! fedge-coordinator: runs the rounds of a federation.
//!
//! The modules depend on each other in one direction, from the I/O at the edge down to the
//! arithmetic:
//!
//! - [`io`]: the thin tokio + rumqttc driver around the machine, the status it publishes, the
//!   optional embedded rumqttd broker, Home Assistant discovery and the `watch` terminal view.
//! - [`store`]: the files (checkpoint, the open round's journal, device keys), all written
//!   through `fedge_daemon::write_atomically`.
//! - [`round`]: the round state machine. It does no I/O and reads no clock: inputs are method
//!   calls carrying the time, outputs are drained from it. Everything the coordinator decides
//!   (sampling, admission, validation, deadlines, quorum, aggregation) happens there.
//! - [`strategy`]: server strategies behind one trait (FedAvg, FedOMG, server momentum, the
//!   robust rewrites) and the configuration that builds them.
//! - [`objectives`]: the server sides of FedDIM and FedDDL (global tensors the tasks carry).
//! - [`updates`]: a round's deltas held compactly (heap or spill file), dot products streamed
//!   as they arrive, and their norms.
//! - [`replay`]: one aggregation re-run offline from `.npy` files.
//! - [`site`]: a site aggregator's link to the global federation.
//! - [`boot`]: the one way a round machine is made and started (fresh, or from its checkpoint
//!   and journal), used by the daemon, the demo and the simulator.
//! - [`export`]: a released head and its backbone as one ONNX file (`fedge-coordinator
//!   export`); it uses only the wire format and the file writer.
//! - [`config`]: the coordinator's TOML configuration.
//!
//! `io`, `replay`, `export`, `site` and `boot` may use everything; `store` uses `round`'s plain saved types; `round` uses
//! `strategy`, `objectives` and `updates`; `strategy` and `objectives` use `updates`; nothing
//! points back up. Nothing under `round`, `strategy`, `objectives` or `updates` (but the spill
//! file's creation) touches files, the network or a clock.

pub mod boot;
pub mod config;
pub mod export;
pub mod io;
pub mod objectives;
pub mod replay;
pub mod round;
pub mod site;
pub mod store;
pub mod strategy;
pub mod updates;

pub use config::CoordinatorConfig;
pub use io::driver::{self, DriverError, DriverEvent, DriverOptions, Evaluator};
pub use objectives::fedddl::PrototypeConfig;
pub use objectives::feddim::InsightConfig;
pub use round::{
    Checkpoint, DeviceKeys, Output, Phase, Rejection, ResumeError, RoundConfig, RoundReport, Rounds,
};
pub use strategy::{Aggregated, AggregationReport, FedAvg, Strategy, StrategyConfig, StrategyKind};
pub use updates::RoundUpdates;

#[cfg(test)]
mod layering_tests;
