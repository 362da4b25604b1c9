//! A backbone over the air: `fedge-coordinator publish-backbone` puts the committed
//! digits-conv card and ONNX file on mosquitto (retained, chunked under the packet limit), a
//! `fedge-edge` whose profile says `backbone = "federation"` fetches it, checks its digest,
//! keeps it in its cache and trains the rounds of a coordinator whose tasks name it. A device
//! whose cache holds a file with another digest fetches it again.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{self, KillOnDrop};
use crate::use_model::edge_binary;

fn write_coordinator(dir: &Path, port: u16, sha256: &str) -> std::path::PathBuf {
    let config = format!(
        "federation = \"ota\"\nrounds = 2\nmin_clients = 1\nmin_updates = 1\n\
         round_timeout_s = 60\nstate_dir = \"state\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\nmax_packet = 8192\n\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [model]\nbackbone = \"digits-conv\"\nbackbone_sha256 = \"{sha256}\"\n\n\
         [auth]\nkeys_file = \"devices.toml\"\n"
    );
    // The device's key: a profile that takes the federation's backbone must have one.
    let (keys, device) = (dir.join("devices.toml"), dir.join("device.key"));
    fedge_coordinator::store::keys::keygen(&keys, "site-rot15", &device).unwrap();
    let path = dir.join("coordinator.toml");
    std::fs::write(&path, config).unwrap();
    path
}

fn run(binary: &Path, args: &[&str]) -> std::process::Output {
    Command::new(binary).args(args).output().unwrap()
}

/// Runs the coordinator and one device until the coordinator's two rounds are done.
fn federate(coordinator: &Path, profile: &Path) {
    let mut coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(coordinator)
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    let _device = KillOnDrop(
        Command::new(edge_binary())
            .args(["run", "--config"])
            .arg(profile)
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = coordinator.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < end,
            "the federation did not finish in time"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn a_device_takes_the_federation_s_backbone_over_mqtt() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let onnx = std::fs::read(common::repo_root().join("models/assets/digits-conv.onnx")).unwrap();
    let reference = fedge_wire::BackboneRef::of("digits-conv", &onnx);
    let hex = reference.sha256_hex();
    let coordinator = write_coordinator(dir.path(), mosquitto.port(), &hex);
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let card = card.to_str().unwrap();
    let config = coordinator.to_str().unwrap();
    let out = run(
        &common::coordinator_binary(),
        &["publish-backbone", "--config", config, "--card", card],
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&format!("sha256 {hex}")), "{said}");
    // Larger than the 8 KiB packets: chunked.
    assert!(
        said.contains("retained message(s)") && !said.contains(" in 1 retained"),
        "{said}"
    );

    let port = mosquitto.port();
    let cache = dir.path().join("cache");
    let profile = common::profile_copy("generic-x86_64.toml", dir.path(), |text| {
        let text = text
            .replace("port = 1883", &format!("port = {port}"))
            .replace("federation = \"demo\"", "federation = \"ota\"")
            .replace("hidden = 64", "hidden = 16")
            .replace("enabled = true", "enabled = false");
        let text: String = text
            .lines()
            .map(|l| match l.starts_with("backbone = ") {
                true => "backbone = \"federation\"\n".to_owned(),
                false => format!("{l}\n"),
            })
            .collect();
        format!("cache_dir = {cache:?}\nkey_file = \"device.key\"\n{text}")
    });
    // `check` knows where the backbone will come from.
    let profile_arg = profile.to_str().unwrap();
    let out = run(
        &edge_binary(),
        &["check", "--dry-run", "--config", profile_arg],
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("the federation's"), "{said}");

    // Junk retained beside the genuine pieces (anyone may publish there) delays nothing.
    let junk_topic = format!("fedge/ota/backbone/{hex}/junk");
    let port_arg = port.to_string();
    let junk = [
        "-h",
        "127.0.0.1",
        "-p",
        &port_arg,
        "-r",
        "-t",
        &junk_topic,
        "-m",
        "junk",
    ];
    assert!(
        Command::new("mosquitto_pub")
            .args(junk)
            .status()
            .unwrap()
            .success()
    );
    federate(&coordinator, &profile);
    let kept = cache.join("backbones").join(format!("{hex}.onnx"));
    assert_eq!(
        std::fs::read(&kept).unwrap(),
        onnx,
        "the cached file is the published one"
    );
    assert!(dir.path().join("state/model.bin").exists());

    // A cached file that no longer has the digest is fetched again.
    std::fs::write(&kept, b"not a model").unwrap();
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    federate(&coordinator, &profile);
    assert_eq!(std::fs::read(&kept).unwrap(), onnx);
}

#[test]
fn publishing_a_backbone_tells_a_running_coordinator_without_a_restart() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("coordinator.toml");
    let text = format!(
        "federation = \"ota-live\"\nrounds = 100\nmin_clients = 1\nmin_updates = 1\n\
         round_timeout_s = 60\n\n[broker]\nhost = \"127.0.0.1\"\nport = {}\n\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n[auth]\noperator_key_file = \"operator.key\"\n",
        mosquitto.port()
    );
    std::fs::write(&config, text).unwrap();
    let config = config.to_str().unwrap();
    let out = run(
        &common::coordinator_binary(),
        &["ctl", "--config", config, "keygen"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config", config])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let card = card.to_str().unwrap();
    let out = run(
        &common::coordinator_binary(),
        &["publish-backbone", "--config", config, "--card", card],
    );
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // `ctl` confirmed it from the coordinator's status (`backbone_sha256`).
    assert!(said.contains("the running coordinator names it"), "{said}");

    // A card of another width cannot take over this head.
    let wide = dir.path().join("wide.toml");
    let text = std::fs::read_to_string(card)
        .unwrap()
        .replace("feature_size = 512", "feature_size = 1280");
    let onnx = common::repo_root().join("models/assets/digits-conv.onnx");
    std::fs::write(
        &wide,
        text.replace("digits-conv.onnx", onnx.to_str().unwrap()),
    )
    .unwrap();
    let out = run(
        &common::coordinator_binary(),
        &[
            "publish-backbone",
            "--config",
            config,
            "--card",
            wide.to_str().unwrap(),
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("feature_size = 1280"),
        "{said}"
    );
}
