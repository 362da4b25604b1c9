//! fedge-coordinator: the coordinator daemon around the round machine.
//!
//! The machine itself, with its strategies, objectives, update storage and composition root,
//! is fedge-rounds (re-exported here as [`round`], [`strategy`], [`objectives`], [`updates`]
//! and [`boot`]), a crate without network I/O. This crate adds what touches the world:
//!
//! - [`io`]: the thin tokio + rumqttc driver around the machine, the status it publishes, the
//!   optional embedded rumqttd broker, Home Assistant discovery and the `watch` terminal view.
//! - [`store`]: the files (checkpoint, the open round's journal, device keys), all written
//!   through `fedge_daemon::write_atomically`.
//! - [`site`]: a site aggregator's link to the global federation.
//! - [`replay`]: one aggregation re-run offline from `.npy` files.
//! - [`export`]: a released head and its backbone as one ONNX file (`fedge-coordinator
//!   export`); it uses only the wire format and the file writer.
//! - [`config`]: the coordinator's TOML configuration, and the plan it makes.
//!
//! `io`, `replay`, `export` and `site` may use everything; `store` uses `round`'s plain saved
//! types; `config` the machine's settings.

pub mod config;
pub mod export;
pub mod io;
pub mod replay;
pub mod site;
pub mod store;

pub use fedge_rounds::{boot, buffer, objectives, release, round, strategy, updates};

pub use config::CoordinatorConfig;
pub use fedge_rounds::{
    Aggregated, AggregationReport, Checkpoint, DeviceKeys, FedAvg, InsightConfig, Output, Phase,
    PrototypeConfig, Rejection, ResumeError, RoundConfig, RoundReport, RoundUpdates, Rounds,
    Strategy, StrategyConfig, StrategyKind,
};
pub use io::driver::{self, DriverError, DriverEvent, DriverOptions, Evaluator};
