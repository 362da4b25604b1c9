//! The device keys file of a running coordinator, reloaded when it changes: `keygen` enrols a
//! device and `revoke` removes one without a restart.
//!
//! A change is noticed by the file's content (a SHA-256 of its bytes), not its modification
//! time, so two writes within one second are both seen. A changed file that does not load (an
//! editor saved it readable by others, `sudo` left it owned by root, a typo) fails closed: no
//! device key is accepted until it loads again, and the status says why (`keys_error`). The
//! keys before the change stay out of force, since the change may have been a revocation.

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::round::{DeviceKeys, Rounds};
use crate::store::audit::{AuditLog, Event};

/// The device keys file, looked at every [`KEYS_CHECK`].
pub(super) struct KeysWatch {
    /// The content last loaded or refused (`None`: unreadable).
    digest: Option<[u8; 32]>,
    /// Why the file does not load, while no key is accepted.
    pub(super) error: Option<String>,
    pub(super) next_check: Instant,
    /// While refused: the keys in force before, which the audit trail compares the fixed
    /// file with.
    held: Option<DeviceKeys>,
}

/// How often the file is looked at.
const KEYS_CHECK: Duration = Duration::from_secs(1);

/// The SHA-256 of the file's bytes, `None` when it cannot be read.
fn digest(path: &std::path::Path) -> Option<[u8; 32]> {
    std::fs::read(path).ok().map(|b| Sha256::digest(&b).into())
}

impl KeysWatch {
    /// Watches `path` from its current content (the keys the coordinator started with).
    pub(super) fn new(path: Option<&std::path::Path>) -> Self {
        Self {
            digest: path.and_then(digest),
            error: None,
            next_check: Instant::now() + KEYS_CHECK,
            held: None,
        }
    }

    /// Reloads the keys into `rounds` when the file's content changed; refuses every key
    /// when the changed file does not load. Keys added, replaced or removed go on the audit
    /// trail as enrolments and revocations by `operator:keys-file`.
    pub(super) fn poll(
        &mut self,
        path: &std::path::Path,
        rounds: &mut Rounds,
        audit: Option<&mut AuditLog>,
    ) {
        if Instant::now() < self.next_check {
            return;
        }
        self.next_check = Instant::now() + KEYS_CHECK;
        let now = digest(path);
        // While refused, the file is tried again every time: a fix may change its mode or
        // owner alone.
        if now == self.digest && self.error.is_none() {
            return;
        }
        self.digest = now;
        match crate::store::keys::load(path) {
            Ok(keys) => {
                let in_force = rounds.config().auth.as_deref().cloned();
                let before = match self.error.take() {
                    Some(_) => {
                        tracing::info!("the keys file loads again: device keys accepted");
                        self.held.take()
                    }
                    None => in_force,
                };
                if let Some(audit) = audit {
                    record_changes(audit, before.as_ref(), &keys);
                }
                rounds.set_device_keys(keys);
            }
            Err(e) => {
                let error = format!(
                    "the device keys file changed and does not load: {e}; no device key is \
                     accepted until it does"
                );
                if self.error.as_ref() != Some(&error) {
                    tracing::error!("{error}");
                    if self.error.is_none() {
                        self.held = rounds.config().auth.as_deref().cloned();
                    }
                    rounds.set_device_keys(DeviceKeys::new());
                    self.error = Some(error);
                }
            }
        }
    }
}

/// The keys that came into force or left between `before` and `after`, on the audit trail.
fn record_changes(audit: &mut AuditLog, before: Option<&DeviceKeys>, after: &DeviceKeys) {
    let who = "operator:keys-file";
    let empty = DeviceKeys::new();
    let before = before.unwrap_or(&empty);
    for (client, key) in after.iter() {
        if before.get(client) != Some(key) {
            let how = "keys-file".to_owned();
            audit.record(
                who,
                Event::Enrolled {
                    client: client.clone(),
                    how,
                },
            );
        }
    }
    for client in before.keys().filter(|c| !after.contains_key(*c)) {
        audit.record(
            who,
            Event::Revoked {
                client: client.clone(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::round::RoundConfig;
    use crate::strategy::FedAvg;

    fn write(path: &std::path::Path, text: &str) {
        std::fs::write(path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }

    #[test]
    fn a_changed_keys_file_that_does_not_load_accepts_no_key_until_it_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let key = |b: char| b.to_string().repeat(64);
        write(
            &path,
            &format!("cam-01 = \"{}\"\ncam-02 = \"{}\"\n", key('a'), key('b')),
        );
        let keys = crate::store::keys::load(&path).unwrap();
        let config = RoundConfig {
            auth: Some(Arc::new(keys)),
            ..RoundConfig::default()
        };
        let mut rounds = Rounds::new(config, Box::new(FedAvg), vec![0.0; 4]);
        let accepted = |r: &Rounds| r.config().auth.as_ref().map_or(0, |k| k.len());
        let mut watch = KeysWatch::new(Some(&path));
        let poll = |w: &mut KeysWatch, r: &mut Rounds| {
            w.next_check = Instant::now();
            w.poll(&path, r, None);
        };
        // A revocation saved readable by others: refused by the secret check, so nothing is
        // accepted (the revoked key must not stay in force), and the status says why.
        write(&path, &format!("cam-01 = \"{}\"\n", key('a')));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        poll(&mut watch, &mut rounds);
        assert_eq!(accepted(&rounds), 0);
        assert!(watch.error.as_deref().unwrap().contains("does not load"));
        // Fixed: the revocation takes effect.
        write(&path, &format!("cam-01 = \"{}\"\n", key('a')));
        poll(&mut watch, &mut rounds);
        assert_eq!((accepted(&rounds), watch.error.is_none()), (1, true));
        // Two changes within the same second are both seen (content, not mtime).
        write(&path, &format!("cam-03 = \"{}\"\n", key('c')));
        poll(&mut watch, &mut rounds);
        write(&path, "cam-03 = \"not hex\"\n");
        poll(&mut watch, &mut rounds);
        assert_eq!(accepted(&rounds), 0);
        assert!(watch.error.is_some());
    }
}
