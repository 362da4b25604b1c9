//! The one atomic, durable write.
//!
//! A reader (or a restart after power loss) sees either the old file or the new one, never a
//! mix: the bytes go to `<path>.tmp`, which is fsynced, renamed over `path`, and then the
//! folder is fsynced so that the rename itself survives a crash.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Who may read the file written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// The process's umask decides (the coordinator's checkpoint and release, exports).
    Shared,
    /// Owner only (mode 0600 on Unix): key files, and what a device keeps of its data (the
    /// feature cache, its round state, the release it serves, fetched backbones) and the
    /// coordinator's journal of raw updates.
    Private,
}

/// Replaces `path` with `bytes` atomically and durably, creating its folder if needed.
pub fn write_atomically(path: &Path, bytes: &[u8], visibility: Visibility) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if visibility == Visibility::Private {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        }
        #[cfg(not(unix))]
        let _ = visibility;
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    // Some file systems refuse to open or fsync a folder; the data itself is already durable.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/state.bin");
        write_atomically(&path, b"first", Visibility::Shared).unwrap();
        write_atomically(&path, b"second, longer", Visibility::Shared).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.bin"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_private_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        write_atomically(&path, b"k", Visibility::Private).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
