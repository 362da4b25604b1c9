//! `fedge-coordinator provision` end to end: the kit it writes runs as it is. mosquitto starts
//! with the kit's fedge.conf and fedge.acl (only bound to loopback; started as root, it runs as
//! the kit's owner, whom fedge.conf names, and reads the kit's private folders), real clients
//! (`mosquitto_pub`, `mosquitto_sub`) with the kit's certificates find the ACL in force, the
//! coordinator connects with its folder's configuration, a device's profile passes
//! `fedge-edge check`, and a second run for a grown fleet keeps the CA and the keys it made.
//! Provision needs no repository: run from any folder, it makes the devices' profiles from the
//! built-in ones.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fedge_coordinator::store::keys;
use fedge_wire::DeviceKey;

use crate::common::{self, KillOnDrop};

const FEDERATION: &str = "kit-plant";

/// Runs `fedge-coordinator provision` with `args` (stdout and stderr captured).
pub(crate) fn provision(args: &[&str]) -> Output {
    Command::new(common::coordinator_binary())
        .arg("provision")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every private key, keys file and device key is 0600, every folder holding one 0700.
fn assert_private(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            assert_private(&path, found);
        } else if name.ends_with(".key") || name == "devices.toml" {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
            assert_eq!(mode(dir), 0o700, "{}", dir.display());
            found.push(path);
        }
    }
}

