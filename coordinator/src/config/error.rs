//! Why a coordinator's configuration cannot be used: the file, and each field with what to fix.

use std::path::PathBuf;

use super::{InvalidPrivacy, InvalidSite, UnknownKey};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable file.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Invalid TOML or values.
    #[error("{path}: {reason}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// What to fix.
        reason: InvalidConfig,
    },
}

/// What is wrong in a configuration file; each message names the field to fix.
#[derive(Debug, thiserror::Error)]
pub enum InvalidConfig {
    /// Not TOML of this shape, or a value outside its set (the message lists the valid ones).
    #[error("{0}")]
    Toml(String),
    /// A key no table of its place takes: its line, the table's keys, and what it most likely
    /// is (the closest key, or the table that takes it).
    #[error("{0}")]
    UnknownKey(Box<UnknownKey>),
    /// A federation name that cannot be a topic level.
    #[error("federation: {0}")]
    Federation(fedge_wire::DecodeError),
    /// Strategy parameters out of range.
    #[error(transparent)]
    Strategy(#[from] crate::strategy::BuildError),
    /// A `[broker]` value out of range, or a file it names (TLS, password) unusable.
    #[error(transparent)]
    Broker(fedge_mqtt::BrokerSettingsError),
    /// `[model] backbone_sha256` that is not 64 hex digits.
    #[error("[model] backbone_sha256 must be 64 hex digits (sha256sum of the ONNX file)")]
    BackboneSha256,
    /// `[protocol] previous_until` that is not a time.
    #[error("{0}")]
    Protocol(String),
    /// `fraction` outside `(0, 1]`.
    #[error("fraction must be in (0, 1], got {0}")]
    Fraction(f32),
    /// A round timeout outside 0.1 s ..= 7 days.
    #[error("round_timeout_s must be between 0.1 and 604800 (7 days), got {0}")]
    RoundTimeout(f64),
    /// A quorum the selected clients can never reach.
    #[error(
        "min_updates = {min_updates} can never be reached: a round may select as few as \
         min_clients = {min_clients}; lower min_updates or raise min_clients"
    )]
    Quorum {
        /// The quorum asked for.
        min_updates: usize,
        /// The fewest clients a round selects.
        min_clients: usize,
    },
    /// `[train]` out of range.
    #[error(transparent)]
    Train(#[from] fedge_wire::InvalidTrain),
    /// The embedded broker on every interface.
    #[error(
        "embedded_broker listens without authentication or TLS; it may only listen on a \
         loopback address (set [broker] host = \"127.0.0.1\"), got {0:?}. For a broker other \
         machines reach, run mosquitto as docs/mosquitto.md shows"
    )]
    EmbeddedExposed(String),
    /// `[feddim]`'s `λ` or momentum.
    #[error("[feddim] needs lambda >= 0 and 0 <= momentum <= 1, got {lambda} and {momentum}")]
    FedDim {
        /// The `λ` asked for.
        lambda: f32,
        /// The momentum asked for.
        momentum: f32,
    },
    /// A negative or non-finite norm bound.
    #[error("{name} must be >= 0 (0: off), got {value}")]
    NormBound {
        /// The field.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// No memory for deltas.
    #[error("update_memory_mb must be at least 1")]
    UpdateMemory,
    /// An empty head.
    #[error("head needs features > 0, hidden > 0 and at least 2 classes")]
    Head,
    /// `[head.tail]` does not hold together, or `features` is not its output size.
    #[error("[head.tail]: {0}")]
    Tail(String),
    /// Both `classes` and `classes_file`.
    #[error("[model] sets both classes and classes_file; keep one")]
    ClassesTwice,
    /// The class file cannot be read.
    #[error("[model] classes_file {path}: {source}")]
    ClassFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A bad class list, or one whose length is not `[head] classes`.
    #[error("[model] classes: {0}")]
    Classes(#[from] fedge_wire::InvalidClasses),
    /// `role` and `[site]` do not fit.
    #[error(transparent)]
    Site(#[from] InvalidSite),
    /// `[privacy]` out of range, or combined with what central DP cannot protect.
    #[error(transparent)]
    Privacy(#[from] InvalidPrivacy),
    /// `[release]` out of range.
    #[error("{0}")]
    Release(String),
    /// `[aggregation]` out of range, or buffered with what it cannot define.
    #[error("{0}")]
    Aggregation(String),
}
