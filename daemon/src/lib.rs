//! What fedge's daemons (`fedge-coordinator`, `fedge-edge`) and the front end need from the
//! machine they run on, written once:
//!
//! - [`durable`]: the one atomic, durable file write (temporary file, fsync, rename, folder
//!   fsync) behind every file fedge keeps: checkpoints, journals, keys, a device's round state
//!   and its feature cache.
//! - [`logs`]: the logging set-up (text or JSON, `RUST_LOG` filters).
//! - [`lists`]: one-entry-per-line text files (the federation's class list).
//! - [`secret`]: reading a secret only from a file private to its owner.
//! - [`metrics`]: the `GET /metrics` server for Prometheus and the process's memory.
//! - [`signals`]: the stop signals (Ctrl-C, SIGTERM) a daemon ends on.
//! - [`help`]: the command line's help checked the same way for both daemons.
//! - [`exit`]: how a command ends on an error: one line, no backtrace.
//! - [`reference`]: the configuration reference (Markdown) made from a configuration type.
//!
//! It knows nothing of rounds, messages, MQTT or ML.

pub mod checks;
pub mod durable;
pub mod exit;
pub mod help;
pub mod lists;
pub mod logs;
pub mod metrics;
pub mod private_dir;
pub mod reference;
pub mod secret;
pub mod signals;
pub mod toml_errors;

pub use durable::{FileLock, Hold, Visibility, hold_alone, hold_in_use, lock, write_atomically};
pub use lists::read_list;
pub use logs::{LogArgs, LogFormat, colour, init_logs, init_logs_to};
pub use secret::{SecretError, read_secret};
pub use signals::shutdown_signal;
pub use toml_errors::describe_toml;
