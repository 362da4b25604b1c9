//! TLS to mosquitto with certificates the test makes (openssl): a federation runs over it, and
//! a client that does not trust the broker's CA fails with an error that says so. The
//! certificate helpers serve `broker_hardening` too.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fedge::demo::DemoOptions;
use fedge_mqtt::{BrokerConfig, TlsSettings};

use crate::common;

/// True when openssl runs; otherwise the caller skips, unless `FEDGE_REQUIRE_MOSQUITTO=1`.
pub(crate) fn has_openssl() -> bool {
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_MOSQUITTO").map_or(true, |v| v != "1"),
        "openssl is needed to make the test certificates (apt-get install openssl)"
    );
    eprintln!("openssl not installed: skipping");
    false
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a broker certificate for 127.0.0.1 signed by it, and an unrelated second CA.
pub(crate) fn make_certificates(dir: &Path) {
    let subj = |cn: &str| format!("/CN={cn}");
    for ca in ["ca", "other-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-subj",
                &subj(&format!("fedge test {ca}")),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            &subj("127.0.0.1"),
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ],
    );
    open_to_mosquitto(dir);
}

/// `<cn>.pem` and `<cn>.key`: a client certificate (P-256) with common name `cn`, signed by
/// the CA of [`make_certificates`].
pub(crate) fn client_certificate(dir: &Path, cn: &str) {
    let (key, csr, pem) = (
        format!("{cn}.key"),
        format!("{cn}.csr"),
        format!("{cn}.pem"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            "client.ext",
        ],
    );
    open_to_mosquitto(dir);
}

/// mosquitto started as root drops to its own user, which must read these test-only files;
/// the clients' keys stay private to their owner, as fedge requires of a secret.
fn open_to_mosquitto(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    open(dir, 0o755).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let client_key = name.ends_with(".key") && name != "server.key";
        if path.is_file() {
            open(&path, if client_key { 0o600 } else { 0o644 }).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federation_runs_over_tls_and_a_client_without_the_ca_is_refused() {
    if !has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let d = dir.path().display();
    let Some(mosquitto) = common::Mosquitto::start_with(&format!(
        "cafile {d}/ca.pem\ncertfile {d}/server.pem\nkeyfile {d}/server.key"
    )) else {
        return;
    };
    let broker = BrokerConfig {
        tls: Some(TlsSettings::with_ca(dir.path().join("ca.pem")).unwrap()),
        ..mosquitto.broker()
    };

    // A client trusting another CA: the handshake fails and the error names the certificate.
    let wrong = BrokerConfig {
        tls: Some(TlsSettings::with_ca(dir.path().join("other-ca.pem")).unwrap()),
        ..mosquitto.broker()
    };
    let (_client, mut events) = rumqttc::AsyncClient::new(wrong.options("untrusting", None), 8);
    let err = tokio::time::timeout(Duration::from_secs(10), events.poll())
        .await
        .expect("the handshake neither failed nor succeeded")
        .expect_err("a broker signed by an unknown CA was accepted");
    let text = format!("{err}");
    eprintln!("a client trusting another CA sees: {text}");
    assert!(
        text.to_lowercase().contains("certificate") || text.contains("UnknownIssuer"),
        "unclear TLS error: {text}"
    );
    // Plain TCP to the TLS listener fails too.
    let (_client, mut events) =
        rumqttc::AsyncClient::new(mosquitto.broker().options("plain", None), 8);
    let plain = tokio::time::timeout(Duration::from_secs(10), events.poll()).await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "plain MQTT accepted on the TLS port"
    );

    // Edges and coordinator all over TLS.
    let options = DemoOptions {
        rounds: 2,
        ..common::demo_options(Some(broker), "tls")
    };
    let result = common::run_demo(&options).await;
    assert_eq!(result.rounds.len(), 2);
    assert!(result.rounds.iter().all(|r| r.clients == 3));
    assert!(result.final_target_accuracy.unwrap() > result.initial_target_accuracy);
}
