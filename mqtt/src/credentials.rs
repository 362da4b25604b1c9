//! The broker login (`[broker] username` with `password` or `password_file`): Home Assistant's
//! Mosquitto add-on and hosted brokers require one. The password never appears in `Debug`
//! output and is never serialised; a password file must be readable by its owner only.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

/// A broker password. `Debug` prints `Password(<redacted>)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    secret: String,
    from_file: bool,
}

impl Password {
    /// A password given inline.
    pub fn new(secret: impl Into<String>) -> Self {
        Self {
            secret: secret.into(),
            from_file: false,
        }
    }

    /// The password itself, for the CONNECT packet.
    pub fn expose(&self) -> &str {
        &self.secret
    }

    /// True when it was read from `password_file`.
    pub fn from_file(&self) -> bool {
        self.from_file
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

/// Why `password_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    /// The file cannot be read, or group or others may read it.
    #[error("[broker] password_file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (the fix, for a file others may read).
        source: fedge_daemon::SecretError,
    },
    /// The file is empty, or holds more than one line.
    #[error("[broker] password_file {} must hold the password on one line", path.display())]
    NotOneLine {
        /// The file.
        path: PathBuf,
    },
}

/// Reads the password from `path`: one line (a final newline is dropped), in a file only its
/// owner may read.
pub fn read_password_file(path: &Path) -> Result<Password, PasswordFileError> {
    let text = fedge_daemon::read_secret(path).map_err(|source| PasswordFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let line = text
        .strip_suffix('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .unwrap_or(&text);
    if line.is_empty() || line.contains(['\n', '\r']) {
        return Err(PasswordFileError::NotOneLine {
            path: path.to_owned(),
        });
    }
    Ok(Password {
        secret: line.to_owned(),
        from_file: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[cfg(unix)]
    #[test]
    fn a_password_file_is_one_line_readable_by_its_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let ok = write(dir.path(), "ok", "s3cret\n", 0o600);
        let password = read_password_file(&ok).unwrap();
        assert_eq!(password.expose(), "s3cret");
        assert!(password.from_file());
        let crlf = write(dir.path(), "crlf", "s3cret\r\n", 0o400);
        assert_eq!(read_password_file(&crlf).unwrap().expose(), "s3cret");
        for mode in [0o640, 0o604, 0o644] {
            let open = write(dir.path(), "open", "s3cret\n", mode);
            let err = read_password_file(&open).unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
        for bad in ["", "\n", "a\nb\n"] {
            let path = write(dir.path(), "bad", bad, 0o600);
            let err = read_password_file(&path).unwrap_err().to_string();
            assert!(err.contains("one line"), "{bad:?}: {err}");
        }
        let err = read_password_file(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("password_file") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let text = format!("{:?}", Some(Password::new("hunter2")));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("redacted"), "{text}");
    }
}
