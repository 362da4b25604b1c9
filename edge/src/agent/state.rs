//! What a device remembers across restarts: the last round it answered, its update sequence
//! and how long its last training took.
//!
//! The file is JSON written through the one durable atomic write
//! (`fedge_daemon::write_atomically`); a missing or damaged file is a fresh state. Deciding
//! what to do with the state is the machine's job (`super::machine`), not this module's.

use std::path::Path;

use fedge_daemon::{Visibility, write_atomically};

/// What a device remembers across restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoundState {
    /// Last round the device trained and answered.
    pub last_round: u64,
    /// Sequence number of its last update.
    pub seq: u64,
    /// Seconds its last local training took.
    pub last_train_seconds: f32,
}

impl RoundState {
    /// Reads the state file; a missing or unreadable file is a fresh state (logged).
    pub fn load(path: &Path) -> Self {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "round state unreadable; starting afresh");
                Self::default()
            }),
            Err(_) => Self::default(),
        }
    }

    /// Writes the state file atomically and durably.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        write_atomically(
            path,
            &serde_json::to_vec(self).unwrap_or_default(),
            Visibility::Shared,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_state_survives_a_restart_and_a_damaged_file_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cam.round.json");
        assert_eq!(RoundState::load(&path), RoundState::default());
        let state = RoundState {
            last_round: 7,
            seq: 9,
            last_train_seconds: 1.5,
        };
        state.save(&path).unwrap();
        assert_eq!(RoundState::load(&path), state);
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(RoundState::load(&path), RoundState::default());
    }
}
