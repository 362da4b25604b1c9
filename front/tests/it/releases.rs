//! Safe fleet releases, with every piece a separate process over mosquitto: the
//! `fedge-coordinator` binary in `gated` mode, two training `fedge-edge` agents, one
//! evaluation-only agent that scores candidates, and an insider (this test) with a valid
//! identity. In round 3 the insider sends a label flip (the classifier's columns rotated by one
//! class), three times the step that would land the aggregate on the flipped head; the norm
//! guard (at its default) scales it down to 10 × the honest median, and the round's aggregate
//! is still ≥ 10 points worse: it passes the update guards, and only the gate stands in its
//! way. Then the insider sends nothing that moves the model, and the honest devices train it
//! back over the next rounds.
//!
//! The gate holds candidate 3 and says so with its numbers; no device's serving log ever names
//! it; a later candidate is promoted, served first by a canary share, then by everyone; `ctl
//! rollback` brings every device back to the release served before that one, as each device's
//! own status says; after a restart of the coordinator, a rollback to the later release still
//! finds it; the audit trail verifies and records the verdicts and the rollbacks.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fedge_wire::{CoordinatorStatus, EdgeStatus, HeadConfig, RoundTask, Topics};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

use crate::common::{self, KillOnDrop};
use crate::use_model::{edge_binary, spawn};

const FEDERATION: &str = "releases";
const AGENTS: [&str; 3] = ["site-a", "site-b", "judge"];

fn head() -> HeadConfig {
    HeadConfig::new(512, 10).with_hidden(16)
}

/// `params` with the classifier's columns (and biases) moved by `by` classes: what the head
/// said of class `k + by` it now says of class `k`.
fn rotated(params: &[f32], by: usize) -> Vec<f32> {
    let head = head();
    let k = 10;
    let mut out = params.to_vec();
    let w = head.classifier_range();
    for row in params[w.clone()].chunks(k).enumerate() {
        for c in 0..k {
            out[w.start + row.0 * k + c] = row.1[(c + by) % k];
        }
    }
    let b = head.num_params() - k;
    for c in 0..k {
        out[b + c] = params[b + (c + by) % k];
    }
    out
}

fn write_configs(root: &Path, port: u16) -> std::path::PathBuf {
    let classes: String = (0..10).map(|k| format!("{k}\n")).collect();
    std::fs::write(root.join("classes.txt"), classes).unwrap();
    let operator = fedge_wire::DeviceKey::from_bytes([9; 32]).to_hex();
    common::write_private(&root.join("operator.key"), format!("{operator}\n"));
    let config = format!(
        "federation = \"{FEDERATION}\"\nrounds = 8\nstay_up = true\nmin_clients = 3\n\
         min_updates = 3\nround_timeout_s = 60\nstate_dir = \"state\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n\n\
         [train]\nlocal_epochs = 3\n\n\
         [release]\nmode = \"gated\"\nmargin_points = 10\nclass_drop_points = 100\n\
         canary_share = 0.5\n\
         canary_window_s = 3\ntimeout_s = 60\n\n\
         [auth]\noperator_key_file = \"operator.key\"\n"
    );
    let path = root.join("coordinator.toml");
    std::fs::write(&path, config).unwrap();
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    for (id, domain, extra) in [
        ("site-a", "rot0", ""),
        ("site-b", "rot15", ""),
        ("judge", "rot45", "role = \"evaluate\"\n"),
    ] {
        let profile = format!(
            "client_id = \"{id}\"\nfederation = \"{FEDERATION}\"\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache-{id}\"\nbackbone = {card:?}\n{extra}\n[broker]\n\
             host = \"127.0.0.1\"\nport = {port}\n\n[data]\nkind = \"digits\"\n\
             domain = \"{domain}\"\n"
        );
        std::fs::write(root.join(format!("{id}.toml")), profile).unwrap();
    }
    path
}

/// What the test saw on the broker.
#[derive(Default)]
struct Seen {
    status: Option<CoordinatorStatus>,
    devices: BTreeMap<String, EdgeStatus>,
    /// Rounds whose task the insider answered.
    answered: Vec<u64>,
    /// Candidate 3's verdict, if a status showed it held.
    held: Option<fedge_wire::GateVerdict>,
    /// The first release after round 3 seen in a canary stage, with its devices.
    canaried: Option<(fedge_wire::ReleaseRef, u32)>,
    /// The release served while it was in its canary stage.
    before: Option<fedge_wire::ReleaseRef>,
    /// A round task the insider answers once the candidate before it is judged.
    pending: Option<RoundTask>,
}

impl Seen {
    /// Whether the gate has judged candidate `round` (the insider holds each round open until
    /// the one before is judged: a candidate superseded while it waits is never judged, and
    /// rounds here are much faster than the gate).
    fn judged(&self, round: u64) -> bool {
        let release = self.status.as_ref().and_then(|s| s.release.as_ref());
        round == 0
            || release.is_some_and(|r| {
                r.gate.as_ref().is_some_and(|g| {
                    g.candidate.round >= round && g.outcome != fedge_wire::GateOutcome::Waiting
                }) && r.canary.is_none()
            })
    }

