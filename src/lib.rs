//! The `fedge` front end: `fedge demo` runs a whole federation in one process — an embedded
//! broker, a coordinator and N edge agents, each its own MQTT client over loopback — on the
//! built-in rotated digits and the generated `digits-conv` backbone.
//!
//! Nothing here is a simulation shortcut: the agents and the coordinator are the same library
//! code the `fedge-edge` and `fedge-coordinator` binaries run, talking through a real broker.

pub mod bench_aggregate;
pub mod bench_feddim;
pub mod bench_fleet;
pub mod bench_head;
pub mod bench_wire;
pub mod demo;
pub mod fdg;
pub mod plot;
