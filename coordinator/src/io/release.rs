//! The released model on the broker and on disk: each release is written to the state folder
//! (`model.bin`, the plain frame `fedge-coordinator export` reads) and published retained on
//! `model/current`, sealed with every device key when the federation has keys, so that a
//! device believes only the coordinator's release.

use std::path::Path;

use fedge_wire::{DeviceKey, Message, ModelRelease};

use crate::round::DeviceKeys;

/// The frames of one release: `plain` for the state folder, `published` for the broker.
pub struct ReleaseFrames {
    /// The plain frame.
    pub plain: Vec<u8>,
    /// The frame on `model/current`: the plain one, sealed when there are keys.
    pub published: Vec<u8>,
}

/// Frames `release`, sealed for every device in `keys`; the published frame in protocol
/// `version` (the round machine's `downlink_version`), the plain one in this release's.
pub fn frames(release: &ModelRelease, keys: Option<&DeviceKeys>, version: u8) -> ReleaseFrames {
    let message = Message::Model(release.clone());
    let plain = fedge_wire::encode(&message);
    let sent = match version {
        fedge_wire::PROTOCOL_VERSION => plain.clone(),
        other => fedge_wire::encode_as(&message, other),
    };
    let published = sealed(sent, keys);
    ReleaseFrames { plain, published }
}

/// `inner` sealed for every device in `keys`, or as it is without keys: what a device with a
/// key believes of the coordinator's retained frames and pointers.
pub fn sealed(inner: Vec<u8>, keys: Option<&DeviceKeys>) -> Vec<u8> {
    match keys {
        Some(keys) => {
            let signers: Vec<(&str, &DeviceKey)> =
                keys.iter().map(|(c, k)| (c.as_str(), k)).collect();
            fedge_wire::seal(inner, &signers)
        }
        None => inner,
    }
}

/// The release kept in a state folder's `model.bin`, if there is a valid one.
pub fn load(path: &Path) -> Option<ModelRelease> {
    let bytes = std::fs::read(path).ok()?;
    match fedge_wire::decode(&bytes) {
        Ok(Message::Model(release)) if release.verify().is_ok() => Some(release),
        _ => {
            tracing::warn!(path = %path.display(), "ignoring an unreadable released model");
            None
        }
    }
}

/// Writes the plain frame to `path` (atomically).
pub fn save(path: &Path, plain: &[u8]) {
    let visibility = fedge_daemon::Visibility::Shared;
    if let Err(e) = fedge_daemon::write_atomically(path, plain, visibility) {
        tracing::error!(path = %path.display(), error = %e, "released model not saved");
    }
}
