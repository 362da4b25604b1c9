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
//!
//! The flow runs twice: over a mosquitto that lets every client do anything, and over the
//! documented set-up (`deploy/mosquitto/fedge.conf` and the shipped `fedge.acl` as they are,
//! TLS, a certificate per client whose name is its user name), where each piece has only its
//! own rights: the devices theirs, the coordinator its certificate's, `ctl` the operator's, and
//! the test's watcher a dashboard's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fedge_mqtt::{BrokerConfig, TlsSettings};
use fedge_wire::{CoordinatorStatus, EdgeStatus, HeadConfig, RoundTask, Topics};
use rumqttc::{AsyncClient, Event, EventLoop, Packet, QoS, SubscribeReasonCode};

use crate::broker_hardening::mosquitto::Broker;
use crate::common::{self, KillOnDrop};
use crate::use_model::{edge_binary, spawn};

const AGENTS: [&str; 3] = ["site-a", "site-b", "judge"];
/// The test's device, which sends the label flip (a valid identity: under the ACL, a
/// certificate of its own).
const INSIDER: &str = "insider";
/// Who follows the statuses and the round tasks for the test: a dashboard, whose rights the
/// shipped ACL gives (read the statuses; the round task through the device patterns).
const WATCHER: &str = "fedge-dashboard";
/// Who runs `ctl` under the ACL (with the coordinator's certificate, the broker would give it
/// the coordinator's client id and push the coordinator off).
const OPERATOR: &str = "fedge-operator";

/// How the pieces reach the broker, and the folder they run in.
struct Net {
    /// The federation's name (under the shipped ACL, the one it is written for).
    federation: &'static str,
    /// The broker's loopback port.
    port: u16,
    /// TLS with a certificate per client (`ca.pem`, `<name>.pem`, `<name>.key` in `root`),
    /// as the documented broker requires; plain MQTT otherwise.
    tls: bool,
    /// The test's folder: configurations, state, caches (and certificates).
    root: PathBuf,
}

impl Net {
    fn topics(&self) -> Topics {
        Topics::new(self.federation).unwrap()
    }

    /// The `[broker]` tables of the configuration file of `name` (its certificate's common
    /// name), which sits in `root`.
    fn broker_toml(&self, name: &str) -> String {
        let mut text = format!("[broker]\nhost = \"127.0.0.1\"\nport = {}\n", self.port);
        if self.tls {
            text.push_str(&format!(
                "\n[broker.tls]\nca_file = \"ca.pem\"\nclient_cert = \"{name}.pem\"\n\
                 client_key = \"{name}.key\"\n"
            ));
        }
        text
    }

    /// Client settings for the test's own client `name`.
    fn broker(&self, name: &str) -> BrokerConfig {
        let tls = self.tls.then(|| {
            let file = |f: String| self.root.join(f);
            let client = (file(format!("{name}.pem")), file(format!("{name}.key")));
            TlsSettings::with_files(file("ca.pem".into()), Some(client)).unwrap()
        });
        BrokerConfig {
            tls,
            ..BrokerConfig::at("127.0.0.1", self.port)
        }
    }