    /// Whether every agent's own status says it serves `sha`.
    fn all_serve(&self, sha: &str) -> bool {
        (AGENTS.iter()).all(|a| {
            self.devices
                .get(*a)
                .is_some_and(|s| s.serving.as_deref() == Some(sha))
        })
    }
}

/// The insider's network loop: answers each round task once the candidate before it is judged
/// ([`answer`]), collects statuses, until `done` holds (at most `within`).
async fn run_until(
    log: &Path,
    client: &AsyncClient,
    events: &mut rumqttc::EventLoop,
    seen: &mut Seen,
    within: Duration,
    done: impl Fn(&Seen) -> bool,
) {
    let topics = Topics::new(FEDERATION).unwrap();
    let start = Instant::now();
    let end = start + within;
    let mut tasks = fedge_wire::Reassembler::new(30_000, 64 << 20);
    while !done(seen) {
        let due = (seen.pending.as_ref()).is_some_and(|t| seen.judged(t.round - 1));
        if due && let Some(task) = seen.pending.take() {
            answer(client, &topics, seen, task).await;
        }
        assert!(
            Instant::now() < end,
            "timed out; held {:?}, canaried {:?}, answered {:?}; coordinator log:\n{}\n\
             coordinator status: {:#?}\ndevices: {:#?}",
            seen.held,
            seen.canaried,
            seen.answered,
            std::fs::read_to_string(log).unwrap_or_default(),
            seen.status,
            seen.devices
        );
        let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(500), events.poll()).await
        else {
            continue;
        };
        let Event::Incoming(Packet::Publish(p)) = event else {
            continue;
        };
        if p.topic == topics.coordinator_status() {
            let Ok(status) = serde_json::from_slice::<CoordinatorStatus>(&p.payload) else {
                continue;
            };
            if let Some(release) = &status.release {
                if let Some(gate) = &release.gate
                    && gate.candidate.round == 3
                    && gate.outcome == fedge_wire::GateOutcome::Held
                {
                    seen.held = Some(gate.clone());
                }
                if let Some(canary) = &release.canary
                    && canary.round > 3
                    && seen.canaried.is_none()
                {
                    seen.canaried = Some((canary.clone(), release.canary_devices));
                    seen.before.clone_from(&release.serving);
                }
            }
            seen.status = Some(status);
        } else if let Some(device) = topics.client_of_edge_status(&p.topic) {
            if let Ok(status) = serde_json::from_slice::<EdgeStatus>(&p.payload) {
                seen.devices.insert(device.to_owned(), status);
            }
        } else if p.topic.starts_with(&topics.round_task()) {
            // Chunked when large (the pooled feature summary rides along).
            let now = Instant::now().duration_since(start).as_millis() as u64;
            let decoded = fedge_wire::decode_task(&mut tasks, &p.payload, now, "insider", None);
            let Ok(Some(task)) = decoded else {
                continue;
            };
            if !seen.answered.contains(&task.round) && task.selected.iter().any(|c| c == "insider")
            {
                seen.pending = Some(task);
            }
        }
    }
}

/// The insider's update for `task`: the label flip in round 3, no change otherwise.
async fn answer(client: &AsyncClient, topics: &Topics, seen: &mut Seen, task: RoundTask) {
    let params = task.params.to_vec();
    let target = match task.round {
        3 => rotated(&params, 1),
        _ => params.clone(),
    };
    // Three equal weights: three times the step lands the aggregate on the target.
    let delta: Vec<f32> = (target.iter().zip(&params))
        .map(|(t, p)| 3.0 * (t - p))
        .collect();
    let samples = seen.devices.get("site-a").map_or(300, |s| s.samples.max(1));
    let update = fedge_wire::ClientUpdate {
        run: task.run,
        ..common::client_update(task.round, "insider", task.round, samples, &delta)
    };
    client
        .publish(
            topics.update("insider"),
            QoS::AtLeastOnce,
            false,
            common::update_frame(update),
        )
        .await
        .unwrap();
    seen.answered.push(task.round);
}

/// The coordinator binary on `config`, its log (info) appended to `log`, killed on drop.
fn start_coordinator(config: &Path, log: &Path) -> KillOnDrop {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap(),
    )
}

