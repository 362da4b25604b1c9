//! Which release a device served, and from when: `<cache_dir>/<client_id>.serving.jsonl`, one
//! JSON line per release it started serving, `{"sha256", "round", "run", "from"}` (an older one
//! again after a rollback, too); a release serves until the next line's `from` (the last one
//! until now). A restart that serves the
//! same release again adds nothing, so the log stays compact; past [`MAX_BYTES`] its older half
//! is dropped. Private to the device, like its kept model.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use fedge_wire::ModelRelease;
use serde::{Deserialize, Serialize};

/// The log's size past which its older half is dropped.
pub const MAX_BYTES: u64 = 256 << 10;

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// The release's SHA-256, hex.
    pub sha256: String,
    /// Its round.
    pub round: u64,
    /// Its run, hex.
    pub run: String,
    /// When the device started serving it (RFC 3339, UTC).
    pub from: String,
}

/// `<cache_dir>/<client_id>.serving.jsonl`.
pub fn path(cache_dir: &Path, client_id: &str) -> PathBuf {
    cache_dir.join(format!("{client_id}.serving.jsonl"))
}

/// The lines of the log at `path` that read (none when there is no log).
pub fn read(path: &Path) -> Vec<Served> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Notes that the device serves `release` from `now`, unless it is the release the log's last
/// line names.
pub fn record(path: &Path, release: &ModelRelease, now: &str) -> std::io::Result<()> {
    let sha256 = release.sha256_hex();
    let log = read(path);
    if log.last().is_some_and(|last| last.sha256 == sha256) {
        return Ok(());
    }
    let line = Served {
        sha256,
        round: release.round,
        run: format!("{:016x}", release.run),
        from: now.to_owned(),
    };
    let text = serde_json::to_string(&line).map_err(std::io::Error::other)? + "\n";
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    if size + text.len() as u64 > MAX_BYTES {
        let keep = &log[log.len() / 2..];
        let mut all: String = (keep.iter())
            .filter_map(|l| serde_json::to_string(l).ok())
            .map(|l| l + "\n")
            .collect();
        all.push_str(&text);
        return fedge_daemon::write_atomically(
            path,
            all.as_bytes(),
            fedge_daemon::Visibility::Private,
        );
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(round: u64) -> ModelRelease {
        let head = fedge_wire::HeadConfig::new(4, 2).with_hidden(2);
        let params = head.init_flat(round);
        ModelRelease {
            federation: "f".into(),
            run: 0xab,
            round,
            strategy: "fedavg".into(),
            classes: vec!["a".into(), "b".into()],
            backbone: String::new(),
            sha256: ModelRelease::digest(&params),
            params: fedge_wire::TensorF32::from_slice(&params),
            head,
            feature_norm: fedge_wire::FeatureNorm::None,
            pooled: None,
        }
    }

    #[test]
    fn one_line_per_release_served_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let log = path(dir.path(), "cam");
        record(&log, &release(1), "t1").unwrap();
        record(&log, &release(1), "t2").unwrap();
        record(&log, &release(2), "t3").unwrap();
        let lines = read(&log);
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].round, lines[0].from.as_str()), (1, "t1"));
        assert_eq!(lines[1].sha256, release(2).sha256_hex());
        assert_eq!(lines[1].run, "00000000000000ab");
        for round in 3..4000 {
            record(&log, &release(round % 50 + 3), "t").unwrap();
        }
        assert!(std::fs::metadata(&log).unwrap().len() <= MAX_BYTES);
        assert_eq!(read(&log).last().unwrap().round, 3999 % 50 + 3);
    }

    #[test]
    fn a_rollback_is_a_switch_like_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let log = path(dir.path(), "cam");
        for (round, now) in [(1, "t1"), (2, "t2"), (1, "t3")] {
            record(&log, &release(round), now).unwrap();
        }
        let rounds: Vec<(u64, String)> =
            read(&log).into_iter().map(|l| (l.round, l.from)).collect();
        assert_eq!(
            rounds,
            [(1, "t1".into()), (2, "t2".into()), (1, "t3".into())]
        );
    }
}
