//! An operator runs a federation with `fedge-coordinator ctl`: a coordinator process over
//! mosquitto with an operator key, three simulated devices. Paused, the coordinator opens no
//! round though devices are online; a banned device is selected for no round; a command tagged
//! with another key is refused and counted; `set-rounds` ends the federation early; `resume`
//! lets it run.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use fedge::bench::fleet::{FleetOptions, run_fleet};

use crate::common::{self, KillOnDrop};

fn ctl(config: &Path, args: &[&str]) -> Output {
    Command::new(common::coordinator_binary())
        .args(["ctl", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

/// The coordinator's status, asked with `ctl status` until it says `finished` (30 s at most).
async fn finished_status(config: &Path) -> serde_json::Value {
    let config = config.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = ctl_ok(&config, &["status"]);
            if status["state"] == "finished" {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "{status}");
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap()
}

/// `ctl` that must succeed; its printed status.
fn ctl_ok(config: &Path, args: &[&str]) -> serde_json::Value {
    let out = ctl(config, args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "ctl {args:?}: {stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap_or_default()
}

fn write_config(dir: &Path, name: &str, port: u16, key: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let text = format!(
        "federation = \"ops\"\nstrategy = \"fedavg\"\nrounds = 10\nfraction = 1.0\n\
         min_clients = 2\nmin_updates = 2\nround_timeout_s = 30\n\n[broker]\nhost = \
         \"127.0.0.1\"\nport = {port}\n\n[head]\nfeatures = 8\nhidden = 4\nclasses = 2\n\n\
         [auth]\noperator_key_file = \"{key}\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_bans_and_shortens_a_running_federation() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "coordinator.toml",
        mosquitto.port(),
        "operator.key",
    );
    let impostor = write_config(dir.path(), "impostor.toml", mosquitto.port(), "other.key");
    ctl_ok(&config, &["keygen"]);
    ctl_ok(&impostor, &["keygen"]);
    // A second keygen would replace the key: refused.
    assert!(!ctl(&config, &["keygen"]).status.success());
    let mut coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let paused = ctl_ok(&config, &["pause"]);
    assert_eq!(paused["paused"], true);
    let banned = ctl_ok(&config, &["ban", "fleet-00002"]);
    assert_eq!(banned["banned"], serde_json::json!(["fleet-00002"]));
    // Tagged with another key: refused, and ctl says so.
    let forged = ctl(&impostor, &["--wait", "2", "resume"]);
    assert!(!forged.status.success());
    assert!(String::from_utf8_lossy(&forged.stderr).contains("operator_key_file"));

    let fleet = FleetOptions {
        broker: mosquitto.broker(),
        federation: "ops".into(),
        devices: 3,
        rounds: 2,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    };
    let devices = tokio::spawn(async move { run_fleet(&fleet).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let config_path = config.clone();
    let waiting = tokio::task::spawn_blocking(move || ctl_ok(&config_path, &["status"]))
        .await
        .unwrap();
    assert_eq!(waiting["round"], 0, "paused: no round opened: {waiting}");
    assert_eq!(waiting["clients_online"], 3, "{waiting}");
    assert_eq!(waiting["rejected_updates"]["bad_control"], 1, "{waiting}");
    let config_path = config.clone();
    tokio::task::spawn_blocking(move || {
        assert_eq!(
            ctl_ok(&config_path, &["set-rounds", "2"])["total_rounds"],
            2
        );
        assert_eq!(
            ctl_ok(&config_path, &["resume"])["paused"],
            serde_json::Value::Null
        );
    })
    .await
    .unwrap();
    let report = devices.await.unwrap().unwrap();
    assert_eq!(report.rounds.len(), 2, "{report:?}");
    for round in &report.rounds {
        // Two of three devices: the banned one is never selected.
        assert_eq!((round.selected, round.reported), (2, 2), "{round:?}");
    }
    assert_eq!(
        report.updates_sent, 4,
        "the banned device never answered a task"
    );
    // Two rounds, as set: the coordinator finished by itself.
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = coordinator.0.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "still running");
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_device_is_refused_without_a_restart() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("devices.toml");
    let keys: fedge_coordinator::DeviceKeys = fedge::bench::fleet::device_ids(3)
        .into_iter()
        .map(|id| (id, fedge_coordinator::store::keys::generate()))
        .collect();
    fedge_coordinator::store::keys::store(&keys_file, &keys).unwrap();
    // More rounds than the test waits for: it stops the federation itself.
    let config = fedge_coordinator::RoundConfig {
        rounds: 1_000,
        min_clients: 2,
        min_updates: 2,
        round_timeout_ms: 3_000,
        auth: Some(std::sync::Arc::new(keys.clone())),
        ..fedge_coordinator::RoundConfig::default()
    };
    let rounds =
        fedge_coordinator::Rounds::new(config, Box::new(fedge_coordinator::FedAvg), vec![0.0; 100]);
    let options = fedge_coordinator::DriverOptions {
        keys_file: Some(keys_file.clone()),
        ..common::driver_options(mosquitto.broker(), "revoke")
    };
    let mut coordinator = common::Driver::spawn(rounds, options);
    let fleet = FleetOptions {
        broker: mosquitto.broker(),
        federation: "revoke".into(),
        devices: 3,
        rounds: 1_000,
        timeout: Duration::from_secs(60),
        keys: keys.clone().into_iter().collect(),
    };
    let devices = tokio::spawn(async move { run_fleet(&fleet).await });
    // Rounds with all three devices run.
    loop {
        let report = coordinator.round_ended(Duration::from_secs(30)).await;
        if report.selected.len() == 3 {
            break;
        }
    }
    // Revoked with the command an operator runs; the running coordinator reloads the file.
    let out = Command::new(common::coordinator_binary())
        .args(["revoke", "--client", "fleet-00002", "--keys"])
        .arg(&keys_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Within a few rounds the device is selected no more.
    let mut rounds_after = 0;
    while rounds_after < 3 {
        let report = coordinator.round_ended(Duration::from_secs(30)).await;
        if report.selected == ["fleet-00000", "fleet-00001"] {
            rounds_after += 1;
        }
    }
    // Its retained status is cleared: dashboards show it no more.
    let topics = fedge_wire::Topics::new("revoke").unwrap();
    let port = mosquitto.port().to_string();
    let retained = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port, "-C", "1", "-W", "2"])
        .args(["-t", &topics.edge_status("fleet-00002")])
        .output()
        .unwrap();
    assert!(
        retained.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&retained.stdout)
    );
    // The device announces itself again, tagged with its old key: unknown now.
    let mut status = fedge_wire::EdgeStatus {
        client_id: "fleet-00002".into(),
        online: true,
        updated_at: fedge_mqtt::now_rfc3339(),
        ..fedge_wire::EdgeStatus::default()
    };
    status.sign("revoke", &keys["fleet-00002"]);
    let (client, mut events) = rumqttc::AsyncClient::new(
        rumqttc::MqttOptions::new("replayer", "127.0.0.1", mosquitto.port()),
        8,
    );
    let topic = topics.edge_status("fleet-00002");
    let json = serde_json::to_vec(&status).unwrap();
    client
        .publish(topic, rumqttc::QoS::AtLeastOnce, false, json)
        .await
        .unwrap();
    let poll = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    let who = coordinator
        .rejected("unknown_device", Duration::from_secs(10))
        .await;
    assert_eq!(who, "fleet-00002");
    poll.abort();
    let report = coordinator.round_ended(Duration::from_secs(30)).await;
    assert!(
        !report.selected.contains(&"fleet-00002".to_string()),
        "{report:?}"
    );
    devices.abort();
}

/// Logs written to a file or a pipe hold no terminal colour codes (and `NO_COLOR` is honoured
/// on a terminal); the demo's info lines were escape-coded in a redirected log before.
#[test]
fn a_redirected_log_holds_no_colour_codes() {
    let out = common::succeeded(
        Command::new(env!("CARGO_BIN_EXE_fedge"))
            .args(["demo", "--rounds", "1", "--quiet"])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR"),
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.lines().count() > 3, "info lines expected: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a redirected log:\n{log}"
    );
    assert!(!fedge_daemon::colour(false));
    // A federation can be followed by its log: devices coming and the round's accuracy.
    assert!(log.contains("device online client=site-0-rot0"), "{log}");
    let ended = log
        .lines()
        .find(|l| l.contains("round ended"))
        .expect("a round line");
    assert!(ended.contains("source_val_accuracy=0."), "{ended}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_settings_survive_a_restart_and_a_captured_command_is_not_taken_again() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "coordinator.toml",
        mosquitto.port(),
        "operator.key",
    );
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replacen("rounds = 10\n", "rounds = 10\nstate_dir = \"state\"\n", 1);
    std::fs::write(&config, text).unwrap();
    ctl_ok(&config, &["keygen"]);
    let start = || {
        KillOnDrop(
            Command::new(common::coordinator_binary())
                .current_dir(dir.path())
                .args(["run", "--config"])
                .arg(&config)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut coordinator = start();
    std::thread::sleep(Duration::from_millis(500));
    ctl_ok(&config, &["pause"]);
    ctl_ok(&config, &["ban", "fleet-00002"]);
    ctl_ok(&config, &["set-rounds", "7"]);
    // A command as an eavesdropper captured it off the broker: tagged, numbered, taken once.
    let key = std::fs::read_to_string(dir.path().join("operator.key")).unwrap();
    let key = fedge_wire::DeviceKey::from_hex(&key).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let unban = fedge_wire::control::Command::Unban {
        client: "fleet-00003".into(),
    };
    let captured = fedge_wire::control::ControlMessage::signed("ops", now + 1, unban, &key);
    let captured = serde_json::to_string(&captured).unwrap();
    let topic = fedge_wire::Topics::new("ops").unwrap().control();
    let publish = |payload: &str| {
        let port = mosquitto.port().to_string();
        let args = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-q",
            "1",
            "-t",
            &topic,
            "-m",
            payload,
        ];
        common::succeeded(Command::new("mosquitto_pub").args(args));
    };
    publish(&captured);
    let status = ctl_ok(&config, &["status"]);
    assert_eq!(
        status["rejected_updates"]["bad_control"],
        serde_json::Value::Null,
        "{status}"
    );

    // Killed, not stopped: what the commands set was kept as each was taken.
    coordinator.0.kill().unwrap();
    coordinator.0.wait().unwrap();
    let _restarted = start();
    std::thread::sleep(Duration::from_millis(500));
    publish(&captured);
    let status = ctl_ok(&config, &["status"]);
    assert_eq!(status["paused"], true, "{status}");
    assert_eq!(
        status["banned"],
        serde_json::json!(["fleet-00002"]),
        "{status}"
    );
    assert_eq!(status["total_rounds"], 7, "{status}");
    assert_eq!(
        status["rejected_updates"]["bad_control"], 1,
        "the captured command replayed after the restart is refused: {status}"
    );
    let kept = std::fs::read(dir.path().join("state/control.json")).unwrap();
    let kept: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    assert!(kept["last_seq"].as_u64().unwrap() > now, "{kept}");
    // The trail names what changed the federation; `ctl status` asked and changed nothing.
    let trail = std::fs::read_to_string(dir.path().join("state/audit.jsonl")).unwrap();
    let commands: Vec<String> = (trail.lines())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event"] == "control")
        .map(|l| {
            l["command"]["command"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(!commands.iter().any(|c| c == "status"), "{trail}");
    for taken in ["pause", "ban", "set-rounds"] {
        assert!(
            commands.iter().any(|c| c == taken),
            "no {taken} in {commands:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_stays_up_runs_a_second_run_started_with_ctl() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "coordinator.toml",
        mosquitto.port(),
        "operator.key",
    );
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replacen("rounds = 10\n", "rounds = 2\nstay_up = true\n", 1);
    std::fs::write(&config, text).unwrap();
    ctl_ok(&config, &["keygen"]);
    let mut coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let fleet = FleetOptions {
        broker: mosquitto.broker(),
        federation: "ops".into(),
        devices: 2,
        rounds: 4,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    };
    let devices = tokio::spawn(async move { run_fleet(&fleet).await });
    // The first run's two rounds end; the coordinator stays.
    let finished = finished_status(&config).await;
    assert_eq!(finished["round"], 2, "{finished}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        coordinator.0.try_wait().unwrap().is_none(),
        "the coordinator exited"
    );
    let config_path = config.clone();
    let started = tokio::task::spawn_blocking(move || ctl_ok(&config_path, &["new-run", "2"]))
        .await
        .unwrap();
    assert_eq!(
        started["runs"].as_array().map(Vec::len),
        Some(1),
        "{started}"
    );
    let report = devices.await.unwrap().unwrap();
    assert_eq!(report.rounds.len(), 4, "{report:?}");
    let status = finished_status(&config).await;
    assert_eq!(status["round"], 4, "{status}");
    // The status names the run it is on: another one after new-run.
    let run = |s: &serde_json::Value| s["run"].as_str().unwrap_or_default().to_owned();
    assert_eq!(run(&finished).len(), 16, "{finished}");
    assert_ne!(run(&status), run(&finished), "{status}");
    let runs = status["runs"].as_array().expect("the run history");
    assert_eq!(runs.len(), 1, "{status}");
    assert_eq!(
        (
            runs[0]["first_round"].as_u64(),
            runs[0]["last_round"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert!(
        coordinator.0.try_wait().unwrap().is_none(),
        "still up after the second run"
    );
}