/// `ctl rollback ROUND`, which must succeed (it waits for the coordinator's status).
async fn rollback(config: &Path, round: u64) {
    let config = config.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(common::coordinator_binary())
            .args(["ctl", "--config"])
            .arg(&config)
            .args(["rollback", &round.to_string()])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regressed_candidate_is_held_a_good_one_canaried_and_a_rollback_reaches_every_device() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = write_configs(root, port);

    let mut options = MqttOptions::new("insider", "127.0.0.1", port);
    options.set_max_packet_size(4 << 20, 4 << 20);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(options, 64);
    let topics = Topics::new(FEDERATION).unwrap();
    client
        .subscribe(format!("fedge/{FEDERATION}/#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    let online = common::edge_status_json("insider", true);
    client
        .publish(
            topics.edge_status("insider"),
            QoS::AtLeastOnce,
            true,
            online,
        )
        .await
        .unwrap();

    // The coordinator's log (info: candidates, verdicts, promotions) is printed on a failure.
    let log = root.join("coordinator.log");
    let coordinator = start_coordinator(&config, &log);
    let _agents: Vec<KillOnDrop> = (AGENTS.iter())
        .map(|a| {
            spawn(
                &edge_binary(),
                &["run", "--config"],
                &root.join(format!("{a}.toml")),
            )
        })
        .collect();
    let mut seen = Seen::default();

    // Candidate 3 held, with its numbers; a later one through a canary to everyone; the run
    // over and every agent serving what the coordinator says is served.
    run_until(
        &log,
        &client,
        &mut events,
        &mut seen,
        Duration::from_secs(240),
        |s| {
            let Some(status) = &s.status else {
                return false;
            };
            let Some(release) = &status.release else {
                return false;
            };
            let settled = status.state == "finished" && release.canary.is_none();
            let served = release
                .serving
                .as_ref()
                .is_some_and(|r| s.all_serve(&r.sha256));
            settled && served && s.canaried.is_some()
        },
    )
    .await;
    // The verdict on candidate 3, from the trail (the status shows only the latest verdict,
    // and rounds here are faster than its 0.5 s pace).
    let state = root.join("state");
    let read_trail = || std::fs::read_to_string(state.join("audit.jsonl")).unwrap();
    let held: serde_json::Value = (read_trail().lines())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["event"] == "gate-verdict" && l["round"] == 3)
        .expect("a verdict on candidate 3");
    assert_eq!(held["passed"], false, "{held}");
    let (candidate, serving) = (
        held["candidate_accuracy"].as_f64().unwrap(),
        held["serving_accuracy"].as_f64().unwrap(),
    );
    assert!(
        candidate + 10.0 <= serving,
        "the flipped round is not 10 points worse: {held}"
    );
    let reason = held["reason"].as_str().unwrap();
    assert!(reason.contains("mean accuracy"), "{reason}");
    let held_sha = held["sha256"].as_str().unwrap().to_owned();
    eprintln!("held: {held}");
    if let Some(seen_held) = &seen.held {
        assert_eq!(seen_held.candidate.sha256, held_sha);
    }
    // Half of the four online devices served it first.
    let (canaried, canary_devices) = seen.canaried.clone().unwrap();
    assert_eq!(canary_devices, 2, "{canaried:?}");
    let before = seen
        .before
        .clone()
        .expect("the release served during the canary");
    assert!(before.round < 3, "{before:?}");

    // ctl rollback: every device back to the release before, by its own status.
    rollback(&config, before.round).await;
    let started = Instant::now();
    run_until(
        &log,
        &client,
        &mut events,
        &mut seen,
        Duration::from_secs(30),
        |s| {
            let pinned = (s.status.as_ref().and_then(|c| c.release.as_ref()))
                .is_some_and(|r| r.pinned && r.serving.as_ref() == Some(&before));
            pinned && s.all_serve(&before.sha256)
        },
    )
    .await;
    eprintln!("every device rolled back in {:?}", started.elapsed());

    // No device ever served the held candidate; each went back last.
    for agent in AGENTS {
        let log = root.join(format!("cache-{agent}/{agent}.serving.jsonl"));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains(&held_sha), "{agent}: {text}");
        let last = text.lines().last().unwrap();
        assert!(last.contains(&before.sha256), "{agent}: {text}");
    }

    // A restart keeps what a rollback needs: the kept releases come back from the state
    // folder, and every device goes forward again to the release it left.
    drop(coordinator);
    let _coordinator = start_coordinator(&config, &log);
    rollback(&config, canaried.round).await;
    run_until(
        &log,
        &client,
        &mut events,
        &mut seen,
        Duration::from_secs(60),
        |s| {
            let pinned = (s.status.as_ref().and_then(|c| c.release.as_ref()))
                .is_some_and(|r| r.pinned && r.serving.as_ref() == Some(&canaried));
            pinned && s.all_serve(&canaried.sha256)
        },
    )
    .await;

    // The trail holds the verdicts and the rollback, and verifies.
    let trail = read_trail();
    for event in [
        "\"gate-verdict\"",
        "\"promoted\"",
        "\"rollout\"",
        "\"rollback\"",
    ] {
        assert!(trail.contains(event), "no {event} in the trail:\n{trail}");
    }
    // Which release site-a serves now, and who built it (a gated release is promoted rounds
    // after its own: its builders are still named).
    let now = fedge_mqtt::now_rfc3339();
    let shown = Command::new(common::coordinator_binary())
        .args([
            "audit",
            "show",
            "--device",
            "site-a",
            "--at",
            &now,
            "--json",
            "--state-dir",
        ])
        .arg(&state)
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&shown.stderr)));
    assert_eq!(answer["release"]["sha256"], canaried.sha256, "{answer}");
    let built_by = answer["release"]["built_by"].as_array().unwrap();
    assert!(built_by.iter().any(|c| c == "site-a"), "{answer}");
    let verified = Command::new(common::coordinator_binary())
        .args(["audit", "verify", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
}
