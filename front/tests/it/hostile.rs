//! A hostile participant against the documented broker set-up (TLS with client certificates,
//! the ACL of `deploy/mosquitto/`, device keys on the coordinator): `fedge attack` runs every
//! attack from a device certificate of its own while the real `fedge-coordinator` binary runs
//! three rounds with two keyed devices. What the broker does not drop, the coordinator rejects:
//! the federation ends with exactly the parameters of a run without the attacker.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fedge_coordinator::{Rounds, store::checkpoint};
use fedge_models::{HeadConfig, ModelLayout};
use fedge_mqtt::{BrokerConfig, TlsSettings};
use fedge_wire::{DeviceKey, Message, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};

use crate::broker_hardening::mosquitto::Broker;
use crate::common::{self, KillOnDrop};

const FEDERATION: &str = "site-1";
const COORDINATOR: &str = "fedge-coordinator-site-1";
const DEVICES: [&str; 2] = ["cam-01", "cam-02"];
const ROUNDS: u64 = 3;

fn head() -> ModelLayout {
    ModelLayout::new(HeadConfig::new(4, 2).with_hidden(3), false)
}

fn key(device: &str) -> DeviceKey {
    DeviceKey::from_bytes([device.as_bytes()[5]; 32])
}

/// The honest update of `device` in `round`: small deltas of similar norm.
fn update(device: &str, round: u64, run: u64) -> Vec<u8> {
    let base = 0.01 * (device.as_bytes()[5] - b'0') as f32;
    let delta: Vec<f32> = (0..head().num_params())
        .map(|i| (base + round as f32 * 0.02) * ((i % 5) as f32 - 2.0))
        .collect();
    let frame = common::update_frame(fedge_wire::ClientUpdate {
        run,
        ..common::client_update(round, device, round, 20, &delta)
    });
    fedge_wire::seal(frame, &[(device, &key(device))])
}

/// The same honest updates through an in-process machine, with nobody attacking.
fn unattacked() -> Vec<f32> {
    let config = fedge_coordinator::RoundConfig {
        rounds: ROUNDS,
        min_clients: 2,
        min_updates: 2,
        seed: 7,
        ..Default::default()
    };
    let strategy = fedge_coordinator::StrategyConfig::default()
        .build()
        .unwrap();
    let mut m = Rounds::new(config, strategy, head().init_flat(7));
    for d in DEVICES {
        m.handle_client_status(d, true, 0);
    }
    for round in 1..=ROUNDS {
        for d in DEVICES {
            let plain = match fedge_wire::decode(&update(d, round, 0)) {
                Ok(Message::Sealed(sealed)) => sealed.inner,
                other => panic!("{other:?}"),
            };
            m.handle_packet(d, &plain, 0);
        }
    }
    m.params().to_vec()
}

fn identity(dir: &Path, port: u16, cn: &str) -> BrokerConfig {
    let cert = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    BrokerConfig {
        tls: Some(TlsSettings::with_files(dir.join("ca.pem"), Some(cert)).unwrap()),
        ..BrokerConfig::at("127.0.0.1", port)
    }
}

