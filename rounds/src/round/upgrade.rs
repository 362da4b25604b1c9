//! Rolling upgrades: devices of this protocol version and of the previous one in one
//! federation (`fedge_wire::compat`).
//!
//! A device's status says which version it speaks (no `protocol` field: 7). While the upgrade
//! window is open (`[protocol]`, set by the driver from the wall clock) devices of the
//! previous version take part: their updates are read, and while one of them is online the
//! round tasks and releases are written in the previous version, which devices of this
//! version read too. Once the window closes they are selected for no round, their updates are
//! rejected as `version`, and the coordinator writes this version only. A federation whose
//! head trains a tail (protocol 10) selects no device of the previous version at all: that
//! release cannot run the tail.

use fedge_wire::{EdgeStatus, PREVIOUS_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::Rounds;
use super::types::{Output, Rejection};

impl Rounds {
    /// Opens or closes the upgrade window.
    pub fn set_previous_protocol(&mut self, accepted: bool) {
        if self.control.previous_protocol != accepted {
            self.control.previous_protocol = accepted;
            tracing::info!(
                accepted,
                version = PREVIOUS_PROTOCOL_VERSION,
                "devices of the previous protocol version"
            );
            self.outputs.push_back(Output::StatusChanged);
        }
    }

    /// Whether devices of the previous protocol version take part.
    pub fn previous_protocol_accepted(&self) -> bool {
        self.control.previous_protocol
    }

    /// Notes the version a device's believed status says it speaks.
    pub(super) fn note_protocol(&mut self, client: &str, status: &EdgeStatus) {
        if status.protocol_version() == PREVIOUS_PROTOCOL_VERSION {
            self.control.previous_speakers.insert(client.to_owned());
        } else {
            self.control.previous_speakers.remove(client);
        }
    }

    /// The version round tasks and releases are written in now: the previous one while a
    /// device speaking it is online and the window is open.
    pub fn downlink_version(&self) -> u8 {
        let speakers = &self.control.previous_speakers;
        if self.previous_admitted() && self.online.iter().any(|c| speakers.contains(c)) {
            PREVIOUS_PROTOCOL_VERSION
        } else {
            PROTOCOL_VERSION
        }
    }

    /// Online devices by the version they speak.
    pub fn device_protocols(&self) -> std::collections::BTreeMap<u8, u32> {
        let mut counts = std::collections::BTreeMap::new();
        for client in &self.online {
            let previous = self.control.previous_speakers.contains(client);
            let version = [PROTOCOL_VERSION, PREVIOUS_PROTOCOL_VERSION][usize::from(previous)];
            *counts.entry(version).or_insert(0) += 1;
        }
        counts
    }

    /// Whether a round may select `client`: always, but for a device of the previous version
    /// once the window closed.
    pub(super) fn admits_protocol(&self, client: &str) -> bool {
        self.previous_admitted() || !self.control.previous_speakers.contains(client)
    }

    /// Whether devices of the previous version may train: the window is open and the
    /// federation's head has no tail.
    fn previous_admitted(&self) -> bool {
        let tail = (self.config.head.as_ref()).is_some_and(|head| head.tail.is_some());
        self.control.previous_protocol && !tail
    }

    /// Rejects a frame of the previous version once the window closed; true when it did.
    pub(super) fn refused_protocol(&mut self, client: &str, payload: &[u8]) -> bool {
        let refused = !self.control.previous_protocol
            && fedge_wire::frame_version(payload) == PREVIOUS_PROTOCOL_VERSION;
        if refused {
            let detail = format!(
                "protocol {PREVIOUS_PROTOCOL_VERSION} is no longer accepted (the upgrade window \
                 closed): install the fedge-edge release that speaks {PROTOCOL_VERSION}"
            );
            self.reject(client, Rejection::Version, detail);
        }
        refused
    }
}
