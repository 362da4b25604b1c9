//! Enrolment during a running federation: `fedge-coordinator enroll` issues a one-time token,
//! `fedge-edge enroll` (the binary, over mosquitto) obtains the device's key from the running
//! coordinator, the device takes part in the next rounds without a restart, and the same
//! token is refused the second time.

use std::process::Command;
use std::time::Duration;

use fedge::bench::fleet::{FleetOptions, device_ids, run_fleet};
use fedge_coordinator::store::keys;

use crate::common;
use crate::use_model::edge_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_enrols_into_a_running_federation_once_per_token() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("devices.toml");
    let first_two: fedge_coordinator::DeviceKeys = device_ids(2)
        .into_iter()
        .map(|id| (id, keys::generate()))
        .collect();
    keys::store(&keys_file, &first_two).unwrap();
    let config = fedge_coordinator::RoundConfig {
        rounds: 1_000,
        min_clients: 2,
        min_updates: 2,
        round_timeout_ms: 3_000,
        auth: Some(std::sync::Arc::new(first_two.clone())),
        ..fedge_coordinator::RoundConfig::default()
    };
    let rounds =
        fedge_coordinator::Rounds::new(config, Box::new(fedge_coordinator::FedAvg), vec![0.0; 100]);
    let options = fedge_coordinator::DriverOptions {
        keys_file: Some(keys_file.clone()),
        ..common::driver_options(mosquitto.broker(), "enrol")
    };
    let mut coordinator = common::Driver::spawn(rounds, options);
    let fleet = |devices: usize, keys: fedge_coordinator::DeviceKeys| FleetOptions {
        broker: mosquitto.broker(),
        federation: "enrol".into(),
        devices,
        rounds: 1_000,
        timeout: Duration::from_secs(60),
        keys: keys.into_iter().collect(),
    };
    let two = fleet(2, first_two);
    let running = tokio::spawn(async move { run_fleet(&two).await });
    coordinator.round_ended(Duration::from_secs(30)).await;

    // The operator issues a token; the device spends it with the binary it runs.
    let out = Command::new(common::coordinator_binary())
        .args([
            "enroll",
            "--client",
            "fleet-00002",
            "--valid",
            "10m",
            "--keys",
        ])
        .arg(&keys_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("fedge-edge enroll"), "{stderr}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(token.len(), 32, "{token}");
    let port = mosquitto.port();
    let profile = common::profile_copy("generic-x86_64.toml", dir.path(), |text| {
        let text = text
            .replace("port = 1883", &format!("port = {port}"))
            .replace("client_id = \"site-rot15\"", "client_id = \"fleet-00002\"")
            .replace("federation = \"demo\"", "federation = \"enrol\"");
        format!("key_file = \"fleet-00002.key\"\n{text}")
    });
    let token_file = dir.path().join("token.txt");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let token_file = token_file.display().to_string();
    let enrol = |extra: &[&str]| {
        let edge = edge_binary();
        let profile = profile.clone();
        let args: Vec<String> = ["enroll", "--timeout", "20s"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new(edge)
                    .args(&args)
                    .arg("--config")
                    .arg(&profile)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    // The request's secret as an earlier attempt whose answer was lost would have kept it.
    let request_file = dir.path().join("fleet-00002.key.request");
    let kept = format!("{token} {}\n", "5a".repeat(32));
    common::write_private(&request_file, &kept);
    let out = enrol(&["--token-file", &token_file]).await;
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("enrolled in enrol"), "{said}");
    assert!(
        !request_file.exists(),
        "the request is forgotten once its key is written"
    );

    // The key the device wrote is the one the coordinator now holds, private to its owner.
    let device_file = dir.path().join("fleet-00002.key");
    let key =
        fedge_wire::DeviceKey::from_hex(&std::fs::read_to_string(&device_file).unwrap()).unwrap();
    let held = keys::load(&keys_file).unwrap();
    assert_eq!(held.len(), 3);
    assert_eq!(held["fleet-00002"], key);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&device_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // The same request again (its answer lost on the way): the same key, sealed again.
    common::write_private(&request_file, &kept);
    let out = enrol(&["--replace", "--token", &token]).await;
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{said}");
    let again = std::fs::read_to_string(&device_file).unwrap();
    assert_eq!(fedge_wire::DeviceKey::from_hex(&again).unwrap(), key);

    // The same token in a new request: refused, counted, and the key in force stays.
    let out = enrol(&["--replace", "--token", &token]).await;
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(said.contains("no enrolment is pending"), "{said}");
    let who = coordinator
        .rejected("bad_enrolment", Duration::from_secs(10))
        .await;
    assert_eq!(who, "fleet-00002");
    assert_eq!(keys::load(&keys_file).unwrap()["fleet-00002"], key);

    // Without a restart, the enrolled device is selected and its updates are used.
    running.abort();
    let three = fleet(3, held);
    let devices = tokio::spawn(async move { run_fleet(&three).await });
    let mut seen = None;
    // Rounds of the two-device fleet that ended during the enrolments are still queued.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < until {
        let report = coordinator.round_ended(Duration::from_secs(30)).await;
        if report.selected.len() == 3 && report.reported.len() == 3 {
            seen = Some(report);
            break;
        }
    }
    let report = seen.expect("no round with the enrolled device");
    assert!(report.reported.contains(&"fleet-00002".to_string()));
    devices.abort();
}

/// Re-enrolling a device while its agent runs is refused before anything is sent: the
/// agent would keep its old key while the coordinator stored the new one, and on a broker
/// that takes client ids from certificates the two would push each other off. Once the agent
/// stopped, the same command goes ahead (here to the broker, where no coordinator answers).
#[test]
fn enrolling_under_a_running_agent_is_refused_and_spends_nothing() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = mosquitto.port();
    let profile = common::profile_copy("generic-x86_64.toml", dir.path(), |text| {
        let text = text
            .replace("port = 1883", &format!("port = {port}"))
            .replace("federation = \"demo\"", "federation = \"re-enrol\"")
            .replace("enabled = true", "enabled = false");
        format!("key_file = \"device.key\"\n{text}")
    });
    let key_file = dir.path().join("device.key");
    let key = keys::generate();
    common::write_private(&key_file, format!("{}\n", key.to_hex()));
    let mut agent = common::KillOnDrop(
        Command::new(edge_binary())
            .args(["run", "--config"])
            .arg(&profile)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The agent holds its key from its first step; its first log line comes after that.
    let logs = agent.0.stdout.take().unwrap();
    let (started_tx, started) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(logs).lines().map_while(Result::ok) {
            let _ = started_tx.send(line);
        }
    });
    let first = started
        .recv_timeout(Duration::from_secs(120))
        .expect("the agent said nothing");
    assert!(!first.contains("ERROR"), "{first}");

    let token = "ab".repeat(16);
    let enrol = || {
        Command::new(edge_binary())
            .args([
                "enroll",
                "--replace",
                "--timeout",
                "2s",
                "--token",
                &token,
                "--config",
            ])
            .arg(&profile)
            .output()
            .unwrap()
    };
    let out = enrol();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("is running"), "{said}");
    assert!(said.contains("stop it first"), "{said}");
    assert!(
        !dir.path().join("device.key.request").exists(),
        "nothing of a request is made while the agent runs"
    );
    let kept = std::fs::read_to_string(&key_file).unwrap();
    assert_eq!(fedge_wire::DeviceKey::from_hex(&kept).unwrap(), key);

    // Stopped (killed: a crash lets go as well), the agent lets go; the command then asks (and nobody answers here).
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    let out = enrol();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(said.contains("no answer from the coordinator"), "{said}");
}
