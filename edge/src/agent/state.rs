//! The device's round state file: what `fedge_device::RoundState` keeps across restarts,
//! written through the one durable atomic write (`fedge_daemon::write_atomically`). A missing
//! or damaged file is a fresh state.

use std::path::Path;

use fedge_daemon::{Visibility, write_atomically};
use fedge_device::RoundState;

/// Reads the state file; a missing or unreadable file is a fresh state (logged).
pub fn load(path: &Path) -> RoundState {
    match std::fs::read(path) {
        Ok(bytes) => RoundState::from_json(&bytes).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "round state unreadable; starting afresh");
            RoundState::default()
        }),
        Err(_) => RoundState::default(),
    }
}

/// Writes the state file atomically and durably.
pub fn save(state: &RoundState, path: &Path) -> std::io::Result<()> {
    write_atomically(path, &state.to_json(), Visibility::Private)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_state_survives_a_restart_and_a_damaged_file_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cam.round.json");
        assert_eq!(load(&path), RoundState::default());
        let state = RoundState {
            run: 3,
            last_round: 7,
            seq: 9,
            ..RoundState::default()
        };
        save(&state, &path).unwrap();
        assert_eq!(load(&path), state);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "the round state is the device's own");
        }
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(load(&path), RoundState::default());
    }
}
