//! Device keys on the coordinator: the keys file and `fedge-coordinator keygen`.
//!
//! The keys file is TOML, one line per device: `cam-01 = "<64 hex digits>"`. Each device holds
//! its own key alone in the file its profile names as `key_file`. `keygen` makes a random key,
//! writes the device's file (mode 0600 on Unix) and adds or replaces the device's line in the
//! keys file, so provisioning a device is one command.

use std::collections::BTreeMap;
use std::path::Path;

use fedge_wire::{DeviceKey, KEY_LEN};
use rand::RngCore;

use crate::round::DeviceKeys;

/// A keys file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// `[auth] keys_file` names a file that does not exist.
    #[error(
        "[auth] keys_file {path} does not exist: `fedge-coordinator keygen --keys {path} …` or \
         `fedge-coordinator enroll --keys {path} …` creates it"
    )]
    MissingKeys {
        /// File.
        path: String,
    },
    /// `[auth] operator_key_file` names a file that does not exist.
    #[error(
        "[auth] operator_key_file {path} does not exist: `fedge-coordinator ctl --config <this \
         configuration> keygen` creates it"
    )]
    MissingOperatorKey {
        /// File.
        path: String,
    },
    /// Unreadable or unwritable file.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Unreadable, or readable by others than its owner.
    #[error("{path}: {source}")]
    Secret {
        /// File.
        path: String,
        /// Cause.
        source: fedge_daemon::SecretError,
    },
    /// Not TOML of `client = "hex"` lines, or a bad key or client id.
    #[error("{path}: {reason}")]
    Invalid {
        /// File.
        path: String,
        /// What to fix.
        reason: InvalidKeys,
    },
}

/// What is wrong with the text of a keys file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidKeys {
    /// Not TOML of `client = "hex"` lines.
    #[error("expected lines of client = \"64 hex digits\": {0}")]
    Toml(#[from] toml::de::Error),
    /// A client id devices cannot have.
    #[error("client id {0:?} must be 1-64 characters of A-Z a-z 0-9 _ . -")]
    ClientId(String),
    /// A key that is not 64 hex digits.
    #[error("key of {client:?}: {source}")]
    Key {
        /// The client.
        client: String,
        /// What is wrong with the key.
        source: fedge_wire::KeyError,
    },
}

/// Reads a keys file.
pub fn load(path: &Path) -> Result<DeviceKeys, KeysError> {
    let shown = path.display().to_string();
    if !path.exists() {
        return Err(KeysError::MissingKeys { path: shown });
    }
    let text = fedge_daemon::read_secret(path).map_err(|source| KeysError::Secret {
        path: shown.clone(),
        source,
    })?;
    parse(&text).map_err(|reason| KeysError::Invalid {
        path: shown,
        reason,
    })
}

/// Parses the text of a keys file.
pub fn parse(text: &str) -> Result<DeviceKeys, InvalidKeys> {
    let table: BTreeMap<String, String> = toml::from_str(text)?;
    let mut keys = DeviceKeys::new();
    for (client, hex) in table {
        if !fedge_wire::valid_client_id(&client) {
            return Err(InvalidKeys::ClientId(client));
        }
        let key = match DeviceKey::from_hex(&hex) {
            Ok(key) => key,
            Err(source) => return Err(InvalidKeys::Key { client, source }),
        };
        keys.insert(client, key);
    }
    Ok(keys)
}

/// Takes the lock every read-modify-write of `keys_file` and of its pending enrolments
/// takes (`fedge_daemon::lock`), held until dropped.
pub fn lock(keys_file: &Path) -> Result<fedge_daemon::FileLock, KeysError> {
    fedge_daemon::lock(keys_file).map_err(|source| KeysError::Io {
        path: keys_file.display().to_string(),
        source,
    })
}

/// Writes a keys file (all devices, sorted by id), under its lock.
pub fn store(path: &Path, keys: &DeviceKeys) -> Result<(), KeysError> {
    let held = lock(path)?;
    store_locked(&held, path, keys)
}

/// Writes a keys file whose lock the caller holds.
pub(super) fn store_locked(
    _held: &fedge_daemon::FileLock,
    path: &Path,
    keys: &DeviceKeys,
) -> Result<(), KeysError> {
    let mut text = String::from("# fedge device keys: client id = HMAC-SHA256 key (hex)\n");
    for (client, key) in keys {
        text.push_str(&format!("{client} = \"{}\"\n", key.to_hex()));
    }
    write_private(path, text.as_bytes())
}

