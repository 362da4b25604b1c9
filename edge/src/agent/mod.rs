//! The device agent: a sans-IO state machine that takes the decisions ([`machine`]), the tokio
//! and MQTT loop that feeds it and performs its outputs ([`driver`]), the round state it keeps
//! across restarts ([`state`]) and what a running agent needs ([`setup`]).
//!
//! It does not load profiles (the profile loader builds its set-up) and does not train (see `crate::train`).

pub mod driver;
pub mod labels;
pub mod machine;
pub mod refresh;
pub mod serve;
pub mod setup;
pub mod state;

pub use driver::{AgentError, run_agent};
pub use machine::{
    Agent, AgentSummary, Identity, InvalidIdentity, Output, TaskError, Trained, class_stats,
    decode_task, rejection_of, too_slow_for,
};
pub use setup::{AgentSetup, Serving};
pub use state::RoundState;
