//! TLS to the broker (rustls with the ring provider): the CA that signed the broker's
//! certificate (a PEM file, or the system's CA store when no file is named, as hosted brokers
//! with public certificates need), and optionally a client certificate and key for brokers that
//! require them (`require_certificate true` in mosquitto). Files are read and the rustls
//! configuration is built when the configuration is loaded, so a missing or wrong file is
//! reported at start, not at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rumqttc::{TlsConfiguration, Transport};
use serde::{Deserialize, Serialize};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Installs ring as the process-wide rustls crypto provider, once; later calls, and calls after
/// another provider was installed, change nothing. Every TLS configuration fedge builds calls it
/// first, so a TLS connection never depends on which rustls features the build happened to
/// enable.
pub fn install_crypto_provider() {
    // An error only says a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `[broker.tls]` in both binaries' configuration files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM file of the CA certificate(s) that signed the broker's certificate; empty (the key
    /// left out): the system's CA store.
    #[serde(default, skip_serializing_if = "is_empty_path")]
    pub ca_file: PathBuf,
    /// PEM client certificate, for brokers that require one (with `client_key`: both or
    /// neither).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`, readable by its owner only (`chmod 600`).
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// What the files hold, once [`TlsSettings::load`] read them.
    #[serde(skip)]
    pub material: Option<Arc<TlsMaterial>>,
}

fn is_empty_path(path: &Path) -> bool {
    path.as_os_str().is_empty()
}

/// The files' contents and the rustls configuration built from them.
#[derive(Clone)]
pub struct TlsMaterial {
    /// PEM bytes of `ca_file`; empty when the system's CA store is used.
    pub ca: Vec<u8>,
    /// PEM bytes of the client certificate and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    config: Arc<rustls::ClientConfig>,
}

impl PartialEq for TlsMaterial {
    fn eq(&self, other: &Self) -> bool {
        self.ca == other.ca && self.client == other.client
    }
}

impl std::fmt::Debug for TlsMaterial {
    /// Sizes only: the client key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_bytes", &self.ca.len())
            .field("client_identity", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the TLS settings cannot be used.
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
    /// The client key is unreadable or readable by others than its owner.
    #[error("[broker.tls] client_key {}: {source}", path.display())]
    Secret {
        /// The file.
        path: PathBuf,
        /// Why.
        source: fedge_daemon::SecretError,
    },
    /// A client certificate without its key or the other way round.
    #[error("[broker.tls] client_cert and client_key go together")]
    HalfClientIdentity,
    /// No `ca_file` and nothing usable in the system's CA store.
    #[error(
        "[broker.tls] no ca_file and no usable certificate in the system's CA store: install \
         the ca-certificates package or set ca_file to the CA that signed the broker"
    )]
    NoSystemRoots,
    /// rustls refused the certificates or the key (a key that does not match the certificate,
    /// an unsupported key type, a CA certificate it cannot parse).
    #[error("[broker.tls] {what}: {message}")]
    Refused {
        /// Which setting.
        what: &'static str,
        /// rustls's reason.
        message: String,
    },
}

fn read_pem(path: &Path, what: &'static str, marker: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    check_pem(path, bytes, what, marker)
}

/// The client key, read as every secret is: refused when its group or others may read it.
fn read_key(path: &Path) -> Result<Vec<u8>, TlsError> {
    let text = fedge_daemon::read_secret(path).map_err(|source| TlsError::Secret {
        path: path.to_owned(),
        source,
    })?;
    check_pem(path, text.into_bytes(), "client_key", "PRIVATE KEY")
}

fn check_pem(
    path: &Path,
    bytes: Vec<u8>,
    what: &'static str,
    marker: &'static str,
) -> Result<Vec<u8>, TlsError> {
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

/// The rustls client configuration: roots from `ca` (PEM) or the system store, and the client
/// identity if any.
fn client_config(
    ca: &[u8],
    client: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<rustls::ClientConfig, TlsError> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    if ca.is_empty() {
        let system = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(system.certs);
        if roots.is_empty() {
            return Err(TlsError::NoSystemRoots);
        }
    } else {
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| refused("ca_file", e))?;
            roots.add(cert).map_err(|e| refused("ca_file", e))?;
        }
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| refused("client_cert", e))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| refused("client_key", e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| refused("client_cert and client_key", e))
        }
    }
}

fn refused(what: &'static str, e: impl std::fmt::Display) -> TlsError {
    TlsError::Refused {
        what,
        message: e.to_string(),
    }
}

impl TlsSettings {
    /// Settings with just a CA file, read at once.
    pub fn with_ca(ca_file: impl Into<PathBuf>) -> Result<Self, TlsError> {
        Self::with_files(ca_file, None)
    }