    /// `ctl`'s login when the broker takes identities from certificates: the operator's own
    /// (relative to `root`, ctl's working folder); none otherwise (the configuration's).
    fn ctl_login(&self) -> Vec<String> {
        if !self.tls {
            return Vec::new();
        }
        let url = format!("mqtts://127.0.0.1:{}", self.port);
        let (cert, key) = (format!("{OPERATOR}.pem"), format!("{OPERATOR}.key"));
        [
            "--broker",
            &url,
            "--ca-file",
            "ca.pem",
            "--cert",
            &cert,
            "--key",
            &key,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// What the broker refused (the documented broker logs into `root`), for a failure's
    /// message.
    fn denied(&self) -> String {
        let log = std::fs::read_to_string(self.root.join("mosquitto.log")).unwrap_or_default();
        let denied: Vec<&str> = (log.lines())
            .filter(|l| l.to_ascii_lowercase().contains("denied"))
            .collect();
        denied[denied.len().saturating_sub(20)..].join("\n")
    }
}

fn head() -> HeadConfig {
    HeadConfig::new(512, 10).with_hidden(16)
}

/// `params` with the classifier's columns (and biases) moved by `by` classes: what the head
/// said of class `k + by` it now says of class `k`.
pub(crate) fn rotated(head: &HeadConfig, params: &[f32], by: usize) -> Vec<f32> {
    let k = head.classes;
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

/// The coordinator's configuration (returned) and the agents' profiles, in `net.root`.
fn write_configs(net: &Net) -> PathBuf {
    let (root, federation) = (net.root.as_path(), net.federation);
    let classes: String = (0..10).map(|k| format!("{k}\n")).collect();
    std::fs::write(root.join("classes.txt"), classes).unwrap();
    let operator = fedge_wire::DeviceKey::from_bytes([9; 32]).to_hex();
    common::write_private(&root.join("operator.key"), format!("{operator}\n"));
    let broker = net.broker_toml(&format!("fedge-coordinator-{federation}"));
    let config = format!(
        "federation = \"{federation}\"\nrounds = 8\nstay_up = true\nmin_clients = 3\n\
         min_updates = 3\nround_timeout_s = 60\nstate_dir = \"state\"\n\n\
         {broker}\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n\n\
         [train]\nlocal_epochs = 3\n\n\
         [release]\nmode = \"gated\"\nevaluators = [\"judge\"]\n\
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
        let broker = net.broker_toml(id);
        let profile = format!(
            "client_id = \"{id}\"\nfederation = \"{federation}\"\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache-{id}\"\nbackbone = {card:?}\n{extra}\n{broker}\n\
             [data]\nkind = \"digits\"\ndomain = \"{domain}\"\n"
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

/// The watcher's network loop: collects statuses and round tasks, has the insider answer each
/// task once the candidate before it is judged ([`answer`]), until `done` holds (at most
/// `within`).
async fn run_until(
    net: &Net,
    log: &Path,
    insider: &AsyncClient,
    events: &mut EventLoop,
    seen: &mut Seen,
    within: Duration,
    done: impl Fn(&Seen) -> bool,
) {
    let topics = net.topics();
    let start = Instant::now();
    let end = start + within;
    let mut tasks = fedge_wire::Reassembler::new(30_000, 64 << 20);
    while !done(seen) {
        let due = (seen.pending.as_ref()).is_some_and(|t| seen.judged(t.round - 1));
        if due && let Some(task) = seen.pending.take() {
            answer(insider, &topics, seen, task).await;
        }
        assert!(
            Instant::now() < end,
            "timed out; held {:?}, canaried {:?}, answered {:?}; coordinator log:\n{}\n\
             coordinator status: {:#?}\ndevices: {:#?}\nthe broker denied:\n{}",
            seen.held,
            seen.canaried,
            seen.answered,
            std::fs::read_to_string(log).unwrap_or_default(),
            seen.status,
            seen.devices,
            net.denied()
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
            let decoded = fedge_wire::decode_task(&mut tasks, &p.payload, now, INSIDER, None);
            let Ok(Some(task)) = decoded else {
                continue;
            };
            if !seen.answered.contains(&task.round) && task.selected.iter().any(|c| c == INSIDER) {
                seen.pending = Some(task);
            }
        }
    }
}

/// The insider's update for `task`: the label flip in round 3, no change otherwise.
async fn answer(client: &AsyncClient, topics: &Topics, seen: &mut Seen, task: RoundTask) {
    let params = task.params.to_vec();
    let target = match task.round {
        3 => rotated(&head(), &params, 1),
        _ => params.clone(),
    };
    // Three equal weights: three times the step lands the aggregate on the target.
    let delta: Vec<f32> = (target.iter().zip(&params))
        .map(|(t, p)| 3.0 * (t - p))
        .collect();
    let samples = seen.devices.get("site-a").map_or(300, |s| s.samples.max(1));
    let update = fedge_wire::ClientUpdate {
        run: task.run,
        ..common::client_update(task.round, INSIDER, task.round, samples, &delta)
    };
    client
        .publish(
            topics.update(INSIDER),
            QoS::AtLeastOnce,
            false,
            common::update_frame(update),
        )
        .await
        .unwrap();
    seen.answered.push(task.round);
}

/// The coordinator binary on `config`, its log (info) appended to `log`, killed on drop.
pub(crate) fn start_coordinator(config: &Path, log: &Path) -> KillOnDrop {
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
async fn rollback(net: &Net, config: &Path, round: u64) {
    let (config, root, login) = (config.to_owned(), net.root.clone(), net.ctl_login());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(common::coordinator_binary())
            .current_dir(root)
            .args(["ctl", "--config"])
            .arg(&config)
            .args(login)
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
    let dir = tempfile::tempdir().unwrap();
    let net = Net {
        federation: "releases",
        port: mosquitto.port(),
        tls: false,
        root: dir.path().to_owned(),
    };
    releases(&net).await;
}

/// The same flow through the documented broker: `deploy/mosquitto/fedge.conf` and the shipped
/// `fedge.acl` as they are (`Broker::documented` appends only a test-only reader the flow does
/// not use), TLS, and a certificate per client. Devices that cannot read the serving pointer
/// or the candidates never stage a canary, never score a candidate and never hear a rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_reach_every_device_under_the_shipped_acl_with_client_certificates() {
    if !crate::tls::has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    crate::tls::make_certificates(root);
    let federation = "site-1";
    let coordinator = format!("fedge-coordinator-{federation}");
    for name in AGENTS
        .into_iter()
        .chain([INSIDER, WATCHER, OPERATOR, coordinator.as_str()])
    {
        crate::tls::client_certificate(root, name);
    }
    let Some(broker) = Broker::documented(root) else {
        return;
    };
    let net = Net {
        federation,
        port: broker.port(),
        tls: true,
        root: root.to_owned(),
    };
    releases(&net).await;
}

/// A task polling a client's connection (which sends what the client publishes), stopped on
/// drop.
struct Polling(tokio::task::JoinHandle<()>);

impl Drop for Polling {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects client `name` and subscribes to `filters`, waiting (10 s at most) for the broker to
/// accept the connection and every filter.
async fn connect(net: &Net, name: &str, filters: &[String]) -> (AsyncClient, EventLoop) {
    let (client, mut events) = AsyncClient::new(net.broker(name).options(name, None), 64);
    for filter in filters {
        client
            .subscribe(filter.as_str(), QoS::AtLeastOnce)
            .await
            .unwrap();
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let (mut connected, mut acked) = (false, 0);
    while !connected || acked < filters.len() {
        match tokio::time::timeout_at(until, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => connected = true,
            Ok(Ok(Event::Incoming(Packet::SubAck(ack)))) => {
                let refused =
                    (ack.return_codes.iter()).any(|c| matches!(c, SubscribeReasonCode::Failure));
                assert!(
                    !refused,
                    "{name}: the broker refused a subscription to {filters:?}"
                );
                acked += 1;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("{name} cannot connect: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => panic!("{name}: no CONNACK or SUBACK within 10 s"),
        }
    }
    (client, events)
}

/// The whole flow over `net`: the coordinator binary, the agents, the insider and the watcher.
async fn releases(net: &Net) {
    let root = net.root.as_path();
    let config = write_configs(net);
    let topics = net.topics();

    // The watcher reads what a dashboard may: the statuses and (through the device patterns)
    // the round tasks, which the insider answers.
    let task = topics.round_task();
    let filters = [
        topics.coordinator_status(),
        topics.edge_status_filter(),
        format!("{task}/+"),
        task,
    ];
    let (_watcher, mut events) = connect(net, WATCHER, &filters).await;
    let (client, mut insider_events) = connect(net, INSIDER, &[]).await;
    let _insider = Polling(tokio::spawn(async move {
        loop {
            if insider_events.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }));
    let online = common::edge_status_json(INSIDER, true);
    client
        .publish(topics.edge_status(INSIDER), QoS::AtLeastOnce, true, online)
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

    // Candidate 3 held, with its numbers (the evaluation-only judge's scores: only it scores
    // a candidate); a later one through a canary to everyone; the run over and every agent
    // serving what the coordinator says is served.
    run_until(
        net,
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
    assert!(reason.contains("worse at 1 of 1 site"), "{reason}");
    let held_sha = held["sha256"].as_str().unwrap().to_owned();
    eprintln!("held: {held}");
    if let Some(seen_held) = &seen.held {
        assert_eq!(seen_held.candidate.sha256, held_sha);
    }
    // Half of the four online devices, raised to the three a canary stage needs at least
    // (one device's alarm alone never fails it), served it first.
    let (canaried, canary_devices) = seen.canaried.clone().unwrap();
    assert_eq!(canary_devices, 3, "{canaried:?}");
    let before = seen
        .before
        .clone()
        .expect("the release served during the canary");
    assert!(before.round < 3, "{before:?}");

    // ctl rollback: every device back to the release before, by its own status.
    rollback(net, &config, before.round).await;
    let started = Instant::now();
    run_until(
        net,
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
    rollback(net, &config, canaried.round).await;
    run_until(
        net,
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

    // At the end every device serves what the coordinator's status says is served.
    let status = seen.status.as_ref().and_then(|s| s.release.as_ref());
    let served = status
        .and_then(|r| r.serving.as_ref())
        .expect("a release served");
    assert!(
        seen.all_serve(&served.sha256),
        "{served:?}: {:#?}",
        seen.devices
    );
}
