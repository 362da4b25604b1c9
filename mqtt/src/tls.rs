//! TLS to the broker (rustls): the CA that signed the broker's certificate, and optionally a
//! client certificate and key for brokers that require them (`require_certificate true` in
//! mosquitto). Files are PEM; they are read when the configuration is loaded, so a missing or
//! wrong file is reported at start, not at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rumqttc::{TlsConfiguration, Transport};
use serde::{Deserialize, Serialize};

/// `[broker.tls]` in both binaries' configuration files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM file of the CA certificate(s) that signed the broker's certificate.
    pub ca_file: PathBuf,
    /// PEM client certificate, for brokers that require one (with `client_key`).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// The files' contents, once [`TlsSettings::load`] read them.
    #[serde(skip)]
    pub material: Option<Arc<TlsMaterial>>,
}

/// PEM bytes read from the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    /// CA certificate(s).
    pub ca: Vec<u8>,
    /// Client certificate and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("[broker.tls] {what} {}: {source}", path.display())]
    Read {
        /// Which setting named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not PEM, or lacks the block it must hold.
    #[error("[broker.tls] {what} {} is not a PEM file with a {marker}", path.display())]
    NotPem {
        /// Which setting named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM block expected.
        marker: &'static str,
    },
    /// A client certificate without its key or the other way round.
    #[error("[broker.tls] client_cert and client_key go together")]
    HalfClientIdentity,
}

fn read_pem(path: &Path, what: &'static str, marker: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    if !(text.contains("-----BEGIN ") && text.contains(marker)) {
        return Err(TlsError::NotPem {
            what,
            path: path.to_owned(),
            marker,
        });
    }
    Ok(bytes)
}

impl TlsSettings {
    /// Settings with just a CA file, read at once.
    pub fn with_ca(ca_file: impl Into<PathBuf>) -> Result<Self, TlsError> {
        let mut settings = Self {
            ca_file: ca_file.into(),
            client_cert: None,
            client_key: None,
            material: None,
        };
        settings.load(Path::new(""))?;
        Ok(settings)
    }

    /// Resolves the paths against `base` (the configuration file's folder) and reads them.
    pub fn load(&mut self, base: &Path) -> Result<(), TlsError> {
        self.ca_file = base.join(&self.ca_file);
        let ca = read_pem(&self.ca_file, "ca_file", "CERTIFICATE")?;
        let client = match (&mut self.client_cert, &mut self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                *cert = base.join(&*cert);
                *key = base.join(&*key);
                Some((
                    read_pem(cert, "client_cert", "CERTIFICATE")?,
                    read_pem(key, "client_key", "PRIVATE KEY")?,
                ))
            }
            _ => return Err(TlsError::HalfClientIdentity),
        };
        self.material = Some(Arc::new(TlsMaterial { ca, client }));
        Ok(())
    }

    /// The rumqttc transport. Settings never loaded give a TLS transport without a CA, whose
    /// connections fail: TLS is never silently dropped.
    pub fn transport(&self) -> Transport {
        let material = self.material.as_deref();
        Transport::tls_with_config(TlsConfiguration::Simple {
            ca: material.map(|m| m.ca.clone()).unwrap_or_default(),
            alpn: None,
            client_auth: material.and_then(|m| m.client.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_relative_to_the_config_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.path().join("ca.pem"), pem).unwrap();
        std::fs::write(dir.path().join("junk.pem"), "hello").unwrap();
        let mut ok = TlsSettings {
            ca_file: "ca.pem".into(),
            client_cert: None,
            client_key: None,
            material: None,
        };
        ok.load(dir.path()).unwrap();
        assert_eq!(ok.material.as_ref().unwrap().ca, pem.as_bytes());
        let mut junk = TlsSettings {
            ca_file: "junk.pem".into(),
            ..ok.clone()
        };
        let err = junk.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a PEM file"), "{err}");
        let mut missing = TlsSettings {
            ca_file: "nope.pem".into(),
            ..ok.clone()
        };
        let err = missing.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("nope.pem"), "{err}");
        let mut half = TlsSettings {
            client_cert: Some("ca.pem".into()),
            ..ok.clone()
        };
        let err = half.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("go together"), "{err}");
    }
}
