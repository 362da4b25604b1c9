//! The commands of `fedge-coordinator`, one module each: `run` (the daemon, global or site
//! aggregator), `aggregate` (one aggregation replayed from files), `watch` (the terminal view),
//! `export` (a release as one ONNX file), `keys` (keygen, revoke, enroll), `provision` (a
//! federation's start-up kit), `check` (what `run` would trip over) and `audit` (the audit
//! trail verified and asked). `ctl` and
//! `publish-backbone` are the library's (`io::ctl`, `io::backbone`).

pub mod aggregate;
pub mod audit;
pub mod check;
pub mod export;
pub mod keys;
pub mod provision;
pub mod run;
pub mod watch;
