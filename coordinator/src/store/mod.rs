//! The coordinator's files: the checkpoint after each aggregation ([`checkpoint`]), the open
//! round's journal ([`journal`]), what operator commands set ([`control`]), the device keys
//! ([`keys`]), the pending enrolments' one-time tokens ([`enrolments`]), the releases kept for
//! rollback ([`releases`]), the serving pointer's last number ([`serving`]) and the audit
//! trail ([`audit`]). Each file format is defined here and written through
//! `fedge_daemon::write_atomically` (the journal and the audit trail are appended, fsynced per
//! record); the values stored are the round machine's plain saved types, which never see a
//! file.

pub mod audit;
pub mod checkpoint;
pub mod control;
pub mod enrolments;
pub mod journal;
pub mod keys;
pub mod releases;
pub mod serving;
