//! What operator commands set, kept across a restart: `control.json` in the state folder,
//! written (private to its owner) for every command the coordinator takes, read at start.
//!
//! ```json
//! {"last_seq": 1764115200000, "paused": false, "banned": ["cam-07"], "rounds": 500}
//! ```
//!
//! Written before a command is applied (`io/driver.rs`): a command whose settings cannot be
//! written is refused, so that no effect of it is published that a restart would forget.
//! A file that cannot be read stops the start with the reason: starting without it would
//! silently unban devices and accept captured commands again. Removing the file (the
//! coordinator stopped) goes back to the configuration.

use std::path::Path;

use crate::round::OperatorSettings;

/// `control.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ControlFileError {
    /// Unreadable or unwritable.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not the JSON of operator settings.
    #[error(
        "{path}: {reason} (it keeps bans, pause, set-rounds, set-backbone, reset-pool and the \
         last command's number; fix it, or remove it to go back to the configuration's settings)"
    )]
    Invalid {
        /// File.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The settings kept at `path`; none (the configuration's) when there is no file.
pub fn load(path: &Path) -> Result<Option<OperatorSettings>, ControlFileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            let path = path.display().to_string();
            return Err(ControlFileError::Io { path, source });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ControlFileError::Invalid {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

/// Replaces the settings kept at `path`.
pub fn store(path: &Path, settings: &OperatorSettings) -> Result<(), ControlFileError> {
    // Plain strings, numbers and sets always serialise.
    let mut json = serde_json::to_vec_pretty(settings).unwrap_or_default();
    json.push(b'\n');
    fedge_daemon::write_atomically(path, &json, fedge_daemon::Visibility::Private).map_err(
        |source| ControlFileError::Io {
            path: path.display().to_string(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_survive_the_file_and_a_damaged_file_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.json");
        assert_eq!(load(&path).unwrap(), None);
        let settings = OperatorSettings {
            last_seq: 42,
            paused: true,
            banned: ["cam-07".to_string()].into(),
            rounds: Some(500),
            backbone: Some(("mobilenet".into(), "ab".repeat(32))),
            runs: vec![fedge_wire::RunSummary {
                run: "00000000000000ff".into(),
                first_round: 1,
                last_round: 10,
                aggregated: 10,
            }],
            run_start: Some((11, 10)),
            pinned: true,
            pool_reset: Some(10),
            run: Some("00000000000001ff".into()),
        };
        store(&path, &settings).unwrap();
        assert_eq!(load(&path).unwrap(), Some(settings));
        std::fs::write(&path, b"{\"last_seq\": \"x\"}").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("control.json") && e.contains("remove it"), "{e}");
    }
}
