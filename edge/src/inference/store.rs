//! Where a device keeps the last release it verified: one file per device in its cache
//! folder, holding the plain frame (`fedge_wire::encode` of `Message::Model`, the format of the
//! coordinator's `state/model.bin`), written atomically so a crash leaves the old one or the
//! new one, never half of either.

use std::io;
use std::path::{Path, PathBuf};

use fedge_daemon::{Visibility, write_atomically};
use fedge_wire::{InvalidRelease, Message, ModelRelease};

/// A model file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file exists but cannot be read.
    #[error("cannot read model file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a model frame (truncated, corrupt, or another kind of message).
    #[error(
        "model file {} is corrupt ({reason}): delete it, the agent receives the release again \
         from the broker",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The frame decodes but the release does not verify (tampered or damaged values).
    #[error(
        "model file {} does not verify ({source}): it was altered; delete it, the agent \
         receives the release again from the broker",
        path.display()
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which check failed.
        source: InvalidRelease,
    },
}

/// `<cache_dir>/<client_id>.model.bin`, where a device keeps its latest release.
pub fn model_path(cache_dir: &Path, client_id: &str) -> PathBuf {
    cache_dir.join(format!("{client_id}.model.bin"))
}

/// Writes `release` to `path` as a plain frame, atomically and durably (the folder is created
/// when missing).
pub fn save(path: &Path, release: &ModelRelease) -> io::Result<()> {
    let bytes = fedge_wire::encode(&Message::Model(release.clone()));
    write_atomically(path, &bytes, Visibility::Private)
}

/// Reads the release kept in `path`: `Ok(None)` when there is no file yet, an error when the
/// file is unreadable, corrupt or does not verify (`ModelRelease::verify`).
pub fn load(path: &Path) -> Result<Option<ModelRelease>, StoreError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let release = match fedge_wire::decode(&bytes) {
        Ok(Message::Model(release)) => release,
        Ok(other) => {
            return Err(corrupt(format!(
                "it holds a {:?} message, not a model",
                other.kind()
            )));
        }
        Err(e) => return Err(corrupt(e.to_string())),
    };
    release.verify().map_err(|source| StoreError::Invalid {
        path: path.to_owned(),
        source,
    })?;
    Ok(Some(release))
}

#[cfg(test)]
mod tests {
    use fedge_wire::TensorF32;
    use fedge_wire::layout::HeadConfig;

    use super::*;

    fn release() -> ModelRelease {
        let head = HeadConfig::new(4, 2).with_hidden(3);
        let params = head.init_flat(7);
        ModelRelease {
            pooled: None,
            federation: "plant".into(),
            run: 2,
            round: 5,
            strategy: "fedavg".into(),
            classes: vec!["ok".into(), "scratch".into()],
            backbone: "digits-conv".into(),
            sha256: ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            head,
            feature_norm: fedge_wire::FeatureNorm::None,
        }
    }

    #[test]
    fn a_release_round_trips_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = model_path(&dir.path().join("cache"), "cam-1");
        assert!(path.ends_with("cache/cam-1.model.bin"));
        assert!(load(&path).unwrap().is_none());
        save(&path, &release()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(release()));
        let mut next = release();
        next.round = 6;
        save(&path, &next).unwrap();
        assert_eq!(load(&path).unwrap().unwrap().round, 6);
    }

    #[test]
    fn tampered_truncated_and_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.bin");

        // Values changed and the frame's checksum recomputed: only the digest can tell.
        let mut forged = release();
        let mut values = forged.params.to_vec();
        values[0] += 0.5;
        forged.params = TensorF32::from_slice(&values);
        std::fs::write(&path, fedge_wire::encode(&Message::Model(forged))).unwrap();
        let err = load(&path).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Invalid {
                    source: InvalidRelease::Digest,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("altered"), "{err}");

        // A flipped byte: the frame does not decode.
        let mut bytes = fedge_wire::encode(&Message::Model(release()));
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("corrupt"), "{err}");

        // Cut short, empty, or not ours at all.
        let whole = fedge_wire::encode(&Message::Model(release()));
        for bytes in [
            &whole[..whole.len() - 3],
            &[][..],
            b"hello world, not a frame",
        ] {
            std::fs::write(&path, bytes).unwrap();
            assert!(matches!(load(&path), Err(StoreError::Corrupt { .. })));
        }
    }
}
