//! The one atomic, durable write, and the lock around a read-modify-write.
//!
//! A reader (or a restart after power loss) sees either the old file or the new one, never a
//! mix: the bytes go to a temporary file of a name no other writer uses
//! (`<path>.<pid>.<n>.tmp`), which is fsynced, renamed over `path`, and then the folder is
//! fsynced so that the rename itself survives a crash. A file replaced keeps its owner and
//! group where the process may set them (a root-run tool editing a service's keys file leaves
//! it the service's).
//!
//! Two processes that read a file, change it and write it back (a `revoke` while the
//! coordinator enrols a device) take [`lock`] first, so neither undoes the other.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers the temporary files of this process.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

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
    let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
    tmp.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = write_then_rename(path, &tmp, bytes, visibility);
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // Some file systems refuse to open or fsync a folder; the data itself is already durable.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn write_then_rename(
    path: &Path,
    tmp: &Path,
    bytes: &[u8],
    visibility: Visibility,
) -> std::io::Result<()> {
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if visibility == Visibility::Private {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        }
        #[cfg(not(unix))]
        let _ = visibility;
        let mut file = options.open(tmp)?;
        keep_owner(path, &file);
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(tmp, path)
}

/// Gives `file` the owner and group of the file at `path`, when there is one and the process
/// may (root may; anyone else only keeps their own).
fn keep_owner(path: &Path, file: &std::fs::File) {
    #[cfg(unix)]
    if let Ok(old) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        if let Err(e) = std::os::unix::fs::fchown(file, Some(old.uid()), Some(old.gid())) {
            tracing::debug!(path = %path.display(), error = %e, "could not keep the file's owner");
        }
    }
    #[cfg(not(unix))]
    let _ = (path, file);
}

/// An exclusive lock on `<path>.lock`, held until dropped: every read-modify-write of `path`
/// takes it, so two processes (or threads) never interleave theirs. Blocks while another
/// holds it.
pub fn lock(path: &Path) -> std::io::Result<FileLock> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(PathBuf::from(name))?;
    file.lock()?;
    Ok(FileLock(file))
}

/// Held while a file is read, changed and written back (see [`lock`]); released on drop.
#[derive(Debug)]
pub struct FileLock(std::fs::File);

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Who holds a file in use (see [`hold_in_use`] and [`hold_alone`]).
#[derive(Debug)]
pub enum Hold {
    /// Held, until the value is dropped.
    Held(FileLock),
    /// Someone else holds it the other way.
    Taken,
}

/// A shared hold on `path` itself (no lock file beside it, so a read-only folder does): what
/// a process that keeps using the file takes, several at once. [`Hold::Taken`] while someone
/// holds it alone.
pub fn hold_in_use(path: &Path) -> std::io::Result<Hold> {
    let file = std::fs::File::open(path)?;
    match file.try_lock_shared() {
        Ok(()) => Ok(Hold::Held(FileLock(file))),
        Err(std::fs::TryLockError::WouldBlock) => Ok(Hold::Taken),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// An exclusive hold on `path` itself: what a process about to replace the file takes, so
/// that it does not while another process uses it. [`Hold::Taken`] while anyone holds it.
pub fn hold_alone(path: &Path) -> std::io::Result<Hold> {
    let file = std::fs::File::open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Hold::Held(FileLock(file))),
        Err(std::fs::TryLockError::WouldBlock) => Ok(Hold::Taken),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
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

    #[test]
    fn writers_in_parallel_never_share_a_temporary_file() {
        // With one fixed temporary name, one writer's rename took the other's half-written
        // file or failed with "no such file".
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        let body = vec![b'a' + t; 4096];
                        write_atomically(path, &body, Visibility::Private).unwrap();
                    }
                });
            }
        });
        let body = std::fs::read(&path).unwrap();
        assert_eq!(body.len(), 4096);
        assert!(body.iter().all(|&b| b == body[0]), "a mix of two writes");
    }

    #[test]
    fn a_read_modify_write_under_the_lock_loses_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("count");
        write_atomically(&path, b"0", Visibility::Private).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..25 {
                        let _held = lock(path).unwrap();
                        let n: u32 = std::fs::read_to_string(path).unwrap().parse().unwrap();
                        std::thread::yield_now();
                        write_atomically(path, (n + 1).to_string().as_bytes(), Visibility::Private)
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "100");
    }

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_keeps_its_owner_where_the_process_may_set_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devices.toml");
        write_atomically(&path, b"first", Visibility::Private).unwrap();
        if std::fs::metadata(&path).unwrap().uid() != 0 {
            return; // only root may give a file away: nothing to keep for anyone else
        }
        std::os::unix::fs::chown(&path, Some(10001), Some(10001)).unwrap();
        write_atomically(&path, b"second", Visibility::Private).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (10001, 10001));
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

    #[test]
    fn a_file_in_use_cannot_be_held_alone_and_can_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.key");
        std::fs::write(&path, b"key").unwrap();
        let first = hold_in_use(&path).unwrap();
        let second = hold_in_use(&path).unwrap();
        assert!(matches!(first, Hold::Held(_)) && matches!(second, Hold::Held(_)));
        assert!(matches!(hold_alone(&path).unwrap(), Hold::Taken));
        drop((first, second));
        let alone = hold_alone(&path).unwrap();
        assert!(matches!(alone, Hold::Held(_)));
        assert!(matches!(hold_in_use(&path).unwrap(), Hold::Taken));
    }
}