/// Removes `client` from the keys file: a running coordinator reloads the file and rejects the
/// device's next update or status as `unknown_device`.
pub fn revoke(keys_file: &Path, client: &str) -> Result<(), KeysError> {
    let held = lock(keys_file)?;
    let mut keys = load(keys_file)?;
    if keys.remove(client).is_none() {
        return Err(KeysError::Invalid {
            path: keys_file.display().to_string(),
            reason: InvalidKeys::ClientId(format!("{client} (not in this file)")),
        });
    }
    store_locked(&held, keys_file, &keys)
}

/// The operator's key (`[auth] operator_key_file`: 64 hex digits on one line, private to its
/// owner), which tags `fedge-coordinator ctl` commands.
pub fn load_operator(path: &Path) -> Result<DeviceKey, KeysError> {
    if !path.exists() {
        let path = path.display().to_string();
        return Err(KeysError::MissingOperatorKey { path });
    }
    let text = fedge_daemon::read_secret(path).map_err(|source| KeysError::Secret {
        path: path.display().to_string(),
        source,
    })?;
    DeviceKey::from_hex(&text).map_err(|source| KeysError::Invalid {
        path: path.display().to_string(),
        reason: InvalidKeys::Key {
            client: "operator".into(),
            source,
        },
    })
}

/// Writes a fresh operator key to `path` (private to its owner); refuses to replace one.
pub fn operator_keygen(path: &Path) -> Result<(), KeysError> {
    if path.exists() {
        return Err(KeysError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "an operator key is there already; remove it first to replace it",
            ),
        });
    }
    write_private(path, format!("{}\n", generate().to_hex()).as_bytes())
}

/// A fresh random key from the operating system's generator.
pub fn generate() -> DeviceKey {
    let mut bytes = [0u8; KEY_LEN];
    // The thread generator is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut bytes);
    DeviceKey::from_bytes(bytes)
}

/// Provisions `client`: a new key in its own file `device_file` and in the keys file
/// (created when missing; an existing line for the client is replaced).
pub fn keygen(keys_file: &Path, client: &str, device_file: &Path) -> Result<(), KeysError> {
    if !fedge_wire::valid_client_id(client) {
        return Err(KeysError::Invalid {
            path: keys_file.display().to_string(),
            reason: InvalidKeys::ClientId(client.to_owned()),
        });
    }
    let held = lock(keys_file)?;
    let mut keys = if keys_file.exists() {
        load(keys_file)?
    } else {
        DeviceKeys::new()
    };
    let key = generate();
    write_private(device_file, format!("{}\n", key.to_hex()).as_bytes())?;
    keys.insert(client.to_owned(), key);
    store_locked(&held, keys_file, &keys)
}

/// Writes a file readable by its owner only (on Unix), replacing it atomically.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeysError> {
    fedge_daemon::write_atomically(path, bytes, fedge_daemon::Visibility::Private).map_err(
        |source| KeysError::Io {
            path: path.display().to_string(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_provisions_a_device_and_keeps_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let keys_file = dir.path().join("devices.toml");
        keygen(&keys_file, "cam-01", &dir.path().join("cam-01.key")).unwrap();
        keygen(&keys_file, "cam-02", &dir.path().join("cam-02.key")).unwrap();
        let first = load(&keys_file).unwrap();
        keygen(&keys_file, "cam-01", &dir.path().join("cam-01.key")).unwrap();
        let keys = load(&keys_file).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys["cam-02"], first["cam-02"]);
        assert_ne!(
            keys["cam-01"], first["cam-01"],
            "a new key replaces the old one"
        );
        let device = std::fs::read_to_string(dir.path().join("cam-01.key")).unwrap();
        assert_eq!(DeviceKey::from_hex(&device).unwrap(), keys["cam-01"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("cam-01.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn bad_keys_files_say_what_to_fix() {
        // A missing file names the setting and the command that makes it.
        let dir = tempfile::tempdir().unwrap();
        let missing = load(&dir.path().join("devices.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("[auth] keys_file") && missing.contains("keygen"),
            "{missing}"
        );
        let missing = load_operator(&dir.path().join("op.key"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("operator_key_file") && missing.contains("ctl"),
            "{missing}"
        );
        assert!(
            parse("cam = \"abc\"")
                .unwrap_err()
                .to_string()
                .contains("64 hex digits")
        );
        assert!(matches!(
            parse("\"a b\" = \"00\""),
            Err(InvalidKeys::ClientId(_))
        ));
        assert!(matches!(parse("cam = 3"), Err(InvalidKeys::Toml(_))));
        assert!(keygen(Path::new("k.toml"), "bad id", Path::new("x.key")).is_err());
    }
}
