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
//! issued while it runs works at once. A token spent stays until it expires, marked with the
//! request that spent it (`spent_by`, the device's X25519 public value): the same request
//! again (its answer was lost) is answered again with the same key, any other is refused.
//! Every change takes the keys file's lock ([`super::keys::lock`]), so an `enroll`, a
//! `revoke` and the coordinator's redemption never undo each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fedge_wire::enrol::{EnrolToken, TOKEN_LEN};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use fedge_wire::DeviceKey;

use super::keys::{self, InvalidKeys, KeysError, write_private};
use crate::round::DeviceKeys;

/// One pending enrolment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pending {
    token: String,
    expires_ms: u64,
    /// The device public value of the request that spent the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spent_by: Option<String>,
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
    let held = keys::lock(keys_file)?;
    // The coordinator needs the keys file to start with device keys: an empty one until the
    // first device enrols.
    if !keys_file.exists() {
        keys::store_locked(&held, keys_file, &DeviceKeys::new())?;
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
        spent_by: None,
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

/// Why a request cannot be answered with a key.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No token to spend.
    #[error(transparent)]
    NoToken(#[from] NoToken),
    /// The request does not check against the token (or cannot be sealed): its text.
    #[error("{0}")]
    Request(String),
    /// The keys or enrolments file: logged in full, answered without its path.
    #[error(transparent)]
    Storage(#[from] KeysError),
}

/// Redeems `client`'s token for the request whose device public value is `device_public`:
/// `answer` checks the request against the token and seals the key for it; the key goes into
/// the keys file and the token is marked spent by this request, all under the keys file's
/// lock. The same request again (an answer lost on the way) is answered with the key it got;
/// another request with a spent token is refused. Returns the answer and every key in force.
pub fn redeem<R>(
    keys_file: &Path,
    client: &str,
    device_public: &str,
    now_ms: u64,
    answer: impl FnOnce(&EnrolToken, &DeviceKey) -> Result<R, String>,
) -> Result<(R, DeviceKeys), Refusal> {
    let held = keys::lock(keys_file)?;
    let path = path_for(keys_file);
    let mut pending = load(&path)?;
    let Some(entry) = pending.get(client).cloned() else {
        return Err(NoToken::None(client.to_owned()).into());
    };
    if entry.expires_ms < now_ms {
        return Err(NoToken::Expired(client.to_owned()).into());
    }
    let token = EnrolToken::from_hex(&entry.token).map_err(|e| KeysError::Invalid {
        path: path.display().to_string(),
        reason: InvalidKeys::ClientId(format!("{client}: {e}")),
    })?;
    let mut devices = if keys_file.exists() {
        keys::load(keys_file)?
    } else {
        DeviceKeys::new()
    };
    let again = match &entry.spent_by {
        None => None,
        Some(by) if by == device_public => devices.get(client).cloned(),
        Some(_) => return Err(NoToken::None(client.to_owned()).into()),
    };
    let Some(key) = again.or_else(|| entry.spent_by.is_none().then(keys::generate)) else {
        // Spent by this request, but the key has been revoked since.
        return Err(NoToken::None(client.to_owned()).into());
    };
    let response = answer(&token, &key).map_err(Refusal::Request)?;
    if entry.spent_by.is_none() {
        devices.insert(client.to_owned(), key);
        keys::store_locked(&held, keys_file, &devices)?;
        let spent = Pending {
            spent_by: Some(device_public.to_owned()),
            ..entry
        };
        pending.insert(client.to_owned(), spent);
        pending.retain(|_, p| p.expires_ms >= now_ms);
        store(&path, &pending)?;
    }
    Ok((response, devices))
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
        // The keys file the coordinator needs to start exists from the first token on.
        assert!(super::keys::load(&keys).unwrap().is_empty());
        let other = issue(&keys, "cam-10", 500).unwrap();
        assert_ne!(token, other);
        let seen = |t: &EnrolToken, k: &DeviceKey| Ok((t.clone(), k.clone()));
        assert!(matches!(
            redeem(&keys, "cam-10", "pub-b", 1_000, seen),
            Err(Refusal::NoToken(NoToken::Expired(_)))
        ));
        let ((used, key), devices) = redeem(&keys, "cam-09", "pub-a", 1_000, seen).unwrap();
        assert_eq!(used, token);
        assert_eq!(devices["cam-09"], key);
        // The same request again (its answer was lost): the same key, nothing new written.
        let ((_, again), _) = redeem(&keys, "cam-09", "pub-a", 1_500, seen).unwrap();
        assert_eq!(again, key);
        // Another request with the spent token: refused.
        assert!(matches!(
            redeem(&keys, "cam-09", "pub-c", 1_500, seen),
            Err(Refusal::NoToken(NoToken::None(_)))
        ));
        // The expired one went when the token was spent; the spent one goes when it expires.
        let text = std::fs::read_to_string(path_for(&keys)).unwrap();
        assert!(!text.contains("cam-10"), "{text}");
        // A request that does not check spends nothing.
        let third = issue(&keys, "cam-11", 2_000).unwrap();
        let refused = redeem(&keys, "cam-11", "pub-d", 1_000, |_, _| {
            Err::<(), _>("tag".into())
        });
        assert!(matches!(refused, Err(Refusal::Request(_))));
        let ((used, _), _) = redeem(&keys, "cam-11", "pub-d", 1_000, seen).unwrap();
        assert_eq!(used, third);
        assert!(issue(&keys, "bad id", 1).is_err());
    }

    #[test]
    fn a_revoke_while_tokens_are_issued_and_spent_is_never_undone() {
        // Each read-modify-write under the keys file's lock: without it, an issue or a
        // redemption that read the file before the revoke wrote it back with the revoked key.
        let dir = tempfile::tempdir().unwrap();
        let keys_file = dir.path().join("devices.toml");
        for i in 0..20 {
            keys::keygen(&keys_file, &format!("old-{i}"), &dir.path().join("k")).unwrap();
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20 {
                    keys::revoke(&keys_file, &format!("old-{i}")).unwrap();
                }
            });
            s.spawn(|| {
                for i in 0..20 {
                    let client = format!("new-{i}");
                    issue(&keys_file, &client, u64::MAX).unwrap();
                    let pub_ = format!("p{i}");
                    redeem(&keys_file, &client, &pub_, 0, |_, _| Ok(())).unwrap();
                }
            });
        });
        let left = keys::load(&keys_file).unwrap();
        assert_eq!(left.len(), 20, "{:?}", left.keys().collect::<Vec<_>>());
        assert!(left.keys().all(|c| c.starts_with("new-")));
    }
}
