//! `fedge-edge check` at the broker: beside a running agent under the documented mosquitto
//! set-up (client ids are the certificates' names) it proves the TLS files by a handshake and
//! leaves the agent's session alone; and it compares this device's backbone file with the one
//! the federation names, in a task sealed for other devices or on `backbone/current`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fedge_edge::check::run_checks;
use fedge_wire::{BackboneRef, DeviceKey, Message, Topics};

use super::retain;
use crate::broker_hardening::mosquitto::Broker;
use crate::common::{self, KillOnDrop};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until `log` holds `needle`; fails the test after `within`.
fn wait_for(log: &Path, needle: &str, within: Duration, agent: &mut KillOnDrop, agent_log: &Path) {
    let start = Instant::now();
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(needle)
    {
        let died = agent.try_wait().unwrap();
        assert!(
            died.is_none() && start.elapsed() < within,
            "no {needle:?} in the broker's log (agent {died:?}):\n{}",
            std::fs::read_to_string(agent_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_check_beside_a_running_agent_proves_its_tls_files_and_leaves_its_session_alone() {
    if !crate::tls::has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    crate::tls::make_certificates(d);
    crate::tls::client_certificate(d, "site-rot15");
    let Some(broker) = Broker::documented(d) else {
        return;
    };
    let port = broker.port();
    common::write_private(&d.join("device.key"), "ab".repeat(32));
    let metrics = fedge_coordinator::io::broker::free_loopback_addr().unwrap();
    // The shipped ACL is for the federation site-1.
    let profile = common::profile_copy("generic-x86_64.toml", d, |t| {
        let t = t
            .replace("federation = \"demo\"", "federation = \"site-1\"")
            .replace("port = 1883", &format!("port = {port}"))
            .replace("enabled = true", "enabled = false")
            .replace(
                "# [broker.tls]\n# ca_file = \"certs/ca.pem\"\n# client_cert = \
                 \"certs/site-rot15.pem\"\n# client_key = \"certs/site-rot15.key\"",
                "[broker.tls]\nca_file = \"ca.pem\"\nclient_cert = \"site-rot15.pem\"\n\
                 client_key = \"site-rot15.key\"",
            );
        assert!(t.contains("[broker.tls]\n"), "{t}");
        format!("key_file = \"device.key\"\nmetrics_listen = \"{metrics}\"\n{t}")
    });
    let edge = crate::use_model::edge_binary();
    let agent_log = d.join("agent.log");
    let mut agent = KillOnDrop(
        Command::new(&edge)
            .args(["run", "--config"])
            .arg(&profile)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = d.join("mosquitto.log");
    let connected = " as site-rot15 ";
    wait_for(
        &log,
        connected,
        Duration::from_secs(120),
        &mut agent,
        &agent_log,
    );

    let out = Command::new(&edge)
        .args(["check", "--config"])
        .arg(&profile)
        .output()
        .unwrap();
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    for line in [
        "ok   handshake TLS with 127.0.0.1",
        "and the broker accepted this device's certificate",
        "ok   login     not tried: the agent is running (it holds the session: its key_file",
        "ok   metrics   http://",
        "the running agent serves it",
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    // The agent kept its one connection.
    std::thread::sleep(Duration::from_secs(1));
    let broker_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !broker_log.contains("already connected"),
        "the check took the agent's session over:\n{broker_log}"
    );
    assert_eq!(broker_log.matches(connected).count(), 1, "{broker_log}");
    assert!(agent.try_wait().unwrap().is_none(), "the agent stopped");

    // Without the agent, the check logs in with the device's certificate.
    let _ = agent.kill();
    let _ = agent.wait();
    let out = Command::new(&edge)
        .args(["check", "--config"])
        .arg(&profile)
        .output()
        .unwrap();
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("ok   login     the broker accepted the MQTT login"),
        "{said}"
    );
    assert!(said.contains("(free now)"), "{said}");
}

#[test]
fn check_fails_a_backbone_file_whose_digest_is_not_the_federation_s() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = DeviceKey::from_bytes([7; 32]);
    common::write_private(&d.join("device.key"), key.to_hex());
    // The same graph with a doc_string appended (ModelProto field 6): it loads and runs, and
    // its SHA-256 is another.
    let assets = common::repo_root().join("models/assets");
    let original = std::fs::read(assets.join("digits-conv.onnx")).unwrap();
    let doc = b"copied on site";
    let mut changed = original.clone();
    changed.extend([0x32, doc.len() as u8]);
    changed.extend(doc);
    let models = d.join("models");
    std::fs::create_dir(&models).unwrap();
    let copy = models.join("digits-conv.onnx");
    std::fs::write(&copy, &changed).unwrap();
    std::fs::copy(
        assets.join("digits-conv.toml"),
        models.join("digits-conv.toml"),
    )
    .unwrap();
    let federation = BackboneRef::of("digits-conv", &original);
    let found = BackboneRef::of("digits-conv", &changed);
    let profile = |backbone: &Path| {
        common::profile_copy("generic-x86_64.toml", d, |t| {
            let line = t.lines().find(|l| l.starts_with("backbone = ")).unwrap();
            let t = t
                .replace(line, &format!("backbone = {backbone:?}"))
                .replace("port = 1883", &format!("port = {port}"));
            format!("key_file = \"device.key\"\n{t}")
        })
    };
    let copied = profile(&models.join("digits-conv.toml"));
    let checked = |path: &Path| {
        let checks = run_checks(path, false);
        assert!(
            checks.iter().all(|c| c.ok || c.name == "federation"),
            "{checks:?}"
        );
        checks.into_iter().find(|c| c.name == "federation").unwrap()
    };
    // The round task, sealed for the one device selected this round, not this one.
    let topics = Topics::new("demo").unwrap();
    let params = fedge_models::HeadConfig::new(512, 10)
        .with_hidden(4)
        .init_flat(1);
    let task = fedge_wire::RoundTask {
        pooled: None,
        federation: "demo".into(),
        run: 1,
        round: 3,
        selected: vec!["site-other".into()],
        classes: (0..10).map(|k| k.to_string()).collect(),
        params: fedge_wire::TensorF32::from_slice(&params),
        train: Default::default(),
        deadline_ms: 60_000,
        insight: None,
        prototypes: None,
        backbone: Some(federation.clone()),
    };
    let other = DeviceKey::from_bytes([8; 32]);
    let frame = fedge_wire::encode(&Message::RoundTask(task));
    let sealed = fedge_wire::seal(frame, &[("site-other", &other)]);
    retain(port, &topics.round_task(), sealed);
    let said = checked(&copied);
    assert!(!said.ok, "{said:?}");
    for part in [
        "the federation's round task (round 3",
        &format!("sha256 {}", federation.sha256_hex()),
        &format!(
            "{} (\"digits-conv\") has sha256 {}",
            copy.display(),
            found.sha256_hex()
        ),
        "the device would refuse every round",
    ] {
        assert!(said.detail.contains(part), "{part:?} not in {said:?}");
    }
    // No task: the backbone the federation distributes, sealed for this device.
    retain(port, &topics.round_task(), Vec::new());
    let pointer = fedge_wire::seal(federation.to_pointer(), &[("site-rot15", &key)]);
    retain(port, &topics.backbone_current(), pointer);
    let said = checked(&copied);
    assert!(!said.ok, "{said:?}");
    assert!(said.detail.contains("backbone/current"), "{said:?}");
    assert!(said.detail.contains(&found.sha256_hex()), "{said:?}");
    // The federation's own file passes.
    let shipped = profile(&assets.join("digits-conv.toml"));
    let said = checked(&shipped);
    let short = format!(
        "backbone sha256 {}… as backbone/current",
        federation.short()
    );
    assert!(said.ok && said.detail.contains(&short), "{said:?}");
}