/// The device keys of the kit's keys file, checked against each device's device.key.
fn device_keys(kit: &Path) -> std::collections::BTreeMap<String, DeviceKey> {
    let keys = keys::load(&kit.join("coordinator/devices.toml")).unwrap();
    for (id, key) in &keys {
        let file = kit.join(format!("devices/{id}/device.key"));
        let held = DeviceKey::from_hex(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(
            &held, key,
            "{id}: device.key is not the key in devices.toml"
        );
    }
    keys
}

/// A mosquitto client (`mosquitto_pub` or `mosquitto_sub`) logged in with the certificate
/// `folder/stem.pem` of the kit.
fn client(tool: &str, kit: &Path, port: u16, folder: &str, stem: &str) -> Command {
    let dir = kit.join(folder);
    let mut command = Command::new(tool);
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--cafile"])
        .arg(dir.join("ca.pem"))
        .arg("--cert")
        .arg(dir.join(format!("{stem}.pem")))
        .arg("--key")
        .arg(dir.join(format!("{stem}.key")))
        .stdin(Stdio::null());
    command
}

/// Publishes `message` retained at QoS 1 as `folder/stem`; it must be accepted by the broker
/// (a publish the ACL denies is dropped silently, which the readers below see).
fn publish(kit: &Path, port: u16, who: (&str, &str), topic: &str, message: &str) {
    let mut command = client("mosquitto_pub", kit, port, who.0, who.1);
    command.args(["-q", "1", "-r", "-t", topic]);
    match message {
        "" => command.arg("-n"),
        m => command.args(["-m", m]),
    };
    common::succeeded(&mut command);
}

/// The first message `folder/stem` reads on `topic` within `wait` seconds, if any.
fn read(kit: &Path, port: u16, who: (&str, &str), topic: &str, wait: u32) -> Option<String> {
    let out = client("mosquitto_sub", kit, port, who.0, who.1)
        .args(["-C", "1", "-W", &wait.to_string(), "-t", topic])
        .output()
        .unwrap();
    let said = text(&out.stdout).trim().to_owned();
    match out.status.success() {
        true => Some(said),
        // 27: timed out with nothing received.
        false if out.status.code() == Some(27) && said.is_empty() => None,
        false => panic!("mosquitto_sub on {topic}: {}", text(&out.stderr)),
    }
}

/// The user name of this process's user, if it has one.
fn user_name() -> Option<String> {
    let out = Command::new("id").arg("-un").output().ok()?;
    out.status
        .success()
        .then(|| text(&out.stdout).trim().to_owned())
}

/// mosquitto with the kit's fedge.conf as provision wrote it (its files where they are, in the
/// kit's private folders), its listener bound to loopback; `dir` holds its log.
pub(crate) fn start_broker(dir: &Path, kit: &Path, port: u16) -> Option<KillOnDrop> {
    let binary = common::mosquitto_binary()?;
    let conf = std::fs::read_to_string(kit.join("broker/fedge.conf")).unwrap();
    let listener = format!("\nlistener {port}\n");
    assert!(conf.contains(&listener), "{conf}");
    let conf = conf.replace(&listener, &format!("\nlistener {port} 127.0.0.1\n"));
    let path = dir.join("mosquitto.conf");
    std::fs::write(&path, conf).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log = std::fs::File::create(dir.join("mosquitto.log")).unwrap();
    let child = KillOnDrop(
        Command::new(binary)
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "mosquitto did not start with the kit's fedge.conf:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child)
}

#[test]
fn a_provisioned_kit_runs_a_federation_over_mosquitto_and_grows_with_the_fleet() {
    if common::mosquitto_binary().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kit = dir.path().join("kit");
    let port = fedge_coordinator::io::broker::free_loopback_addr()
        .unwrap()
        .port();
    // The shipped configuration, for this test's federation.
    let shipped = std::fs::read_to_string(common::repo_root().join("configs/coordinator.toml"));
    let config = dir.path().join("coordinator.toml");
    let ours = shipped.unwrap().replacen(
        "federation = \"demo\"",
        &format!("federation = \"{FEDERATION}\""),
        1,
    );
    std::fs::write(&config, ours).unwrap();
    let profile = common::firmware_configs().join("generic-x86_64.toml");
    let (kit_arg, port_arg) = (kit.display().to_string(), port.to_string());
    let broker_dir = kit.join("broker").display().to_string();
    let config_arg = config.display().to_string();
    let profile_arg = profile.display().to_string();
    let run = |devices: &str| {
        provision(&[
            "--config",
            &config_arg,
            "--out",
            &kit_arg,
            "--broker-host",
            "localhost",
            "--broker-ip",
            "127.0.0.1",
            "--devices",
            devices,
            "--profile",
            &profile_arg,
            "--port",
            &port_arg,
            "--broker-dir",
            &broker_dir,
        ])
    };

    let first = run("cam-01,cam-02");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let said = text(&first.stdout);
    assert!(said.contains("ca.key offline"), "{said}");
    assert!(said.contains("added  devices/cam-01/"), "{said}");
    for file in [
        "ca/ca.pem",
        "broker/broker.pem",
        "broker/fedge.acl",
        "broker/README.txt",
        "coordinator/coordinator.pem",
        "coordinator/operator.key",
        "operator/fedge-operator.pem",
        "publisher/fedge-publisher.pem",
        "dashboard/fedge-dashboard.pem",
        "devices/cam-01/fedge-edge.service",
        "devices/cam-02/backbone/digits-conv.onnx",
    ] {
        assert!(kit.join(file).is_file(), "{file} missing: {said}");
    }
    let mut secrets = Vec::new();
    assert_private(&kit, &mut secrets);
    // CA, broker, coordinator (certificate, operator key, keys file), three more clients,
    // two devices (certificate key and device key).
    assert_eq!(secrets.len(), 12, "{secrets:?}");
    let keys = device_keys(&kit);
    assert_eq!(keys.keys().collect::<Vec<_>>(), ["cam-01", "cam-02"]);
    let acl = std::fs::read_to_string(kit.join("broker/fedge.acl")).unwrap();
    assert!(acl.contains(&format!("user fedge-coordinator-{FEDERATION}\n")));

    // The broker folder is used where it is: fedge.conf names the kit's owner, whom a root
    // mosquitto runs as (its own user could not enter the 0700 folders), and the keys stay
    // private (above).
    let conf = std::fs::read_to_string(kit.join("broker/fedge.conf")).unwrap();
    let users: Vec<&str> = conf.lines().filter(|l| l.starts_with("user ")).collect();
    if let Some(me) = user_name() {
        assert_eq!(users, [format!("user {me}")], "{conf}");
    }
    let readme = std::fs::read_to_string(kit.join("broker/README.txt")).unwrap();
    assert!(
        readme.contains(&format!("mosquitto -c {broker_dir}/fedge.conf")),
        "{readme}"
    );
    let Some(_broker) = start_broker(dir.path(), &kit, port) else {
        return;
    };
    let (cam1, cam2) = (("devices/cam-01", "cam-01"), ("devices/cam-02", "cam-02"));
    let dashboard = ("dashboard", "fedge-dashboard");
    let coordinator = ("coordinator", "coordinator");
    let topic = |rest: &str| format!("fedge/{FEDERATION}/{rest}");

    // A device publishes its own status: a dashboard reads it.
    let status = topic("edge/cam-01/status");
    publish(&kit, port, cam1, &status, "probe-1");
    assert_eq!(
        read(&kit, port, dashboard, &status, 10).as_deref(),
        Some("probe-1")
    );
    publish(&kit, port, cam1, &status, "");
    // It cannot write another device's status...
    let other_status = topic("edge/cam-02/status");
    publish(&kit, port, cam1, &other_status, "forged");
    assert_eq!(read(&kit, port, dashboard, &other_status, 2), None);
    // ...nor read another device's update, which the coordinator does read.
    let update = topic("edge/cam-02/update");
    publish(&kit, port, cam2, &update, "update-2");
    assert_eq!(read(&kit, port, cam1, &update, 2), None);
    assert_eq!(
        read(&kit, port, coordinator, &update, 10).as_deref(),
        Some("update-2")
    );
    publish(&kit, port, cam2, &update, "");

    // The coordinator runs with its folder's configuration: its retained status appears.
    let log = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
    let _coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(kit.join("coordinator/coordinator.toml"))
            .stdout(log("coordinator.out"))
            .stderr(log("coordinator.err"))
            .spawn()
            .unwrap(),
    );
    let coordinator_status = read(&kit, port, dashboard, &topic("coordinator/status"), 30);
    let coordinator_log = || std::fs::read_to_string(dir.path().join("coordinator.out"));
    let Some(coordinator_status) = coordinator_status else {
        panic!("no coordinator status within 30 s: {:?}", coordinator_log());
    };
    let parsed: serde_json::Value = serde_json::from_str(&coordinator_status).unwrap();
    assert_eq!(parsed["federation"], FEDERATION, "{coordinator_status}");

    // A device's profile passes the device's own checks, from the kit folder as it is.
    let check = common::succeeded(
        Command::new(crate::use_model::edge_binary())
            .args(["check", "--dry-run", "--config"])
            .arg(kit.join("devices/cam-01/profile.toml")),
    );
    assert!(
        text(&check.stdout).contains("ready"),
        "{}",
        text(&check.stdout)
    );

    // The fleet grows: the CA, the broker's and the first devices' files and keys stay, the
    // third device is added, and its certificate is one the running broker accepts.
    let ca = std::fs::read(kit.join("ca/ca.pem")).unwrap();
    let cam1_cert = std::fs::read(kit.join("devices/cam-01/cam-01.pem")).unwrap();
    let again = run("cam-01,cam-02,cam-03");
    assert!(again.status.success(), "{}", text(&again.stderr));
    let said = text(&again.stdout);
    assert!(said.contains("added  devices/cam-03/"), "{said}");
    assert!(
        said.contains("added  1 device key(s) to coordinator/devices.toml"),
        "{said}"
    );
    assert!(
        said.contains("kept   devices/cam-01/, devices/cam-02/"),
        "{said}"
    );
    assert!(
        !said.contains("added  ca/") && !said.contains("added  broker/"),
        "{said}"
    );
    assert_eq!(std::fs::read(kit.join("ca/ca.pem")).unwrap(), ca);
    let cam1_again = std::fs::read(kit.join("devices/cam-01/cam-01.pem")).unwrap();
    assert_eq!(cam1_again, cam1_cert);
    let grown = device_keys(&kit);
    assert_eq!(grown.len(), 3);
    assert_eq!(grown["cam-01"], keys["cam-01"]);
    assert_eq!(grown["cam-02"], keys["cam-02"]);
    let cam3_status = topic("edge/cam-03/status");
    publish(
        &kit,
        port,
        ("devices/cam-03", "cam-03"),
        &cam3_status,
        "probe-3",
    );
    assert_eq!(
        read(&kit, port, dashboard, &cam3_status, 10).as_deref(),
        Some("probe-3")
    );
    publish(&kit, port, ("devices/cam-03", "cam-03"), &cam3_status, "");

    // With ca.key kept offline, the kit is re-run as it is, but no device is added until the
    // key is back; a device revoked in the kit's keys file is not given a key again.
    let offline = dir.path().join("ca.key.offline");
    std::fs::rename(kit.join("ca/ca.key"), &offline).unwrap();
    let out = run("cam-01,cam-02,cam-03");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run("cam-01,cam-02,cam-03,cam-04");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("ca/ca.key is not in the kit"),
        "{}",
        text(&out.stderr)
    );
    assert!(!kit.join("devices/cam-04").exists());
    assert_eq!(
        device_keys(&kit).len(),
        3,
        "no key for a device without a certificate"
    );
    std::fs::rename(&offline, kit.join("ca/ca.key")).unwrap();
    common::succeeded(
        Command::new(common::coordinator_binary())
            .args(["revoke", "--client", "cam-02", "--keys"])
            .arg(kit.join("coordinator/devices.toml")),
    );
    let out = run("cam-01,cam-02,cam-03");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cam-02: left out"),
        "{}",
        text(&out.stdout)
    );
    assert!(!device_keys(&kit).contains_key("cam-02"));

    // What provision refuses, saying what to fix.
    let other = dir.path().join("other.toml");
    let text_of = std::fs::read_to_string(&config).unwrap();
    let other_federation = text_of.replace(FEDERATION, "kit-other");
    std::fs::write(&other, other_federation).unwrap();
    let refused = |args: &[&str], says: &str| {
        let out = provision(args);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    };
    let other_arg = other.display().to_string();
    let host = ["--broker-host", "localhost"];
    let base = ["--config", &config_arg, "--out", &kit_arg];
    refused(
        &[&["--config", &other_arg, "--out", &kit_arg][..], &host[..]].concat(),
        &format!("holds the kit of federation \"{FEDERATION}\""),
    );
    refused(
        &[&base[..], &host[..], &["--devices", "cam 04"][..]].concat(),
        "must be 1-64 characters of A-Z a-z 0-9 _ . -",
    );
    refused(&base, "--broker-host");
}

