//! The cost benchmarks behind `fedge bench …`: what training, extraction, aggregation and the
//! wire cost, each measured the way the daemons do the work. Accuracy is `fedge eval`'s
//! business ([`crate::eval`]); printing tables is the command line's.
//!
//! - `head`: local head training speed per Burn CPU backend.
//! - `feddim`: FedDIM's insight bytes and training cost against plain cross-entropy.
//! - `aggregate`: the coordinator's aggregation against a numpy transcription.
//! - `wire`: bytes per update and per task for each codec.
//! - `fleet`: many simulated devices against a running coordinator.
//! - `buffered`: buffered asynchronous aggregation against synchronous rounds under
//!   stragglers, in the simulator.
//! - `rollback`: how fast such a fleet goes back to an earlier release.
//! - `drift`: the drift alarm's false alarms and detection delay on `digits-sensor`.
//! - `labelling`: the labelling queue's labels against random ones on `digits-sensor`.
//! - `story`: `fedge demo --drift`, the drift, re-adaptation and labelling measurements of one
//!   seed told as a site lives them.

pub mod aggregate;
pub mod buffered;
pub mod drift;
pub mod feddim;
pub mod fleet;
pub mod gate;
pub mod head;
pub mod labelling;
pub mod rollback;
pub mod story;
pub mod wire;
