//! The `fedge` front end's library: `fedge demo` runs a whole federation in one process — an
//! embedded broker, a coordinator and N edge agents, each its own MQTT client over loopback —
//! on the built-in rotated digits and the generated `digits-conv` backbone; `fedge eval` is
//! the leave-one-domain-out accuracy benchmark; `fedge bench …` measures costs.
//!
//! Nothing here is a simulation shortcut: the agents and the coordinator are the same library
//! code the `fedge-edge` and `fedge-coordinator` binaries run, talking through a real broker.
//! The command line itself (argument parsing, printing) lives in the binary, not here.

pub use fedge_redteam as attack;
pub mod bench;
pub mod datasets;
pub mod demo;
pub mod eval;
pub mod plot;
