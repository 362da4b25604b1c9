//! A federation across two brokers: the devices of a site talk to the site's mosquitto only,
//! bridged to the central mosquitto by `deploy/mosquitto/site-bridge.conf` as shipped (its
//! address pointed at the test's central broker, without its TLS files); the coordinator
//! talks to the central broker only. With device keys, every round completes, the released
//! model reaches the site, and the devices' statuses reach the centre.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::Value;

use crate::common::{self, KillOnDrop, Mosquitto};

const ROUNDS: u64 = 3;
const DEVICES: [(&str, &str); 2] = [("cam-1", "rot0"), ("cam-2", "rot15")];

/// The shipped bridge configuration `file` (in `deploy/mosquitto/`), pointed at
/// `central_port`, TLS files left out.
pub fn bridge_conf(file: &str, central_port: u16) -> String {
    let shipped =
        std::fs::read_to_string(common::repo_root().join("deploy/mosquitto").join(file)).unwrap();
    let mut out = String::new();
    for line in shipped.lines() {
        if line.starts_with("bridge_cafile")
            || line.starts_with("bridge_certfile")
            || line.starts_with("bridge_keyfile")
        {
            continue;
        }
        let line = line.replace(
            "address central.example:8883",
            &format!("address 127.0.0.1:{central_port}"),
        );
        assert!(
            line.starts_with('#') || !line.contains("/etc/"),
            "unexpected path: {line}"
        );
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A key for `client` in `dir/<keys>` (created when missing); returns the key file.
pub fn keygen(dir: &Path, keys: &str, client: &str) -> PathBuf {
    let out = dir.join(format!("{client}.key"));
    common::succeeded(
        Command::new(common::coordinator_binary())
            .args(["keygen", "--client", client, "--keys"])
            .arg(dir.join(keys))
            .arg("--out")
            .arg(&out),
    );
    out
}

/// Every retained or live message under `fedge/` on the broker at `port` for `within`, keyed
/// by topic (the last one wins), until `done` holds.
pub async fn collect(
    port: u16,
    id: &str,
    within: Duration,
    done: impl Fn(&std::collections::BTreeMap<String, Vec<u8>>) -> bool,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut events) = AsyncClient::new(options, 64);
    client.subscribe("fedge/#", QoS::AtLeastOnce).await.unwrap();
    let mut seen = std::collections::BTreeMap::new();
    let end = Instant::now() + within;
    while Instant::now() < end && !done(&seen) {
        if let Ok(Ok(Event::Incoming(Packet::Publish(p)))) =
            tokio::time::timeout(Duration::from_secs(1), events.poll()).await
        {
            seen.insert(p.topic.clone(), p.payload.to_vec());
        }
    }
    let _ = client.disconnect().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federation_runs_across_a_site_broker_bridged_to_the_central_one() {
    let Some(central) = Mosquitto::start() else {
        return;
    };
    let site = Mosquitto::start_bridged(&bridge_conf("site-bridge.conf", central.port())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut keys = Vec::new();
    for (id, domain) in DEVICES {
        let key = keygen(root, "keys.toml", id);
        let profile = format!(
            "client_id = \"{id}\"\nfederation = \"demo\"\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache-{id}\"\nkey_file = {key:?}\n\
             backbone = {:?}\n\n[broker]\nhost = \"127.0.0.1\"\nport = {}\n\n\
             [data]\nkind = \"digits\"\ndomain = \"{domain}\"\n",
            common::repo_root().join("models/assets/digits-conv.toml"),
            site.port()
        );
        let path = root.join(format!("{id}.toml"));
        std::fs::write(&path, profile).unwrap();
        keys.push(path);
    }
    let coordinator = root.join("coordinator.toml");
    std::fs::write(
        &coordinator,
        format!(
            "federation = \"demo\"\nrounds = {ROUNDS}\nmin_clients = 2\nmin_updates = 2\n\
             round_timeout_s = 60\nstate_dir = \"state\"\n\n\
             [broker]\nhost = \"127.0.0.1\"\nport = {}\n\n\
             [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
             [auth]\nkeys_file = \"keys.toml\"\n",
            central.port()
        ),
    )
    .unwrap();
    let spawn = |binary: PathBuf, config: &Path| {
        KillOnDrop(
            Command::new(binary)
                .args(["run", "--config"])
                .arg(config)
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let edge = common::coordinator_binary().with_file_name("fedge-edge");
    let _devices: Vec<KillOnDrop> = keys.iter().map(|p| spawn(edge.clone(), p)).collect();
    let mut coordinator = spawn(common::coordinator_binary(), &coordinator);

    // The site sees the whole federation through its bridge: the last release, retained.
    let at_site = collect(
        site.port(),
        "site-watch",
        Duration::from_secs(180),
        |seen| {
            seen.get("fedge/demo/coordinator/status")
                .and_then(|s| serde_json::from_slice::<Value>(s).ok())
                .is_some_and(|s| s["state"] == "finished")
        },
    )
    .await;
    let status = coordinator.0.wait().unwrap();
    assert!(status.success(), "coordinator: {status}");
    let model = at_site
        .get("fedge/demo/model/current")
        .expect("the released model crossed the bridge");
    // Sealed with the devices' keys: a sealed frame, not a plain one.
    assert!(matches!(
        fedge_wire::decode(model),
        Ok(fedge_wire::Message::Sealed(_) | fedge_wire::Message::Model(_))
    ));
    // The centre holds the devices' statuses (bridged out), each serving the last release.
    let at_centre = collect(
        central.port(),
        "central-watch",
        Duration::from_secs(20),
        |seen| {
            DEVICES.iter().all(|(id, _)| {
                seen.get(&format!("fedge/demo/edge/{id}/status"))
                    .and_then(|s| serde_json::from_slice::<Value>(s).ok())
                    .is_some_and(|s| s["model_round"] == ROUNDS)
            })
        },
    )
    .await;
    for (id, _) in DEVICES {
        let status: Value =
            serde_json::from_slice(&at_centre[&format!("fedge/demo/edge/{id}/status")]).unwrap();
        assert_eq!(status["model_round"], ROUNDS, "{id}: {status}");
        assert_eq!(status["last_round"], ROUNDS, "{id}: {status}");
        assert_eq!(status["last_error"], "", "{id}: {status}");
    }
    // Every round aggregated both devices' updates, all of which crossed the bridge.
    let final_status: Value =
        serde_json::from_slice(&at_centre["fedge/demo/coordinator/status"]).unwrap();
    assert_eq!(final_status["round"], ROUNDS, "{final_status}");
    assert!(
        final_status["rejected_updates"]
            .as_object()
            .is_none_or(|r| r.values().all(|v| v == 0)),
        "{final_status}"
    );
    drop(site);
}

#[test]
fn the_sites_doc_shows_the_shipped_bridges() {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/sites.md")).unwrap();
    for file in ["site-bridge.conf", "site-aggregator-bridge.conf"] {
        let shipped =
            std::fs::read_to_string(common::repo_root().join("deploy/mosquitto").join(file))
                .unwrap();
        assert!(
            doc.contains(&shipped),
            "docs/sites.md must show {file} verbatim"
        );
    }
}
