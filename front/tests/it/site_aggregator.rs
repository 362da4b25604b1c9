//! Site aggregators end to end, with keys everywhere: a global coordinator (FedOMG) on the
//! central mosquitto, and two sites, each with its own mosquitto, site aggregator and devices.
//! Site plant-7's broker is bridged to the centre by `deploy/mosquitto/site-aggregator-bridge.conf`
//! as shipped and its aggregator talks to the site broker only; site plant-8's aggregator holds
//! two connections, its site broker and the central one. Plant-7's aggregator is killed
//! (SIGKILL) in the middle of round 2, with one device's update accepted and the other device
//! held (SIGSTOP), and started again: it resumes the round with the update it had, every global
//! round aggregates both sites, and each device ends serving the last global model.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, KillOnDrop, Mosquitto};
use crate::sites::{bridge_conf, collect, keygen};

const ROUNDS: u64 = 3;

/// A device profile of federation `site` on the broker at `port`.
fn device(root: &Path, site: &str, id: &str, domain: &str, port: u16) -> PathBuf {
    let key = keygen(root, &format!("keys-{site}.toml"), id);
    let profile = format!(
        "client_id = \"{id}\"\nfederation = \"{site}\"\nhidden = 16\nseed = 1\n\
         cache_dir = \"cache-{id}\"\nkey_file = {key:?}\nbackbone = {:?}\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [data]\nkind = \"digits\"\ndomain = \"{domain}\"\n",
        common::repo_root().join("models/assets/digits-conv.toml"),
    );
    let path = root.join(format!("{id}.toml"));
    std::fs::write(&path, profile).unwrap();
    path
}

