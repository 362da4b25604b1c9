//! The coordinator binary killed with SIGKILL mid-round and started again, against mosquitto:
//! the round resumes with the updates accepted before the kill (journal), an update sent while
//! it was down arrives through its persistent session, devices are authenticated, and the
//! final model equals an uninterrupted run's bit for bit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fedge_coordinator::{Rounds, StrategyConfig, store::checkpoint};
use fedge_models::{HeadConfig, ModelLayout};
use fedge_wire::{DeviceKey, Topics};
use rumqttc::{AsyncClient, MqttOptions, QoS};

use crate::common::{self, KillOnDrop};

const DEVICES: [&str; 3] = ["d1", "d2", "d3"];
const FEDERATION: &str = "restart";

pub(crate) fn head() -> ModelLayout {
    ModelLayout::new(HeadConfig::new(4, 2).with_hidden(3), false)
}

pub(crate) fn key(device: &str) -> DeviceKey {
    DeviceKey::from_bytes([device.as_bytes()[1]; 32])
}

pub(crate) fn frame(device: &str, round: u64, run: u64) -> Vec<u8> {
    let m = head().num_params();
    let base = device.as_bytes()[1] as f32 * 0.01;
    let delta: Vec<f32> = (0..m)
        .map(|i| (base + round as f32 * 0.03) * ((i % 5) as f32 - 2.0))
        .collect();
    let num_samples = 10 + device.as_bytes()[1] as u32;
    common::update_frame(fedge_wire::ClientUpdate {
        run,
        ..common::client_update(round, device, round, num_samples, &delta)
    })
}

pub(crate) fn sealed(device: &str, round: u64, run: u64) -> Vec<u8> {
    fedge_wire::seal(frame(device, round, run), &[(device, &key(device))])
}

fn write_config(dir: &Path, port: u16) -> PathBuf {
    let keys: String = DEVICES
        .iter()
        .map(|d| format!("{d} = \"{}\"\n", key(d).to_hex()))
        .collect();
    common::write_private(&dir.join("devices.toml"), keys);
    let config = format!(
        "federation = \"{FEDERATION}\"\nstrategy = \"fedavg\"\nserver_momentum = 0.5\n\
         rounds = 2\nmin_clients = 3\nmin_updates = 3\nround_timeout_s = 120\nseed = 7\n\
         state_dir = \"state\"\n\n[broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [head]\nfeatures = 4\nhidden = 3\nclasses = 2\n\n[auth]\nkeys_file = \"devices.toml\"\n"
    );
    let path = dir.join("coordinator.toml");
    std::fs::write(&path, config).unwrap();
    path
}

