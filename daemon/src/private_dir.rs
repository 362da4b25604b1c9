//! Folders and files an agent keeps for itself on a machine other users share (a labelling
//! queue, say): a folder private to the agent's user, refused when someone else could control
//! it, and reading a file that is never a symbolic link planted in its place.

use std::path::Path;

/// The bytes of the regular file at `path`, never through a symbolic link: the entry must be
/// a regular file, and the file opened the same one (on Unix, a link put in its place between
/// the look and the opening is caught by the file's identity).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let seen = std::fs::symlink_metadata(path)?;
    if !seen.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file (a symbolic link?)",
        ));
    }
    let mut file = std::fs::File::open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let opened = file.metadata()?;
        if (opened.dev(), opened.ino()) != (seen.dev(), seen.ino()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "replaced while being opened",
            ));
        }
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok(bytes)
}

/// Makes `dir` (and the folders above it that are missing) private to the agent's user
/// (mode 0700), or checks the one there: refused when it is a symbolic link or not a folder,
/// belongs to another user (on Linux, where the process's user is known) or may be written
/// by group or others; one others may only read is made private.
pub fn ensure_private_dir(dir: &Path, setting: &str) -> Result<(), String> {
    let refuse = |problem: String| problem;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    if std::fs::symlink_metadata(dir).is_err() {
        builder
            .create(dir)
            .map_err(|e| format!("cannot be made: {e}"))?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot be read: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(refuse(format!(
            "is a symbolic link: it needs a folder of its own; remove the link or set {setting} to a real folder"
        )));
    }
    if !meta.is_dir() {
        return Err(refuse(format!(
            "is not a folder: remove it or set {setting}"
        )));
    }
    #[cfg(unix)]
    check_owner_and_mode(dir, &meta, setting).map_err(refuse)?;
    Ok(())
}

/// The Unix half of [`ensure_private_dir`]: `dir`'s owner and permission bits.
#[cfg(unix)]
fn check_owner_and_mode(dir: &Path, meta: &std::fs::Metadata, setting: &str) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if let Some(me) = current_uid()
        && meta.uid() != me
    {
        return Err(format!(
            "belongs to user {}, not to the agent's user ({me}): another user who made it \
             first would control what is in it; remove it, or give it to the agent's user \
             (`chown`), or set {setting} to a folder of its own",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "is writable by group or others (mode {mode:04o}), who could plant files in it \
             that the agent would move or delete: check what it holds, then run \
             `chmod 700 {}`",
            dir.display()
        ));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            format!("is readable by others (mode {mode:04o}) and `chmod 700` failed: {e}")
        })?;
        tracing::info!(dir = %dir.display(), "folder made private (mode 0700)");
    }
    Ok(())
}

/// The process's effective user id, from `/proc/self/status` (Linux; `None` elsewhere).
#[cfg(unix)]
pub fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}
