//! `fedge-coordinator check` against the broker of a provisioned kit (mosquitto with the kit's
//! fedge.conf: TLS, a certificate per client): the kit's coordinator configuration is ready;
//! one whose `ca_file` is a CA the broker's certificate does not chain to fails at the TLS
//! handshake, naming the file, and so does one whose client certificate the broker refuses.
//! A port that accepts TCP is not enough. A gated `[release]` whose evaluator has no key fails
//! too.

use std::path::Path;
use std::process::{Command, Output};

use crate::common;
use crate::provision::{provision, start_broker, text};

/// `fedge-coordinator check --config config` (with `--dry-run` when `dry`).
fn check(config: &Path, dry: bool) -> Output {
    let mut command = Command::new(common::coordinator_binary());
    command.args(["check", "--config"]).arg(config);
    if dry {
        command.arg("--dry-run");
    }
    command.env("RUST_BACKTRACE", "0").output().unwrap()
}

/// The kit's coordinator configuration with `from` replaced by `to`, written beside it.
fn variant(kit: &Path, name: &str, from: &str, to: &str) -> std::path::PathBuf {
    let original = std::fs::read_to_string(kit.join("coordinator/coordinator.toml")).unwrap();
    assert!(original.contains(from), "{from}: {original}");
    let path = kit.join("coordinator").join(name);
    std::fs::write(&path, original.replacen(from, to, 1)).unwrap();
    path
}

/// The report's line of check `name`.
fn line<'a>(report: &'a str, name: &str) -> &'a str {
    let prefix = |verdict: &str| format!("{verdict} {name:<9} ");
    (report.lines())
        .find(|l| l.starts_with(&prefix("ok  ")) || l.starts_with(&prefix("FAIL")))
        .unwrap_or_else(|| panic!("no {name} line in:\n{report}"))
}

#[test]
fn check_makes_the_tls_handshake_and_names_the_file_to_fix() {
    if common::mosquitto_binary().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = fedge_coordinator::io::broker::free_loopback_addr()
        .unwrap()
        .port()
        .to_string();
    let config = common::repo_root().join("configs/coordinator.toml");
    let config = config.display().to_string();
    let kit = dir.path().join("kit");
    let other = dir.path().join("other");
    let (kit_arg, other_arg) = (kit.display().to_string(), other.display().to_string());
    let broker_dir = kit.join("broker").display().to_string();
    for (out, devices) in [(&kit_arg, "cam-01"), (&other_arg, "cam-09")] {
        let made = provision(&[
            "--config",
            &config,
            "--out",
            out,
            "--broker-host",
            "localhost",
            "--broker-ip",
            "127.0.0.1",
            "--port",
            &port,
            "--broker-dir",
            &broker_dir,
            "--devices",
            devices,
        ]);
        assert!(made.status.success(), "{}", text(&made.stderr));
    }
    let port: u16 = port.parse().unwrap();
    let Some(_broker) = start_broker(dir.path(), &kit, port) else {
        return;
    };
    let ready = kit.join("coordinator/coordinator.toml");
    let out = check(&ready, false);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out.stderr));
    assert!(
        line(&report, "tls").contains("verifies against CA"),
        "{report}"
    );
    assert!(
        line(&report, "mqtt").contains("accepted the login"),
        "{report}"
    );
    assert!(report.contains(": ready"), "{report}");

    // The CA of another federation: the port takes TCP, the handshake fails, the file is named.
    let wrong_ca = other.join("ca/ca.pem").display().to_string();
    let config = variant(
        &kit,
        "wrong-ca.toml",
        "ca_file = \"ca.pem\"",
        &format!("ca_file = {wrong_ca:?}"),
    );
    let out = check(&config, false);
    let report = text(&out.stdout);
    assert!(!out.status.success(), "{report}");
    assert!(line(&report, "broker").starts_with("ok"), "{report}");
    let tls = line(&report, "tls");
    assert!(
        tls.starts_with("FAIL")
            && tls.contains(&format!("[broker.tls] ca_file {wrong_ca}"))
            && tls.contains("set ca_file to the CA that signed the broker's certificate"),
        "{report}"
    );
    assert!(!report.contains("ready"), "{report}");
    // With --dry-run the broker is not asked.
    assert!(check(&config, true).status.success());

    // The right CA, another federation's client certificate: the broker refuses it.
    let (cert, key) = (
        other.join("coordinator/coordinator.pem"),
        other.join("coordinator/coordinator.key"),
    );
    let config = variant(
        &kit,
        "wrong-cert.toml",
        "client_cert = \"coordinator.pem\"\nclient_key = \"coordinator.key\"",
        &format!("client_cert = {cert:?}\nclient_key = {key:?}"),
    );
    let out = check(&config, false);
    let report = text(&out.stdout);
    assert!(!out.status.success(), "{report}");
    let mqtt = line(&report, "mqtt");
    assert!(
        mqtt.starts_with("FAIL")
            && mqtt.contains("refused the client certificate")
            && mqtt.contains(&cert.display().to_string()),
        "{report}"
    );

    // A gated release whose evaluator is not among the kit's devices.
    let config = variant(
        &kit,
        "gated.toml",
        "[head]",
        "[release]\nmode = \"gated\"\nevaluators = [\"judge\"]\n\n[head]",
    );
    let out = check(&config, true);
    let report = text(&out.stdout);
    assert!(!out.status.success(), "{report}");
    let release = line(&report, "release");
    assert!(
        release.starts_with("FAIL") && release.contains("[\"judge\"]"),
        "{report}"
    );
}
