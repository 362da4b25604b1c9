//! The device keys file of a running coordinator, reloaded when it changes: `keygen` enrols a
//! device and `revoke` removes one without a restart.

use std::time::{Duration, Instant};

use crate::round::Rounds;

/// The device keys file, looked at every [`KEYS_CHECK`]: reloaded into the machine when its
/// modification time changes; a file that does not load keeps the keys in force.
pub(super) struct KeysWatch {
    modified: Option<std::time::SystemTime>,
    pub(super) next_check: Instant,
}

/// How often the keys file is looked at.
const KEYS_CHECK: Duration = Duration::from_secs(1);

impl KeysWatch {
    pub(super) fn new(path: Option<&std::path::Path>) -> Self {
        Self {
            modified: path.and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()),
            next_check: Instant::now() + KEYS_CHECK,
        }
    }

    pub(super) fn poll(&mut self, path: &std::path::Path, rounds: &mut Rounds) {
        if Instant::now() < self.next_check {
            return;
        }
        self.next_check = Instant::now() + KEYS_CHECK;
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_none() || modified == self.modified {
            return;
        }
        match crate::store::keys::load(path) {
            Ok(keys) => {
                self.modified = modified;
                rounds.set_device_keys(keys);
            }
            Err(e) => {
                tracing::error!(error = %e, "the keys file changed but does not load; the keys in force stay")
            }
        }
    }
}