/// A site aggregator's configuration: its devices on `port`, the global federation on
/// `upstream` (or through the site broker's bridge).
fn site(root: &Path, name: &str, devices: usize, port: u16, upstream: Option<u16>) -> PathBuf {
    let key = keygen(root, "keys.toml", name);
    let upstream = upstream
        .map(|p| format!("\n[site.upstream]\nhost = \"127.0.0.1\"\nport = {p}\n"))
        .unwrap_or_default();
    let config = format!(
        "role = \"site\"\nfederation = \"{name}\"\nmin_clients = {devices}\nmin_updates = 1\n\
         round_timeout_s = 8\nstate_dir = \"state-{name}\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [auth]\nkeys_file = \"keys-{name}.toml\"\n\n\
         [site]\nname = \"{name}\"\nfederation = \"demo\"\nkey_file = {key:?}\n{upstream}"
    );
    let path = root.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

fn spawn(binary: &Path, config: &Path, log: &Path) -> KillOnDrop {
    KillOnDrop(
        Command::new(binary)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn json(seen: &std::collections::BTreeMap<String, Vec<u8>>, topic: &str) -> Value {
    seen.get(topic)
        .and_then(|s| serde_json::from_slice(s).ok())
        .unwrap_or(Value::Null)
}

/// A log without its colours.
fn plain(log: &str) -> String {
    let mut out = String::new();
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sites_answer_a_fedomg_federation_and_one_survives_a_sigkill() {
    let Some(central) = Mosquitto::start() else {
        return;
    };
    let bridged =
        Mosquitto::start_bridged(&bridge_conf("site-aggregator-bridge.conf", central.port()))
            .unwrap();
    let direct = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let edge = common::coordinator_binary().with_file_name("fedge-edge");
    let coordinator = common::coordinator_binary();

    let devices = [
        device(root, "plant-7", "cam-1", "rot0", bridged.port()),
        device(root, "plant-7", "cam-2", "rot15", bridged.port()),
        device(root, "plant-8", "cam-3", "rot30", direct.port()),
    ];
    let plant7 = site(root, "plant-7", 2, bridged.port(), None);
    let plant8 = site(root, "plant-8", 1, direct.port(), Some(central.port()));
    let global = root.join("global.toml");
    std::fs::write(
        &global,
        format!(
            "federation = \"demo\"\nstrategy = \"fedomg\"\nrounds = {ROUNDS}\nmin_clients = 2\n\
             min_updates = 2\nround_timeout_s = 120\nstate_dir = \"state\"\n\n\
             [broker]\nhost = \"127.0.0.1\"\nport = {}\n\n\
             [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
             [auth]\nkeys_file = \"keys.toml\"\n",
            central.port()
        ),
    )
    .unwrap();
    let logs = |name: &str| root.join(format!("{name}.log"));
    let devices: Vec<KillOnDrop> = (devices.iter().enumerate())
        .map(|(i, p)| spawn(&edge, p, &logs(&format!("cam-{}", i + 1))))
        .collect();
    // Both cameras online at plant-7, then cam-2 is held: plant-7's rounds close at their
    // deadline with cam-1's update alone.
    let online = collect(
        bridged.port(),
        "online-watch",
        Duration::from_secs(120),
        |seen| {
            ["cam-1", "cam-2"]
                .iter()
                .all(|id| json(seen, &format!("fedge/plant-7/edge/{id}/status"))["online"] == true)
        },
    )
    .await;
    assert_eq!(
        json(&online, "fedge/plant-7/edge/cam-2/status")["online"],
        true,
        "{}",
        tail(&logs("cam-2"))
    );
    let signal = |name: &str| {
        let pid = devices[1].id().to_string();
        common::succeeded(Command::new("kill").args([name, &pid]));
    };
    signal("-STOP");
    let mut site7 = spawn(&coordinator, &plant7, &logs("plant-7"));
    let _site8 = spawn(&coordinator, &plant8, &logs("plant-8"));
    let mut global_run = spawn(&coordinator, &global, &logs("global"));

    // Round 2 open at plant-7 with cam-1's update in: its aggregator dies without a word and
    // comes back, and cam-2 goes on.
    let open = collect(
        bridged.port(),
        "kill-watch",
        Duration::from_secs(120),
        |seen| {
            let s = json(seen, "fedge/plant-7/coordinator/status");
            s["round"] == 2 && s["clients_reported"] == 1
        },
    )
    .await;
    let status = json(&open, "fedge/plant-7/coordinator/status");
    assert_eq!(
        (&status["round"], &status["clients_reported"]),
        (&Value::from(2), &Value::from(1)),
        "plant-7 never had round 2 half done: {status}\n{}",
        tail(&logs("plant-7"))
    );
    site7.0.kill().unwrap();
    site7.0.wait().unwrap();
    let _site7 = spawn(&coordinator, &plant7, &logs("plant-7-again"));
    signal("-CONT");

    let at_centre = collect(
        central.port(),
        "centre-watch",
        Duration::from_secs(240),
        |seen| json(seen, "fedge/demo/coordinator/status")["state"] == "finished",
    )
    .await;
    let finished = json(&at_centre, "fedge/demo/coordinator/status");
    assert_eq!(
        finished["state"],
        "finished",
        "{finished}\nglobal:\n{}\nplant-7 after the kill:\n{}\nplant-8:\n{}",
        tail(&logs("global")),
        tail(&logs("plant-7-again")),
        tail(&logs("plant-8"))
    );
    let status = global_run.0.wait().unwrap();
    assert!(status.success(), "global coordinator: {status}");
    let again = plain(&std::fs::read_to_string(logs("plant-7-again")).unwrap());
    assert!(
        again.contains("resuming the site's round") && again.contains("round=2 accepted=1"),
        "plant-7 did not resume round 2:\n{}",
        tail(&logs("plant-7-again"))
    );
    // The global federation saw two participants, the sites, and refused nothing of theirs.
    assert_eq!(finished["round"], ROUNDS, "{finished}");
    let rejected = &finished["rejected_updates"];
    assert!(
        rejected
            .as_object()
            .is_none_or(|r| r.values().all(|v| v == 0)),
        "{finished}"
    );
    for name in ["plant-7", "plant-8"] {
        let s = json(&at_centre, &format!("fedge/demo/edge/{name}/status"));
        assert_eq!(s["last_round"], ROUNDS, "{name}: {s}");
        assert_eq!(s["last_error"], "", "{name}: {s}");
        assert!(s["samples"].as_u64().unwrap_or(0) > 0, "{name}: {s}");
        assert!(s["tag"].is_string(), "the site's status is signed: {s}");
    }
    // Every device ends serving the last global model, relayed by its site.
    for (port, site, ids) in [
        (bridged.port(), "plant-7", &["cam-1", "cam-2"][..]),
        (direct.port(), "plant-8", &["cam-3"][..]),
    ] {
        let seen = collect(
            port,
            &format!("{site}-watch"),
            Duration::from_secs(30),
            |seen| {
                ids.iter().all(|id| {
                    json(seen, &format!("fedge/{site}/edge/{id}/status"))["model_round"] == ROUNDS
                })
            },
        )
        .await;
        for id in ids {
            let s = json(&seen, &format!("fedge/{site}/edge/{id}/status"));
            assert_eq!(s["model_round"], ROUNDS, "{id}: {s}");
            assert_eq!(s["last_error"], "", "{id}: {s}");
        }
        // The site's own topics never crossed its bridge.
        assert!(
            !at_centre
                .keys()
                .any(|t| t.starts_with(&format!("fedge/{site}/"))),
            "{site}'s topics reached the centre"
        );
    }
}

/// A site whose uplink is down when its round ends keeps its update and sends it when the link
/// returns, the global round being still open: the central broker dies (retained messages and
/// sessions lost) while the site's one device is held, the device then trains, the site
/// aggregates offline, and once the broker is back every round aggregates the site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_keeps_its_update_while_the_uplink_is_down() {
    let Some(mut central) = Mosquitto::start() else {
        return;
    };
    let at_site = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let logs = |name: &str| root.join(format!("{name}.log"));
    let camera = device(root, "plant-8", "cam-3", "rot30", at_site.port());
    let plant = site(root, "plant-8", 1, at_site.port(), Some(central.port()));
    let global = root.join("global.toml");
    std::fs::write(
        &global,
        format!(
            "federation = \"demo\"\nrounds = 2\nmin_clients = 1\nmin_updates = 1\n\
             round_timeout_s = 120\n\n[broker]\nhost = \"127.0.0.1\"\nport = {}\n\n\
             [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
             [auth]\nkeys_file = \"keys.toml\"\n",
            central.port()
        ),
    )
    .unwrap();
    let edge = common::coordinator_binary().with_file_name("fedge-edge");
    let coordinator = common::coordinator_binary();
    let cam = spawn(&edge, &camera, &logs("cam-3"));
    let online = collect(at_site.port(), "online", Duration::from_secs(120), |seen| {
        json(seen, "fedge/plant-8/edge/cam-3/status")["online"] == true
    })
    .await;
    assert_eq!(
        json(&online, "fedge/plant-8/edge/cam-3/status")["online"],
        true
    );
    let pid = cam.id().to_string();
    common::succeeded(Command::new("kill").args(["-STOP", &pid]));
    let _site = spawn(&coordinator, &plant, &logs("plant-8"));
    let mut global_run = spawn(&coordinator, &global, &logs("global"));
    let open = collect(at_site.port(), "open", Duration::from_secs(60), |seen| {
        json(seen, "fedge/plant-8/coordinator/status")["clients_selected"] == 1
    })
    .await;
    let status = json(&open, "fedge/plant-8/coordinator/status");
    assert_eq!(status["round"], 1, "{status}\n{}", tail(&logs("plant-8")));
    // The uplink goes; the device trains meanwhile; the broker is back after 6 s.
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        common::succeeded(Command::new("kill").args(["-CONT", &pid]));
    });
    central.restart(Duration::from_secs(6));
    resume.join().unwrap();
    let at_centre = collect(central.port(), "centre", Duration::from_secs(120), |seen| {
        json(seen, "fedge/demo/coordinator/status")["state"] == "finished"
    })
    .await;
    let finished = json(&at_centre, "fedge/demo/coordinator/status");
    assert_eq!(
        finished["state"],
        "finished",
        "{finished}\n{}",
        tail(&logs("plant-8"))
    );
    assert!(global_run.0.wait().unwrap().success());
    let log = plain(&std::fs::read_to_string(logs("plant-8")).unwrap());
    let at = |text: &str| {
        log.find(text)
            .unwrap_or_else(|| panic!("no {text:?} in\n{log}"))
    };
    // Lost the uplink, then the site's round 1 ended, then its update went up.
    let lost = at("lost the upstream broker");
    let ended = at("round ended round=1 aggregated=true");
    let sent = at("site update sent upstream round=1");
    assert!(lost < ended && ended < sent, "{log}");
    drop(cam);
}

/// `fedge demo --sites 3`: three sites on their own embedded brokers, with keys; the global
/// coordinator's clients are the sites, and the JSON says what each site holds.
#[test]
fn the_demo_runs_its_devices_behind_sites() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sites.json");
    common::succeeded(
        Command::new(env!("CARGO_BIN_EXE_fedge"))
            .args(["demo", "--sites", "3", "--clients", "5", "--rounds", "2"])
            .args(["--auth", "--strategy", "fedomg", "--quiet", "--json"])
            .arg(&json),
    );
    let result: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rounds = result["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{result}");
    for row in rounds {
        assert_eq!(row["clients"], 3, "three sites answer each round: {row}");
        let gamma = row["gamma"].as_object().unwrap();
        assert_eq!(gamma.len(), 3, "FedOMG weighs the sites: {row}");
    }
    assert!(
        result["final_target_accuracy"].as_f64().is_some(),
        "{result}"
    );
    assert!(
        result["rejected"].as_object().unwrap().is_empty(),
        "{result}"
    );
    let sites = result["sites"].as_object().unwrap();
    let devices: Vec<u64> = ["site-rot0-rot45", "site-rot15-rot60", "site-rot30"]
        .iter()
        .map(|s| sites[*s]["devices"].as_u64().unwrap())
        .collect();
    assert_eq!(devices, [2, 2, 1], "{result}");
    for site in sites.values() {
        assert!(site["samples"].as_u64().unwrap() > 0, "{site}");
        assert!(site["gamma"].as_f64().is_some(), "{site}");
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_fedge"))
        .args(["demo", "--sites", "3", "--objective", "feddim", "--quiet"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("FedDIM"), "{said}");
}
