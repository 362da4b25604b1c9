//! The coordinator's saved state: global head, next round, the strategy's buffers (server
//! momentum).
//!
//! File format: `FDGC | version u8 | postcard(Checkpoint) | CRC-32 (ISO-HDLC, LE) of all before`.
//! [`save`] writes a temporary file beside the target, fsyncs it, renames it over the target and
//! fsyncs the directory, so a crash leaves either the old or the new checkpoint, never a mix.
//! The round machine builds and consumes [`Checkpoint`] values; only this file touches disk.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::strategy::StrategyState;

const MAGIC: &[u8; 4] = b"FDGC";
/// Version 2 added FedDDL's prototypes.
const VERSION: u8 = 2;
/// Slice-by-16 tables: 2.3 GiB/s against 0.37 GiB/s for the byte-wise table on a 134 KB frame
/// (`cargo bench --workspace --bench crc`).
const CRC: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

/// Everything needed to continue a federation after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Federation name.
    pub federation: String,
    /// Strategy name (`fedavg`, `fedomg+momentum`, ...).
    pub strategy: String,
    /// The next round to open.
    pub next_round: u64,
    /// Rounds aggregated so far.
    pub aggregated_rounds: u64,
    /// Global head parameters.
    pub params: Vec<f32>,
    /// The strategy's buffers.
    pub strategy_state: StrategyState,
    /// FedDIM's global insight matrices `[K, H, K]`; empty when there are none.
    pub insight: Vec<f32>,
    /// FedDDL's global causal prototypes `[K, H]`; empty when there are none.
    pub prototypes: Vec<f32>,
}

/// A checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Not a checkpoint, another version, or damaged.
    #[error("{path}: {reason}; move it away to start the federation afresh")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Serialises a checkpoint.
pub fn encode(checkpoint: &Checkpoint) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.push(VERSION);
    out.extend(postcard::to_stdvec(checkpoint).expect("checkpoint serialises"));
    let crc = CRC.checksum(&out);
    out.extend(crc.to_le_bytes());
    out
}

/// Parses a checkpoint; `Err` names what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
    if bytes.len() < MAGIC.len() + 1 + 4 || &bytes[..4] != MAGIC {
        return Err("not a fedge coordinator checkpoint".into());
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if CRC.checksum(body) != stored {
        return Err("checksum mismatch (damaged file)".into());
    }
    if body[4] != VERSION {
        return Err(format!(
            "checkpoint version {}, this build reads {VERSION}",
            body[4]
        ));
    }
    let checkpoint: Checkpoint =
        postcard::from_bytes(&body[5..]).map_err(|e| format!("undecodable: {e}"))?;
    let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
    if !finite(&checkpoint.params)
        || !finite(&checkpoint.insight)
        || !finite(&checkpoint.prototypes)
        || !checkpoint.strategy_state.values().all(|v| finite(v))
    {
        return Err("non-finite parameters".into());
    }
    Ok(checkpoint)
}

/// Writes `checkpoint` to `path` atomically (temporary file, fsync, rename, fsync directory).
pub fn save(path: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    fedge_daemon::write_atomically(path, &encode(checkpoint), fedge_daemon::Visibility::Shared)
        .map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        })
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io {
            path: path.to_owned(),
            source,
        }),
        Ok(bytes) => decode(&bytes)
            .map(Some)
            .map_err(|reason| CheckpointError::Invalid {
                path: path.to_owned(),
                reason,
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            federation: "plant".into(),
            strategy: "fedomg+momentum".into(),
            next_round: 7,
            aggregated_rounds: 6,
            params: vec![0.5, -1.0, 2.0],
            strategy_state: StrategyState::from([("server_momentum".into(), vec![0.1, 0.2, 0.3])]),
            insight: vec![0.5; 8],
            prototypes: vec![0.25; 4],
        }
    }

    #[test]
    fn save_then_load_gives_the_same_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/checkpoint.bin");
        assert!(load(&path).unwrap().is_none());
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(sample()));
        assert!(!dir.path().join("state/checkpoint.bin.tmp").exists());
    }

    #[test]
    fn damaged_or_foreign_files_are_clear_errors() {
        let mut bytes = encode(&sample());
        assert!(decode(&bytes[..3]).unwrap_err().contains("not a fedge"));
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        assert!(decode(&bytes).unwrap_err().contains("checksum"));
        let mut nan = sample();
        nan.params[1] = f32::NAN;
        assert!(decode(&encode(&nan)).unwrap_err().contains("non-finite"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.bin");
        std::fs::write(&path, b"hello world").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("c.bin") && err.contains("afresh"), "{err}");
    }
}
