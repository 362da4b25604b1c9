//! `fedge-coordinator audit show`: which release a device was served at a time, and who
//! built it.

use std::time::SystemTime;

use serde::Serialize;

use super::format::{Entry, Event};

/// What a device was served at a time, by the trail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Served {
    /// The device asked about.
    pub device: String,
    /// The time asked about, RFC 3339.
    pub at: String,
    /// The release in force then (the latest `released` at or before `at`), none before the
    /// first.
    pub release: Option<ServedRelease>,
    /// The device's last enrolment or revocation on the trail at or before `at`: `enrolled`,
    /// `revoked`, or none (its key came with the keys file the coordinator started with).
    pub device_key: Option<&'static str>,
}

/// A release as `audit show` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServedRelease {
    /// The round whose aggregate it is.
    pub round: u64,
    /// Its run.
    pub run: String,
    /// Its SHA-256.
    pub sha256: String,
    /// When it was released.
    pub released_at: String,
    /// The clients whose updates built it.
    pub built_by: Vec<String>,
    /// Relayed from the global federation (its trail names who built it).
    pub relayed: bool,
}

/// Which release `device` was served at `at`: the latest `released` entry at or before `at`,
/// except that a release in its canary stage (`rollout` to a list of devices, written before
/// its `released` line) is in force for a device outside the list only from its `rollout` to
/// every device (`*`). A device that was offline then may still have served an older one; a
/// revoked device can open no later release.
pub fn served_at(entries: &[Entry], device: &str, at: SystemTime) -> Served {
    let mut served = Served {
        device: device.into(),
        at: humantime::format_rfc3339_millis(at).to_string(),
        release: None,
        device_key: None,
    };
    // A release in its canary stage, and whether this device is one of its canaries.
    let mut canary: Option<(String, bool)> = None;
    // That release, released but not yet in force for this device.
    let mut staged: Option<ServedRelease> = None;
    // Who built each release, from its first `released` line: a rollback (after a restart
    // too) publishes it again without them.
    let mut builders: std::collections::BTreeMap<&str, &[String]> = Default::default();
    for entry in entries {
        match humantime::parse_rfc3339_weak(&entry.at) {
            Ok(when) if when <= at => {}
            _ => continue,
        }
        match &entry.event {
            Event::Released {
                round,
                run,
                sha256,
                built_by,
                relayed,
            } => {
                if !built_by.is_empty() {
                    builders
                        .entry(sha256.as_str())
                        .or_insert(built_by.as_slice());
                }
                let built_by = builders.get(sha256.as_str()).copied().unwrap_or(built_by);
                let release = ServedRelease {
                    round: *round,
                    run: run.clone(),
                    sha256: sha256.clone(),
                    released_at: entry.at.clone(),
                    built_by: built_by.to_vec(),
                    relayed: *relayed,
                };
                match &canary {
                    Some((sha, false)) if sha == sha256 => staged = Some(release),
                    _ => {
                        served.release = Some(release);
                        staged = None;
                    }
                }
            }
            Event::Rollout { sha256, devices } if devices.iter().any(|d| d == "*") => {
                if let Some(mut release) = staged.take().filter(|r| &r.sha256 == sha256) {
                    release.released_at = entry.at.clone();
                    served.release = Some(release);
                }
                canary = None;
            }
            Event::Rollout { sha256, devices } => {
                canary = Some((sha256.clone(), devices.iter().any(|d| d == device)));
            }
            // A failed canary or a rollback: the release it returns to comes as `released`.
            Event::Rollback { .. } => {
                canary = None;
                staged = None;
            }
            Event::Enrolled { client, .. } if client == device => {
                served.device_key = Some("enrolled")
            }
            Event::Revoked { client } if client == device => served.device_key = Some("revoked"),
            _ => {}
        }
    }
    served
}
