//! The coordinator's files: the checkpoint after each aggregation ([`checkpoint`]), the open
//! round's journal ([`journal`]) and the device keys ([`keys`]). Each file format is defined
//! here and written through `fedge_daemon::write_atomically`; the values stored are the round
//! machine's plain saved types, which never see a file.

pub mod checkpoint;
pub mod journal;
pub mod keys;
