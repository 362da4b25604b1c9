//! Reading a secret (a device key, a keys file, a broker password): only from a file nobody
//! but its owner can read, like ssh does with its private keys.

use std::path::Path;

/// A secret file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Unreadable.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Readable by others than its owner.
    #[error(
        "readable by group or others (mode {mode:04o}); a secret must be private: run `chmod 600` on it"
    )]
    Exposed {
        /// The file's permission bits.
        mode: u32,
    },
}

/// Reads a secret file as text, refusing one that its group or others may read (on Unix).
pub fn read_secret(path: &Path) -> Result<String, SecretError> {
    let file = std::fs::File::open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata()?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Exposed { mode });
        }
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut &file, &mut text)?;
    Ok(text)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_secret_readable_by_others_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "s3cret").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_secret(&path).unwrap_err().to_string();
        assert!(err.contains("0644") && err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&path).unwrap(), "s3cret");
    }
}