    /// Settings with a CA file and optionally a client certificate and key, read at once.
    pub fn with_files(
        ca_file: impl Into<PathBuf>,
        client: Option<(PathBuf, PathBuf)>,
    ) -> Result<Self, TlsError> {
        let (client_cert, client_key) = client.unzip();
        let mut settings = Self {
            ca_file: ca_file.into(),
            client_cert,
            client_key,
            material: None,
        };
        settings.load(Path::new(""))?;
        Ok(settings)
    }

    /// Settings that trust the system's CA store (not read yet: [`TlsSettings::load`] or the
    /// first [`TlsSettings::transport`] reads it).
    pub fn system_roots() -> Self {
        Self {
            ca_file: PathBuf::new(),
            client_cert: None,
            client_key: None,
            material: None,
        }
    }

    /// Resolves the paths against `base` (the configuration file's folder), reads them and
    /// builds the rustls configuration.
    pub fn load(&mut self, base: &Path) -> Result<(), TlsError> {
        let ca = if is_empty_path(&self.ca_file) {
            Vec::new()
        } else {
            self.ca_file = base.join(&self.ca_file);
            read_pem(&self.ca_file, "ca_file", "CERTIFICATE")?
        };
        let client = match (&mut self.client_cert, &mut self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                *cert = base.join(&*cert);
                *key = base.join(&*key);
                Some((
                    read_pem(cert, "client_cert", "CERTIFICATE")?,
                    read_key(key)?,
                ))
            }
            _ => return Err(TlsError::HalfClientIdentity),
        };
        let config = Arc::new(client_config(&ca, client.as_ref())?);
        self.material = Some(Arc::new(TlsMaterial { ca, client, config }));
        Ok(())
    }

    /// Where the trusted roots come from, for messages: the CA file or the system's store.
    pub fn roots(&self) -> String {
        if is_empty_path(&self.ca_file) {
            "the system's CA store".into()
        } else {
            format!("CA {}", self.ca_file.display())
        }
    }

    /// The rumqttc transport. Settings naming files that were never loaded give a TLS
    /// transport without a CA, whose connections fail: TLS is never silently dropped. Settings
    /// that only trust the system's store read it here if [`TlsSettings::load`] did not.
    pub fn transport(&self) -> Transport {
        let material = match &self.material {
            Some(material) => Some(material.clone()),
            None if is_empty_path(&self.ca_file) && self.client_cert.is_none() => {
                let mut settings = self.clone();
                match settings.load(Path::new("")) {
                    Ok(()) => settings.material,
                    Err(e) => {
                        tracing::error!(error = %e, "no TLS roots: connections will fail");
                        None
                    }
                }
            }
            None => None,
        };
        Transport::tls_with_config(match material {
            Some(material) => TlsConfiguration::Rustls(material.config.clone()),
            None => TlsConfiguration::Simple {
                ca: Vec::new(),
                alpn: None,
                client_auth: None,
            },
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
        let base = TlsSettings {
            ca_file: "ca.pem".into(),
            ..TlsSettings::system_roots()
        };
        // A PEM block that is not a certificate rustls can parse: refused at load.
        let err = base.clone().load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ca_file"), "{err}");
        let mut junk = TlsSettings {
            ca_file: "junk.pem".into(),
            ..base.clone()
        };
        let err = junk.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a PEM file"), "{err}");
        let mut missing = TlsSettings {
            ca_file: "nope.pem".into(),
            ..base.clone()
        };
        let err = missing.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("nope.pem"), "{err}");
        let mut half = TlsSettings {
            client_cert: Some("ca.pem".into()),
            ..base.clone()
        };
        let err = half.load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("go together"), "{err}");
        // The client key is a secret: refused while others may read it.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.path().join("client.key");
            std::fs::write(
                &key,
                "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
            )
            .unwrap();
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
            let mut exposed = TlsSettings {
                client_cert: Some("ca.pem".into()),
                client_key: Some("client.key".into()),
                ..base.clone()
            };
            let err = exposed.load(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains("client_key") && err.contains("chmod 600"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_crypto_provider_is_installed_once_and_configurations_build_again_and_again() {
        install_crypto_provider();
        install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // The system store may be empty on a build machine; either way building twice gives
        // the same answer and does not panic.
        let first = TlsSettings::system_roots().load(Path::new("")).is_ok();
        let second = TlsSettings::system_roots().load(Path::new("")).is_ok();
        assert_eq!(first, second);
        for _ in 0..2 {
            assert!(matches!(
                TlsSettings::system_roots().transport(),
                Transport::Tls(_)
            ));
        }
    }

    #[test]
    fn debug_output_never_shows_the_client_key() {
        let material = TlsMaterial {
            ca: b"ca".to_vec(),
            client: Some((b"cert".to_vec(), b"SECRET-KEY-BYTES".to_vec())),
            config: {
                install_crypto_provider();
                Arc::new(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
            },
        };
        let text = format!("{material:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(!text.contains("83, 69, 67"), "{text}"); // the key's bytes as numbers
    }
}
