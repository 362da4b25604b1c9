//! The serving pointer's last number, kept across a restart: `serving.json` in the state
//! folder, written before each pointer is published, read at start.
//!
//! ```json
//! {"last_seq": 1764115200000}
//! ```
//!
//! A device takes only a pointer numbered above the last one it took, and the coordinator
//! numbers pointers from the wall clock (`io/serving.rs`): without this file, a coordinator
//! restarted after its clock went back would number every pointer below what devices took, and
//! none would follow a rollback or a canary. A file that cannot be read stops the start with
//! the reason; removing it (the coordinator stopped) numbers from the clock again.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Kept {
    /// The number of the last pointer published.
    last_seq: u64,
}

/// `serving.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ServingFileError {
    /// Unreadable or unwritable.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not the JSON of a pointer's number.
    #[error(
        "{path}: {reason} (it keeps the last serving pointer's number, {{\"last_seq\": N}}; fix \
         it, or remove it with the coordinator stopped to number pointers from the clock again)"
    )]
    Invalid {
        /// File.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The number of the last pointer published, kept at `path`; 0 when there is no file.
pub fn load(path: &Path) -> Result<u64, ServingFileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            let path = path.display().to_string();
            return Err(ServingFileError::Io { path, source });
        }
    };
    serde_json::from_slice::<Kept>(&bytes)
        .map(|kept| kept.last_seq)
        .map_err(|e| ServingFileError::Invalid {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

/// Keeps `last_seq` at `path` (atomically).
pub fn store(path: &Path, last_seq: u64) -> Result<(), ServingFileError> {
    // A struct of one number always serialises.
    let mut json = serde_json::to_vec(&Kept { last_seq }).unwrap_or_default();
    json.push(b'\n');
    fedge_daemon::write_atomically(path, &json, fedge_daemon::Visibility::Shared).map_err(
        |source| ServingFileError::Io {
            path: path.display().to_string(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_survives_the_file_and_a_damaged_file_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serving.json");
        assert_eq!(load(&path).unwrap(), 0);
        store(&path, 1_764_115_200_000).unwrap();
        assert_eq!(load(&path).unwrap(), 1_764_115_200_000);
        std::fs::write(&path, b"{\"last_seq\": -1}").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("serving.json") && e.contains("remove it"), "{e}");
    }
}
