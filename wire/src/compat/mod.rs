//! Protocol versions before this one, frozen: what a device of the previous release reads and
//! writes, so that a coordinator of this release shares a federation with it during a rolling
//! upgrade.
//!
//! The coordinator reads both versions from devices and, while a device of the previous
//! version is online and the upgrade window is open, writes its round tasks and releases in
//! the previous version, which devices of this version read too. Each
//! module here keeps the types whose encoding changed since, as they were, and a test pins
//! their bytes, so that a later change to a shared type cannot silently change an old
//! version's encoding.

pub mod v9;
