//! The audit trail of a real coordinator binary: a short federation against mosquitto, then
//! `fedge-coordinator audit verify` on the untouched trail, on one rewritten whole (alone and
//! against the head the retained status carried) and on an edited one, and
//! `fedge-coordinator audit show` asked which release a device served and who built it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fedge_models::{HeadConfig, ModelLayout};
use fedge_wire::{DeviceKey, Topics};
use rumqttc::{AsyncClient, MqttOptions, QoS};

use crate::common;

const DEVICES: [&str; 3] = ["d1", "d2", "d3"];
const FEDERATION: &str = "audit";

fn key(device: &str) -> DeviceKey {
    DeviceKey::from_bytes([device.as_bytes()[1]; 32])
}

fn sealed(device: &str, round: u64, run: u64) -> Vec<u8> {
    let m = ModelLayout::new(HeadConfig::new(4, 2).with_hidden(3), false).num_params();
    let base = device.as_bytes()[1] as f32 * 0.01;
    let delta: Vec<f32> = (0..m).map(|i| base * ((i % 5) as f32 - 2.0)).collect();
    let frame = common::update_frame(fedge_wire::ClientUpdate {
        run,
        ..common::client_update(round, device, round, 10, &delta)
    });
    fedge_wire::seal(frame, &[(device, &key(device))])
}

/// The trail at `path` rewritten with its first release credited to d1 alone, every line's
/// `prev` and `hash` recomputed (written again, line by line, by the coordinator's own
/// writer): what anyone who can write the state folder can do.
fn rewrite(path: &Path) {
    use fedge_coordinator::store::audit::{AuditLog, Entry, Event};
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::remove_file(path).unwrap();
    let mut writer = AuditLog::new(path);
    let mut edited = false;
    for line in text.lines() {
        let mut entry: Entry = serde_json::from_str(line).unwrap();
        if let (false, Event::Released { built_by, .. }) = (edited, &mut entry.event) {
            *built_by = vec!["d1".into()];
            edited = true;
        }
        writer.append(&entry.at, &entry.who, &entry.event).unwrap();
    }
    assert!(edited, "the trail has a release");
}

fn audit(args: &[&str], state: &Path) -> std::process::Output {
    Command::new(common::coordinator_binary())
        .arg("audit")
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_verify_and_show_answer_for_a_real_federation() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keys: String = DEVICES
        .iter()
        .map(|d| format!("{d} = \"{}\"\n", key(d).to_hex()))
        .collect();
    common::write_private(&dir.path().join("devices.toml"), keys);
    let config = dir.path().join("coordinator.toml");
    let port = mosquitto.port();
    std::fs::write(
        &config,
        format!(
            "federation = \"{FEDERATION}\"\nstrategy = \"fedavg\"\nrounds = 2\nmin_clients = 3\n\
             min_updates = 3\nround_timeout_s = 60\nseed = 7\nstate_dir = \"state\"\n\n\
             [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n[head]\nfeatures = 4\nhidden = 3\n\
             classes = 2\n\n[auth]\nkeys_file = \"devices.toml\"\n"
        ),
    )
    .unwrap();
    let topics = Topics::new(FEDERATION).unwrap();
    let status_topic = topics.coordinator_status();
    let mut options = MqttOptions::new("devices", "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(options, 64);
    for topic in [status_topic.clone(), topics.round_task()] {
        client.subscribe(topic, QoS::AtLeastOnce).await.unwrap();
    }
    for d in DEVICES {
        let json = common::signed_status_json(FEDERATION, d, true, &key(d));
        let topic = topics.edge_status(d);
        client
            .publish(topic, QoS::AtLeastOnce, true, json)
            .await
            .unwrap();
    }
    let mut coordinator = common::KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let run = common::wait_task(&mut events, &topics.round_task())
        .await
        .run;
    for round in 1..=2 {
        if round == 2 {
            common::wait_status(&mut events, &status_topic, |s| s.round == 2).await;
        }
        for d in DEVICES {
            let topic = topics.update(d);
            let payload = sealed(d, round, run);
            client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await
                .unwrap();
        }
    }
    let finished = common::wait_status(&mut events, &status_topic, |s| s.state == "finished").await;
    let exit = tokio::task::spawn_blocking(move || coordinator.0.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "coordinator exited with {exit}");

    let state = dir.path().join("state");
    let verified = audit(&["verify"], &state);
    let stdout = String::from_utf8_lossy(&verified.stdout);
    assert!(
        verified.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(stdout.contains("3 line(s) verified"), "{stdout}");
    // The status carried the head as it stood: the anchor kept off the coordinator's machine.
    let head = finished
        .audit_head
        .expect("the finished status names the audit head");
    let anchor = format!("{}:{}", head.seq, head.sha256);
    assert!(stdout.contains(&format!("head {anchor}")), "{stdout}");
    assert!(
        stdout.contains("not checked without an anchored head"),
        "{stdout}"
    );
    let anchored = audit(&["verify", "--head", &anchor], &state);
    assert!(
        anchored.status.success(),
        "{}",
        String::from_utf8_lossy(&anchored.stderr)
    );

    // The release devices were served after the run: the one in model.bin, built by all three.
    let released = match fedge_wire::decode(&std::fs::read(state.join("model.bin")).unwrap()) {
        Ok(fedge_wire::Message::Model(release)) => release,
        other => panic!("model.bin: {other:?}"),
    };
    let now = fedge_mqtt::now_rfc3339();
    let shown = audit(&["show", "--device", "d2", "--at", &now, "--json"], &state);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let release = &answer["release"];
    assert_eq!(release["sha256"], fedge_wire::hex::encode(&released.sha256));
    assert_eq!(release["round"], 2);
    assert_eq!(release["built_by"], serde_json::json!(DEVICES));
    // Before the run, no release was served.
    let earlier = "2000-01-01T00:00:00Z";
    let shown = audit(
        &["show", "--device", "d2", "--at", earlier, "--json"],
        &state,
    );
    let answer: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(answer["release"], serde_json::Value::Null);

    // The whole file rewritten, the first release credited to d1 alone and every line
    // recomputed: the chain alone holds; against the status's head it fails at that line.
    let trail = state.join("audit.jsonl");
    let text = std::fs::read_to_string(&trail).unwrap();
    rewrite(&trail);
    assert_ne!(std::fs::read_to_string(&trail).unwrap(), text);
    let alone = audit(&["verify"], &state);
    assert!(
        alone.status.success(),
        "{}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let refused = audit(&["verify", "--head", &anchor], &state);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("line {} ", head.seq))
            && stderr.contains(&head.sha256)
            && stderr.contains("rewritten"),
        "{stderr}"
    );
    std::fs::write(&trail, &text).unwrap();

    // One byte of the first release's line edited: verify fails and names the line.
    let line = text
        .lines()
        .position(|l| l.contains("\"released\""))
        .unwrap()
        + 1;
    let edited = text.replacen("\"round\":1", "\"round\":7", 1);
    assert_ne!(edited, text);
    std::fs::write(&trail, edited).unwrap();
    let refused = audit(&["verify"], &state);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("line {line} ")) && stderr.contains("edited"),
        "{stderr}"
    );
    // And show refuses to answer from it.
    let shown = audit(&["show", "--device", "d2", "--at", &now], &state);
    assert_eq!(shown.status.code(), Some(1));
}