pub(crate) fn start_coordinator(config: &Path) -> KillOnDrop {
    let child = Command::new(common::coordinator_binary())
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

/// The test's devices: one connection subscribed to `topics`, each device's signed online
/// status retained.
async fn devices_online(port: u16, topics: &[&str]) -> (AsyncClient, rumqttc::EventLoop) {
    let mut options = MqttOptions::new("devices", "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, events) = AsyncClient::new(options, 64);
    for topic in topics {
        client.subscribe(*topic, QoS::AtLeastOnce).await.unwrap();
    }
    let federation = Topics::new(FEDERATION).unwrap();
    for d in DEVICES {
        let json = common::signed_status_json(FEDERATION, d, true, &key(d));
        let topic = federation.edge_status(d);
        client
            .publish(topic, QoS::AtLeastOnce, true, json)
            .await
            .unwrap();
    }
    (client, events)
}

/// The same inputs through an in-process machine that is never interrupted.
fn uninterrupted() -> Vec<f32> {
    let strategy = StrategyConfig {
        strategy: fedge_coordinator::strategy::StrategyKind::Fedavg,
        server_momentum: 0.5,
        ..Default::default()
    };
    let config = fedge_coordinator::RoundConfig {
        rounds: 2,
        min_clients: 3,
        min_updates: 3,
        seed: 7,
        ..Default::default()
    };
    let mut m = Rounds::new(config, strategy.build().unwrap(), head().init_flat(7));
    for d in DEVICES {
        m.handle_client_status(d, true, 0);
    }
    for round in 1..=2 {
        for d in DEVICES {
            m.handle_packet(d, &frame(d, round, 0), 0);
        }
    }
    assert_eq!(m.phase(), fedge_coordinator::Phase::Finished);
    m.params().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_mid_round_resumes_it_and_ends_like_an_uninterrupted_run() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), mosquitto.port());
    let topics = Topics::new(FEDERATION).unwrap();
    let status_topic = topics.coordinator_status();
    let (client, mut events) = devices_online(mosquitto.port(), &[&status_topic]).await;
    let send = |d: &'static str, payload: Vec<u8>| {
        let client = client.clone();
        let topic = topics.update(d);
        async move {
            client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await
                .unwrap()
        }
    };

    let mut coordinator = start_coordinator(&config);
    common::wait_status(&mut events, &status_topic, |s| {
        s.state == "training" && s.round == 1
    })
    .await;
    // Updates answer the federation's run, which the task names (a random number).
    client
        .subscribe(topics.round_task(), QoS::AtLeastOnce)
        .await
        .unwrap();
    let run = common::wait_task(&mut events, &topics.round_task())
        .await
        .run;
    for d in DEVICES {
        send(d, sealed(d, 1, run)).await;
    }
    // A forged update (d3's frame under d2's key) is rejected and changes nothing.
    let forged = || fedge_wire::seal(frame("d3", 2, run), &[("d3", &key("d2"))]);
    send("d3", forged()).await;
    common::wait_status(&mut events, &status_topic, |s| s.round == 2).await;
    send("d1", sealed("d1", 2, run)).await;
    send("d2", sealed("d2", 2, run)).await;
    send("d3", forged()).await;
    let before = common::wait_status(&mut events, &status_topic, |s| {
        s.round == 2 && s.clients_reported == 2 && s.rejected_updates.get("bad_tag") == Some(&2)
    })
    .await;
    assert_eq!(before.state, "training");

    coordinator.kill().unwrap(); // SIGKILL: no goodbye, no flush
    coordinator.wait().unwrap();
    let saved = checkpoint::load(&dir.path().join("state/checkpoint.bin"))
        .unwrap()
        .unwrap();
    assert_eq!(saved.next_round, 2, "the checkpoint holds round 1's result");
    // Sent while the coordinator is down: the broker keeps it for the persistent session.
    send("d3", sealed("d3", 2, run)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut coordinator = start_coordinator(&config);
    let exit = tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = coordinator.try_wait().unwrap() {
                return Some(status);
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = coordinator.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    // Keep the test's own connection alive while the coordinator finishes.
    let finished = common::wait_status(&mut events, &status_topic, |s| s.state == "finished").await;
    let exit = exit
        .await
        .unwrap()
        .expect("the restarted coordinator did not finish");
    assert!(exit.success(), "coordinator exited with {exit}");
    assert_eq!(finished.round, 2);
    let saved = checkpoint::load(&dir.path().join("state/checkpoint.bin"))
        .unwrap()
        .unwrap();
    assert_eq!((saved.next_round, saved.aggregated_rounds), (3, 2));
    assert_eq!(
        saved.params,
        uninterrupted(),
        "the killed and resumed federation must end with the uninterrupted run's parameters"
    );
}

/// Largest file the coordinator may write in `an_update_is_acknowledged_only_once_journaled`:
/// the journal's round-opened record fits, an accepted update's record does not.
/// (The audit trail, whose lines are larger, is turned off there.)
const JOURNAL_LIMIT_BYTES: u64 = 160;

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_is_acknowledged_only_once_journaled() {
    // The coordinator dies (SIGXFSZ, from the file-size limit `prlimit` sets) in the write of
    // the first update's journal record: after the update arrived, before it is on disk. The
    // broker must still hold every update of the round, since none was acknowledged, and give
    // them to the restarted coordinator; acknowledged on arrival, they would be lost and the
    // round would wait for devices that answered already.
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    if Command::new("prlimit").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("FEDGE_REQUIRE_MOSQUITTO").is_none(),
            "prlimit (util-linux) is needed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), mosquitto.port());
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("audit = false\n{text}")).unwrap();
    let topics = Topics::new(FEDERATION).unwrap();
    let status_topic = topics.coordinator_status();
    let (client, mut events) = devices_online(mosquitto.port(), &[&status_topic]).await;
    let limited = Command::new("prlimit")
        .arg(format!("--fsize={JOURNAL_LIMIT_BYTES}"))
        .arg(common::coordinator_binary())
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut coordinator = KillOnDrop(limited);
    common::wait_status(&mut events, &status_topic, |s| {
        s.state == "training" && s.round == 1
    })
    .await;
    client
        .subscribe(topics.round_task(), QoS::AtLeastOnce)
        .await
        .unwrap();
    let run = common::wait_task(&mut events, &topics.round_task())
        .await
        .run;
    for d in DEVICES {
        client
            .publish(topics.update(d), QoS::AtLeastOnce, false, sealed(d, 1, run))
            .await
            .unwrap();
    }
    // The test's own event loop sends the updates: polled while waiting for the death.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let died = loop {
        if let Some(status) = coordinator.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator outlived its file-size limit"
        );
        let _ = tokio::time::timeout(Duration::from_millis(20), events.poll()).await;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        died.signal(),
        Some(25),
        "SIGXFSZ in the journal write: {died}"
    );
    let journal = std::fs::metadata(dir.path().join("state/journal.bin")).unwrap();
    assert!(journal.len() <= JOURNAL_LIMIT_BYTES);

    // Restarted without the limit: round 1 resumes from the journal's opened record and the
    // broker delivers the three updates again; round 2 then completes as usual.
    let mut coordinator = start_coordinator(&config);
    common::wait_status(&mut events, &status_topic, |s| {
        s.state == "training" && s.round == 2
    })
    .await;
    for d in DEVICES {
        client
            .publish(topics.update(d), QoS::AtLeastOnce, false, sealed(d, 2, run))
            .await
            .unwrap();
    }
    common::wait_status(&mut events, &status_topic, |s| s.state == "finished").await;
    let _ = tokio::task::spawn_blocking(move || coordinator.wait()).await;
    let saved = checkpoint::load(&dir.path().join("state/checkpoint.bin"))
        .unwrap()
        .unwrap();
    assert_eq!(
        saved.params,
        uninterrupted(),
        "no update of round 1 was lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_central_dp_a_checkpoint_that_cannot_be_saved_releases_nothing() {
    // The checkpoint holds the privacy accountant: a release whose ε is not on disk would be
    // forgotten by a restart, which then reports less ε than was spent.
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = mosquitto.port();
    let config = dir.path().join("coordinator.toml");
    let text = format!(
        "federation = \"dp-save\"\nstrategy = \"fedavg\"\nrounds = 3\nfraction = 1.0\n\
         min_clients = 3\nmin_updates = 3\nround_timeout_s = 30\nstate_dir = \"state\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n[head]\nfeatures = 8\nhidden = 4\n\
         classes = 2\n\n[train]\nfeature_norm = \"none\"\n\n[privacy]\nmode = \"central\"\n\
         clip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-5\n"
    );
    std::fs::write(&config, text).unwrap();
    let coordinator = Command::new(common::coordinator_binary())
        .current_dir(dir.path())
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error")
        .stdout(std::fs::File::create(dir.path().join("log.txt")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("err.txt")).unwrap())
        .spawn()
        .unwrap();
    let mut coordinator = KillOnDrop(coordinator);
    // Folders where the process's first temporary files go (`fedge_daemon::write_atomically`
    // names them `<file>.<pid>.<n>.tmp`): every checkpoint save fails.
    for n in 0..8 {
        let name = format!("state/checkpoint.bin.{}.{n}.tmp/blocked", coordinator.id());
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
    }
    let fleet = fedge::bench::fleet::FleetOptions {
        broker: mosquitto.broker(),
        federation: "dp-save".into(),
        devices: 3,
        rounds: 1,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    };
    let report = fedge::bench::fleet::run_fleet(&fleet).await.unwrap();
    assert_eq!(report.rounds.len(), 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = coordinator.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator went on after its checkpoint failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let said = read("log.txt") + &read("err.txt");
    assert!(!status.success(), "{said}");
    assert!(said.contains("was not released"), "{said}");
    // Nothing of the new model on the broker: no release, and the task is still round 1's.
    let topics = Topics::new("dp-save").unwrap();
    let retained = |topic: String| {
        let port = port.to_string();
        let args = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            &topic,
            "-C",
            "1",
            "-W",
            "2",
        ];
        Command::new("mosquitto_sub").args(args).output().unwrap()
    };
    let release = retained(topics.model_current());
    assert!(release.stdout.is_empty(), "a release went out");
    let mut options = MqttOptions::new("observer", "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(options, 16);
    client
        .subscribe(topics.round_task(), QoS::AtLeastOnce)
        .await
        .unwrap();
    assert_eq!(
        common::wait_task(&mut events, &topics.round_task())
            .await
            .round,
        1
    );
}
