//! fedge's deterministic simulator: the real coordinator round machine (global, and site
//! aggregators in relay mode under it) and the real device agent machines, connected through
//! an in-memory broker (topics, retained messages, persistent sessions) on a virtual clock.
//! A selected device trains with the very function the deployed agent runs
//! (`fedge_device::train::run_round`); a coordinator checkpoints and journals as the daemon does
//! and restarts from them.
//!
//! Faults are first-class: latency, loss, duplication and reordering ([`Network`], [`Rule`]),
//! a device offline or restarted, a site cut off, a coordinator crashed and restarted
//! ([`Action`]). The same seed gives the same run, bit for bit.
//!
//! Modules: [`broker`] (the topic table), [`faults`] (the network), `device` and
//! `coordinator` (the nodes), `device_io` and `coordinator_io` (each node's outputs carried
//! out, as the daemons' drivers do), `world` (the clock, the queue, the steps).

pub mod broker;
mod coordinator;
mod coordinator_io;
mod device;
mod device_io;
mod error;
pub mod faults;
mod world;

pub use broker::NodeId;
pub use coordinator::{CoordinatorSpec, Upstream};
pub use device::{DeviceSpec, class_names};
pub use error::SimError;
pub use faults::{Fault, Network, Rule};
pub use world::{Action, Observed, Sim};

#[cfg(test)]
mod pair_tests;