/// Provision needs nothing of the repository: from a folder with nothing in it, the devices'
/// profiles are made from the built-in ones (the default, or one by name), with the backbone
/// they name, and pass `fedge-edge check`; a profile file is read only when one is given.
#[test]
fn provision_runs_from_any_folder_with_the_built_in_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let config = dir.path().join("coordinator.toml");
    std::fs::copy(
        common::repo_root().join("configs/coordinator.toml"),
        &config,
    )
    .unwrap();
    let run = |kit: &str, extra: &[&str]| {
        Command::new(common::coordinator_binary())
            .current_dir(&elsewhere)
            .args(["provision", "--config"])
            .arg(&config)
            .args([
                "--out",
                kit,
                "--broker-host",
                "localhost",
                "--devices",
                "cam-01",
            ])
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    };
    // The default profile: the shipped generic-x86_64.toml, its backbone brought along.
    let out = run("kit", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let device = elsewhere.join("kit/devices/cam-01");
    let profile = std::fs::read_to_string(device.join("profile.toml")).unwrap();
    assert!(
        profile.contains("from the built-in profile firmware-configs/generic-x86_64.toml"),
        "{profile}"
    );
    assert!(
        profile.contains("profile = \"generic-x86_64\""),
        "{profile}"
    );
    assert!(
        profile.contains("backbone = \"backbone/digits-conv.toml\""),
        "{profile}"
    );
    let assets = common::repo_root().join("models/assets");
    for file in ["digits-conv.onnx", "digits-conv.toml"] {
        assert_eq!(
            std::fs::read(device.join("backbone").join(file)).unwrap(),
            std::fs::read(assets.join(file)).unwrap(),
            "{file}"
        );
    }
    let check = common::succeeded(
        Command::new(crate::use_model::edge_binary())
            .args(["check", "--dry-run", "--config"])
            .arg(device.join("profile.toml")),
    );
    assert!(
        text(&check.stdout).contains("ready"),
        "{}",
        text(&check.stdout)
    );
    // Another built-in profile by name.
    let out = run("kit-arm", &["--profile", "arm64-gateway"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let profile = std::fs::read_to_string(elsewhere.join("kit-arm/devices/cam-01/profile.toml"));
    assert!(profile.unwrap().contains("profile = \"arm64-gateway\""));
    // A file is a file: the repository's path means nothing here, and the error says so.
    let out = run(
        "kit-file",
        &["--profile", "firmware-configs/arm64-gateway.toml"],
    );
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains("--profile firmware-configs/arm64-gateway.toml")
            && said.contains("generic-x86_64, arm64-gateway"),
        "{said}"
    );
}
