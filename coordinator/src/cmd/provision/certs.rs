//! The certificates of a start-up kit, made with rcgen (ECDSA P-256, signed with ring): the
//! federation's CA, the broker's server certificate and one client certificate per identity
//! (the common name is the identity on the broker, docs/mosquitto.md).

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

/// Days the federation's CA is valid; no certificate it signs is issued for longer.
pub const CA_DAYS: u32 = 3650;

/// A certificate and its private key, both PEM (the key PKCS#8).
pub struct Pair {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

/// What a leaf certificate is for.
pub enum Role<'a> {
    /// The broker: TLS server for `host` and `ips` (its subject alternative names).
    Server {
        /// Host name (or address) clients connect to.
        host: &'a str,
        /// Further addresses clients may connect to.
        ips: &'a [IpAddr],
    },
    /// A client of the broker; its common name is its user name and client id there.
    Client,
}

/// The federation's CA, able to sign.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
}

/// The CA's common name: the federation is in it, so a kit's CA is recognised as its own.
fn ca_name(federation: &str) -> String {
    format!("fedge federation CA {federation}")
}

/// The CA's parameters (apart from its validity). A kit's CA is signed again from these and its
/// key when provision runs again, so they must not change between releases.
fn ca_params(federation: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, ca_name(federation));
    // Signs end-entity certificates only, no intermediate CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// (year, month, day) in UTC of `time`.
fn ymd(time: SystemTime) -> anyhow::Result<(i32, u8, u8)> {
    // "2025-11-26T08:30:00Z"
    let text = humantime::format_rfc3339_seconds(time).to_string();
    let field = |range: std::ops::Range<usize>| text.get(range).and_then(|s| s.parse().ok());
    match (field(0..4), field(5..7), field(8..10)) {
        (Some(y), Some(m), Some(d)) => Ok((y, m as u8, d as u8)),
        _ => bail!("cannot read the date {text}"),
    }
}

/// Valid from yesterday (a device whose clock is a little behind still accepts it) for `days`.
fn set_validity(params: &mut CertificateParams, days: u32) -> anyhow::Result<()> {
    const DAY: Duration = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let (y, m, d) = ymd(now - DAY)?;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(now + DAY * days)?;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(())
}

fn new_key() -> anyhow::Result<KeyPair> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("cannot make a P-256 key")
}

/// The DER bytes of the first certificate in `pem`.
fn pem_der(pem: &str) -> Option<Vec<u8>> {
    let body = pem
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)?
        .split("-----END CERTIFICATE-----")
        .next()?;
    let base64: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(base64)
        .ok()
}

impl Ca {
    /// A new CA for `federation`, valid [`CA_DAYS`].
    pub fn create(federation: &str) -> anyhow::Result<(Self, Pair)> {
        let key = new_key()?;
        let mut params = ca_params(federation);
        set_validity(&mut params, CA_DAYS)?;
        let cert = params
            .self_signed(&key)
            .context("cannot sign the CA certificate")?;
        let pair = Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        let issuer = Issuer::new(ca_params(federation), key);
        Ok((Self { issuer }, pair))
    }

    /// The CA of an earlier kit of `federation`: `cert_pem` (ca.pem) and its key (ca.key).
    /// Refuses a key that is not the certificate's, and a certificate of another federation.
    pub fn load(federation: &str, cert_pem: &str, key_pem: &str) -> anyhow::Result<Self> {
        let key = KeyPair::from_pem(key_pem).context("ca.key is not a PEM private key")?;
        if key.algorithm() != &PKCS_ECDSA_P256_SHA256 {
            bail!("ca.key is not the ECDSA P-256 key provision makes");
        }
        let der = pem_der(cert_pem).context("ca.pem is not a PEM certificate")?;
        let holds = |part: &[u8]| der.windows(part.len()).any(|w| w == part);
        if !holds(key.public_key_raw()) {
            bail!("ca.key is not the key of ca.pem: put the kit's own ca.key back");
        }
        if !holds(ca_name(federation).as_bytes()) {
            bail!("ca.pem is not the CA of federation {federation}");
        }
        let issuer = Issuer::new(ca_params(federation), key);
        Ok(Self { issuer })
    }

    /// A new key and a certificate for it with common name `cn`, valid `days`.
    pub fn issue(&self, cn: &str, role: Role, days: u32) -> anyhow::Result<Pair> {
        let key = new_key()?;
        let mut params = match role {
            Role::Server { host, ips } => {
                let mut names = vec![host.to_owned()];
                names.extend(ips.iter().map(|ip| ip.to_string()));
                names.dedup();
                let mut params = CertificateParams::new(names).with_context(|| {
                    format!("--broker-host {host} is not a host name or address for a certificate")
                })?;
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params
            }
            Role::Client => {
                let mut params = CertificateParams::default();
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                params
            }
        };
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, days)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("cannot sign the certificate of {cn}"))?;
        Ok(Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reloaded_ca_is_recognised_and_a_foreign_key_or_federation_refused() {
        let (_, pair) = Ca::create("plant-7").unwrap();
        assert!(pair.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pair.key.contains("PRIVATE KEY"));
        Ca::load("plant-7", &pair.cert, &pair.key).unwrap();
        let (_, other) = Ca::create("plant-7").unwrap();
        let err = Ca::load("plant-7", &pair.cert, &other.key).err().unwrap();
        assert!(err.to_string().contains("not the key of ca.pem"), "{err}");
        let err = Ca::load("plant-8", &pair.cert, &pair.key).err().unwrap();
        assert!(err.to_string().contains("federation plant-8"), "{err}");
    }

    #[test]
    fn dates_are_read_in_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_145_800); // 2025-11-26 08:30
        assert_eq!(ymd(t).unwrap(), (2025, 11, 26));
    }
}
