//! The releases kept for `ctl rollback`, across a restart: `state_dir/releases/`, one plain
//! frame per release (`<sha256>.bin`, as `model.bin` holds it) and `order.json`, their digests
//! from the oldest kept to the one every device serves.
//!
//! Written after each change of what is served; read at start. A file that is missing or does
//! not verify is left out with a warning: a restart never refuses to start over a kept
//! release, it only has fewer to go back to.

use std::path::Path;

use fedge_wire::{Message, ModelRelease};

const ORDER: &str = "order.json";

/// Keeps `kept` (oldest first) in `dir`: the frames not there yet, the order, and removes the
/// frames of releases no longer kept.
pub fn save<'a>(dir: &Path, kept: impl Iterator<Item = &'a ModelRelease>) -> std::io::Result<()> {
    let visibility = fedge_daemon::Visibility::Shared;
    let mut order = Vec::new();
    for release in kept {
        let name = release.sha256_hex();
        let path = dir.join(format!("{name}.bin"));
        if !path.exists() {
            let frame = fedge_wire::encode(&Message::Model(release.clone()));
            fedge_daemon::write_atomically(&path, &frame, visibility)?;
        }
        order.push(name);
    }
    let json = serde_json::to_vec(&order).expect("a list of strings serialises");
    fedge_daemon::write_atomically(&dir.join(ORDER), &json, visibility)?;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let stale = (file.strip_suffix(".bin")).is_some_and(|sha| !order.iter().any(|o| o == sha));
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// The releases kept in `dir`, oldest first; none when there is no such folder.
pub fn load(dir: &Path) -> Vec<ModelRelease> {
    let Ok(text) = std::fs::read(dir.join(ORDER)) else {
        return Vec::new();
    };
    let Ok(order) = serde_json::from_slice::<Vec<String>>(&text) else {
        tracing::warn!(dir = %dir.display(), "the kept releases' order does not read; none kept");
        return Vec::new();
    };
    let mut kept = Vec::new();
    for sha in order {
        let path = dir.join(format!("{sha}.bin"));
        let release =
            std::fs::read(&path)
                .ok()
                .and_then(|bytes| match fedge_wire::decode(&bytes) {
                    Ok(Message::Model(r)) if r.verify().is_ok() && r.sha256_hex() == sha => Some(r),
                    _ => None,
                });
        match release {
            Some(release) => kept.push(release),
            None => {
                tracing::warn!(path = %path.display(), "a kept release is missing or does not verify; left out")
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_wire::{HeadConfig, TensorF32};

    fn release(round: u64) -> ModelRelease {
        let head = HeadConfig::new(3, 2).with_hidden(2);
        let params = head.init_flat(round);
        ModelRelease {
            pooled: None,
            federation: "plant".into(),
            run: 1,
            round,
            strategy: "fedavg".into(),
            classes: vec!["a".into(), "b".into()],
            backbone: String::new(),
            sha256: ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            head,
            feature_norm: fedge_wire::FeatureNorm::None,
        }
    }

    #[test]
    fn kept_releases_come_back_in_their_order_and_dropped_ones_leave() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("releases");
        assert!(load(&dir).is_empty());
        let (a, b, c) = (release(1), release(2), release(3));
        // A rollback put round 1 last.
        save(&dir, [&b, &c, &a].into_iter()).unwrap();
        let rounds: Vec<u64> = load(&dir).iter().map(|r| r.round).collect();
        assert_eq!(rounds, [2, 3, 1]);
        save(&dir, [&c, &a].into_iter()).unwrap();
        assert_eq!(load(&dir).len(), 2);
        assert!(!dir.join(format!("{}.bin", b.sha256_hex())).exists());
        // A damaged frame is left out, the rest still load.
        std::fs::write(dir.join(format!("{}.bin", c.sha256_hex())), b"junk").unwrap();
        let rounds: Vec<u64> = load(&dir).iter().map(|r| r.round).collect();
        assert_eq!(rounds, [1]);
    }
}
