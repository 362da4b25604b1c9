//! Pending enrolments: the one-time tokens `fedge-coordinator enroll` issues, kept beside the
//! keys file (`devices.toml` → `devices.enrolments.toml`, private to its owner) until the
//! device spends its token or the token expires.
//!
//! ```toml
//! [cam-09]
//! token = "<32 hex digits>"
//! expires_ms = 1764201600000
//! ```
//!
//! The running coordinator reads the file when a request arrives (`io/enrol.rs`), so a token
//! issued while it runs works at once; spending a token removes its entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fedge_wire::enrol::{EnrolToken, TOKEN_LEN};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::keys::{InvalidKeys, KeysError, write_private};

/// One pending enrolment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pending {
    token: String,
    expires_ms: u64,
}

/// Where the pending enrolments of a keys file are kept.
pub fn path_for(keys_file: &Path) -> PathBuf {
    let stem = keys_file
        .file_stem()
        .map_or_else(|| "keys".into(), |s| s.to_string_lossy().into_owned());
    keys_file.with_file_name(format!("{stem}.enrolments.toml"))
}

fn load(path: &Path) -> Result<BTreeMap<String, Pending>, KeysError> {
    if !path.exists() {
        return Ok(BTreeMap::new());
    }
    let text = fedge_daemon::read_secret(path).map_err(|source| KeysError::Secret {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| KeysError::Invalid {
        path: path.display().to_string(),
        reason: InvalidKeys::Toml(e),
    })
}

fn store(path: &Path, pending: &BTreeMap<String, Pending>) -> Result<(), KeysError> {
    let mut text = String::from(
        "# fedge pending enrolments (fedge-coordinator enroll): one-time tokens, removed when used\n",
    );
    // A map of plain strings and integers always serialises.
    text.push_str(&toml::to_string(pending).unwrap_or_default());
    write_private(path, text.as_bytes())
}

/// Issues a token for `client`, valid until `expires_ms` (ms since the Unix epoch), replacing
/// any pending one.
pub fn issue(keys_file: &Path, client: &str, expires_ms: u64) -> Result<EnrolToken, KeysError> {
    if !fedge_wire::valid_client_id(client) {
        return Err(KeysError::Invalid {
            path: keys_file.display().to_string(),
            reason: InvalidKeys::ClientId(client.to_owned()),
        });
    }
    let path = path_for(keys_file);
    let mut pending = load(&path)?;
    let mut bytes = [0u8; TOKEN_LEN];
    // The thread generator is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut bytes);
    let token = EnrolToken::from_bytes(bytes);
    let entry = Pending {
        token: token.to_hex(),
        expires_ms,
    };
    pending.insert(client.to_owned(), entry);
    store(&path, &pending)?;
    Ok(token)
}

/// Why a client has no token to spend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoToken {
    /// Never issued, or used already.
    #[error(
        "no enrolment is pending for {0:?} (issue one with `fedge-coordinator enroll --client {0}`; a token works once)"
    )]
    None(String),
    /// Issued but expired.
    #[error(
        "the enrolment token of {0:?} expired: issue a new one with `fedge-coordinator enroll`"
    )]
    Expired(String),
}

/// The token pending for `client` at `now_ms`.
pub fn pending(
    keys_file: &Path,
    client: &str,
    now_ms: u64,
) -> Result<Result<EnrolToken, NoToken>, KeysError> {
    let path = path_for(keys_file);
    let Some(entry) = load(&path)?.remove(client) else {
        return Ok(Err(NoToken::None(client.to_owned())));
    };
    if entry.expires_ms < now_ms {
        return Ok(Err(NoToken::Expired(client.to_owned())));
    }
    EnrolToken::from_hex(&entry.token)
        .map(Ok)
        .map_err(|e| KeysError::Invalid {
            path: path.display().to_string(),
            reason: InvalidKeys::ClientId(format!("{client}: {e}")),
        })
}

/// Forgets `client`'s token (spent) and any expired one at `now_ms`.
pub fn spend(keys_file: &Path, client: &str, now_ms: u64) -> Result<(), KeysError> {
    let path = path_for(keys_file);
    let mut pending = load(&path)?;
    pending.remove(client);
    pending.retain(|_, p| p.expires_ms >= now_ms);
    store(&path, &pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_pending_until_spent_or_expired() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("devices.toml");
        assert_eq!(path_for(&keys), dir.path().join("devices.enrolments.toml"));
        let token = issue(&keys, "cam-09", 2_000).unwrap();
        let other = issue(&keys, "cam-10", 500).unwrap();
        assert_ne!(token, other);
        assert_eq!(pending(&keys, "cam-09", 1_000).unwrap(), Ok(token));
        assert!(matches!(
            pending(&keys, "cam-10", 1_000).unwrap(),
            Err(NoToken::Expired(_))
        ));
        spend(&keys, "cam-09", 1_000).unwrap();
        assert!(matches!(
            pending(&keys, "cam-09", 1_000).unwrap(),
            Err(NoToken::None(_))
        ));
        // The expired one went with it.
        let text = std::fs::read_to_string(path_for(&keys)).unwrap();
        assert!(!text.contains("cam-10"), "{text}");
        assert!(issue(&keys, "bad id", 1).is_err());
    }
}