/// One honest device: says it is online (signed), answers every task once, until `rounds`
/// rounds were answered or time runs out.
async fn device(broker: BrokerConfig, name: &'static str) -> u64 {
    let topics = Topics::new(FEDERATION).unwrap();
    let (client, mut events) = AsyncClient::new(broker.options(name, None), 64);
    let mut answered = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while answered < ROUNDS {
        let Ok(event) = tokio::time::timeout_at(deadline, events.poll()).await else {
            break;
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                let status = common::signed_status_json(FEDERATION, name, true, &key(name));
                let _ =
                    client.try_publish(topics.edge_status(name), QoS::AtLeastOnce, true, status);
                let _ = client.try_subscribe(topics.round_task(), QoS::AtLeastOnce);
            }
            Ok(Event::Incoming(Packet::Publish(p))) if p.topic == topics.round_task() => {
                let task = match fedge_wire::decode(&p.payload) {
                    Ok(Message::Sealed(sealed)) if sealed.open(name, &key(name)).is_ok() => {
                        fedge_wire::decode(&sealed.inner)
                    }
                    _ => continue,
                };
                if let Ok(Message::RoundTask(task)) = task
                    && task.round > answered
                    && task.selected.iter().any(|c| c == name)
                {
                    answered = task.round;
                    let frame = update(name, task.round, task.run);
                    let _ = client.try_publish(topics.update(name), QoS::AtLeastOnce, false, frame);
                }
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    // Let the last update reach the broker.
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(100), events.poll())
            .await
            .is_err()
        {
            break;
        }
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_against_the_documented_setup_leaves_the_model_as_without_it() {
    if !crate::tls::has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    crate::tls::make_certificates(d);
    for cn in [COORDINATOR, "cam-01", "cam-02", "mallory", "observer"] {
        crate::tls::client_certificate(d, cn);
    }
    let Some(broker) = Broker::documented(d) else {
        return;
    };
    let port = broker.port();
    let keys: String = DEVICES
        .iter()
        .map(|c| format!("{c} = \"{}\"\n", key(c).to_hex()))
        .collect();
    common::write_private(&d.join("devices.toml"), keys);
    let config = format!(
        "federation = \"{FEDERATION}\"\nrounds = {ROUNDS}\nmin_clients = 2\nmin_updates = 2\n\
         round_timeout_s = 20\nseed = 7\nstate_dir = \"state\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [broker.tls]\nca_file = \"ca.pem\"\nclient_cert = \"{COORDINATOR}.pem\"\n\
         client_key = \"{COORDINATOR}.key\"\n\n\
         [head]\nfeatures = 4\nhidden = 3\nclasses = 2\n\n[auth]\nkeys_file = \"devices.toml\"\n"
    );
    std::fs::write(d.join("coordinator.toml"), config).unwrap();
    let coordinator = Command::new(common::coordinator_binary())
        .args(["run", "--config"])
        .arg(d.join("coordinator.toml"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut coordinator = KillOnDrop(coordinator);
    // The attacker: a device certificate of its own (CN mallory), no fedge key, every attack.
    let attack = Command::new(env!("CARGO_BIN_EXE_fedge"))
        .args([
            "attack",
            "--federation",
            FEDERATION,
            "--kind",
            "all",
            "--duration",
            "12",
        ])
        .arg("--broker")
        .arg(format!("mqtts://127.0.0.1:{port}"))
        .arg("--ca-file")
        .arg(d.join("ca.pem"))
        .arg("--client-cert")
        .arg(d.join("mallory.pem"))
        .arg("--client-key")
        .arg(d.join("mallory.key"))
        .arg("--json")
        .arg(d.join("attack.json"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut attack = KillOnDrop(attack);
    let devices = DEVICES.map(|name| tokio::spawn(device(identity(d, port, name), name)));
    for handle in devices {
        assert_eq!(handle.await.unwrap(), ROUNDS, "a device missed rounds");
    }
    let exit = tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = coordinator.try_wait().unwrap() {
                return Some(status);
            }
            if start.elapsed() > Duration::from_secs(60) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap()
    .expect("the coordinator did not finish under attack");
    assert!(exit.success(), "coordinator exited with {exit}");
    let saved = checkpoint::load(&d.join("state/checkpoint.bin"))
        .unwrap()
        .unwrap();
    assert_eq!(saved.aggregated_rounds, ROUNDS);
    assert_eq!(
        saved.params,
        unattacked(),
        "the attacked federation must end with the parameters of a run without the attacker"
    );
    let attack_exit = tokio::task::spawn_blocking(move || attack.wait().unwrap())
        .await
        .unwrap();
    assert!(
        attack_exit.success(),
        "fedge attack exited with {attack_exit}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("attack.json")).unwrap()).unwrap();
    assert!(report.is_object(), "{report}");
    drop(broker);
}
