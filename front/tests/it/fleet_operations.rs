//! A fleet operator's day, as the operator runs it: a kit from `fedge-coordinator provision`
//! (TLS, a certificate per client, the shipped ACL, device keys, the operator key), mosquitto
//! started with the kit's `fedge.conf`, a `stay_up` coordinator releasing through the gate,
//! two training agents, an evaluation site and, for one run, an insider with a valid identity
//! (the norm guard off, `max_norm_ratio = 0`, so that one insider can make a candidate bad
//! enough for the gate to hold; the guard has tests of its own).
//!
//! 1. Run 1 finishes; the coordinator is stopped (SIGTERM) and started again.
//! 2. `ctl new-run`: a run number never used before. `kill -9` before the new run's first
//!    aggregation (one update journaled, the other device held back): the restarted
//!    coordinator resumes that round of that run, and the late update closes it.
//! 3. `kill -9` after the run's first aggregation: it goes on to the end of the run.
//! 4. The evaluation site and a training device restart.
//! 5. A run in which the insider flips labels: the gate holds the candidate (judged by the
//!    restarted evaluation site against a coordinator that restarted twice).
//! 6. `ctl rollback`, then a run whose candidate waits behind the pin, and `ctl promote`.
//!
//! At the end every device serves what the coordinator says it serves, no update was
//! refused as a replay, stale or unselected, none was counted twice, nobody rests, and the
//! audit trail verifies and names the runs, the verdict, the rollback and who serves what.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fedge_mqtt::{BrokerConfig, TlsSettings};
use fedge_wire::{CoordinatorStatus, DeviceKey, EdgeStatus, HeadConfig, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};

use crate::common::{self, KillOnDrop};
use crate::use_model::{edge_binary, spawn};

const FEDERATION: &str = "fleet-ops";
const TRAINERS: [&str; 2] = ["cam-01", "cam-02"];
const JUDGE: &str = "judge";
const INSIDER: &str = "insider";

fn head() -> HeadConfig {
    HeadConfig::new(512, 10).with_hidden(64)
}

/// What the dashboard's subscription saw, and whether the insider answers tasks now.
#[derive(Default)]
struct Seen {
    status: Option<CoordinatorStatus>,
    devices: BTreeMap<String, EdgeStatus>,
    /// The insider answers the tasks that select it with a label flip.
    poison: bool,
    /// Rounds the insider answered.
    answered: Vec<u64>,
}

impl Seen {
    fn serving(&self) -> Option<String> {
        let release = self.status.as_ref()?.release.as_ref()?;
        Some(release.serving.as_ref()?.sha256.clone())
    }

    /// Whether each agent's own status says it serves what the coordinator says is served.
    fn all_serve_what_is_served(&self) -> bool {
        let Some(sha) = self.serving() else {
            return false;
        };
        (TRAINERS.iter().chain([&JUDGE])).all(|d| {
            (self.devices.get(*d)).is_some_and(|s| s.online && s.serving.as_deref() == Some(&sha))
        })
    }

    fn state(&self) -> (&str, u64, u32) {
        self.status.as_ref().map_or(("", 0, 0), |s| {
            (s.state.as_str(), s.round, s.clients_reported)
        })
    }
}

struct Fleet {
    root: PathBuf,
    kit: PathBuf,
    port: u16,
    coordinator: Option<KillOnDrop>,
    agents: BTreeMap<&'static str, KillOnDrop>,
    seen: Arc<Mutex<Seen>>,
    insider_key: DeviceKey,
}

impl Fleet {
    fn config(&self) -> PathBuf {
        self.kit.join("coordinator/coordinator.toml")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("coordinator.log")).unwrap_or_default()
    }

    fn start_coordinator(&mut self) {
        let log = self.root.join("coordinator.log");
        self.coordinator = Some(crate::releases::start_coordinator(&self.config(), &log));
    }

    /// SIGTERM, as systemd stops it, and the process gone.
    fn stop_coordinator(&mut self) {
        let mut child = self.coordinator.take().expect("running");
        let pid = child.id().to_string();
        common::succeeded(Command::new("kill").args(["-TERM", &pid]));
        let until = Instant::now() + Duration::from_secs(20);
        while child.0.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < until,
                "the coordinator did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9.
    fn kill_coordinator(&mut self) {
        let mut child = self.coordinator.take().expect("running");
        child.0.kill().unwrap();
        child.0.wait().unwrap();
    }

    fn start_agent(&mut self, device: &'static str) {
        let profile = self.kit.join(format!("devices/{device}/profile.toml"));
        let agent = spawn(&edge_binary(), &["run", "--config"], &profile);
        self.agents.insert(device, agent);
    }

    fn signal_agent(&self, device: &str, signal: &str) {
        let pid = self.agents[device].id().to_string();
        common::succeeded(Command::new("kill").args([signal, &pid]));
    }

    /// `ctl` with the operator's own certificate, as the kit's README says.
    fn ctl(&self, args: &[&str]) -> Output {
        let url = format!("mqtts://localhost:{}", self.port);
        let operator = |f: &str| self.kit.join("operator").join(f);
        Command::new(common::coordinator_binary())
            .args(["ctl", "--wait", "20", "--config"])
            .arg(self.config())
            .args(["--broker", &url, "--ca-file"])
            .arg(operator("ca.pem"))
            .arg("--cert")
            .arg(operator("fedge-operator.pem"))
            .arg("--key")
            .arg(operator("fedge-operator.key"))
            .args(args)
            .output()
            .unwrap()
    }

    /// `ctl` that must succeed: the status it printed.
    fn ctl_ok(&self, args: &[&str]) -> CoordinatorStatus {
        let out = self.ctl(args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "ctl {args:?}: {stdout}{stderr}\n{}",
            self.log()
        );
        serde_json::from_str(&stdout).unwrap()
    }

    /// Waits (at most `within`) until `done` holds of what the dashboard saw.
    fn wait(&self, what: &str, within: Duration, done: impl Fn(&Seen) -> bool) {
        let until = Instant::now() + within;
        loop {
            let failure = {
                let seen = self.seen.lock().unwrap();
                if done(&seen) {
                    return;
                }
                (Instant::now() > until).then(|| {
                    format!(
                        "timed out waiting for {what}; status: {:#?}\ndevices: {:#?}",
                        seen.status, seen.devices
                    )
                })
            };
            // Not while holding the lock the watcher needs.
            if let Some(failure) = failure {
                panic!("{failure}\ncoordinator log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn status(&self) -> CoordinatorStatus {
        (self.seen.lock().unwrap().status.clone()).expect("a status")
    }

    /// The insider's retained status, signed with its device key: online (selected in the
    /// next rounds) or offline.
    async fn insider_online(&self, client: &AsyncClient, online: bool) {
        let mut status = EdgeStatus {
            client_id: INSIDER.into(),
            online,
            samples: 300,
            updated_at: fedge_mqtt::now_rfc3339(),
            ..EdgeStatus::default()
        };
        status.sign(FEDERATION, &self.insider_key);
        let topic = Topics::new(FEDERATION).unwrap().edge_status(INSIDER);
        let json = serde_json::to_vec(&status).unwrap();
        client
            .publish(topic, QoS::AtLeastOnce, true, json)
            .await
            .unwrap();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A client of the kit: `folder/stem.pem` and `.key` with the folder's `ca.pem`.
fn kit_client(kit: &Path, port: u16, folder: &str, stem: &str) -> BrokerConfig {
    let file = |name: String| kit.join(folder).join(name);
    let client = (file(format!("{stem}.pem")), file(format!("{stem}.key")));
    let tls = TlsSettings::with_files(file("ca.pem".into()), Some(client)).unwrap();
    BrokerConfig {
        tls: Some(tls),
        ..BrokerConfig::at("localhost", port)
    }
}

/// The kit, with the coordinator's configuration for this fleet and the devices' data.
fn provision(root: &Path, port: u16) -> PathBuf {
    let kit = root.join("kit");
    let config = root.join("coordinator.toml");
    let classes: Vec<String> = (0..10).map(|k| format!("\"{k}\"")).collect();
    std::fs::write(
        &config,
        format!(
            "federation = \"{FEDERATION}\"\nrounds = 2\nstay_up = true\nfraction = 1.0\n\
             min_clients = 2\nmin_updates = 2\nround_timeout_s = 60\nmax_missed_rounds = 3\n\
             max_norm_ratio = 0.0\n\
             state_dir = \"state\"\n\n[broker]\nhost = \"127.0.0.1\"\nport = 1883\n\n\
             [head]\nfeatures = 512\nhidden = 64\nclasses = 10\n\n\
             [model]\nclasses = [{}]\nbackbone = \"digits-conv\"\n\n\
             [train]\nlocal_epochs = 2\n\n\
             [release]\nmode = \"gated\"\nevaluators = [\"{JUDGE}\"]\ncanary_share = 0.5\n\
             canary_window_s = 2\ntimeout_s = 60\n",
            classes.join(", ")
        ),
    )
    .unwrap();
    let profile = common::firmware_configs().join("generic-x86_64.toml");
    let devices = [TRAINERS[0], TRAINERS[1], JUDGE, INSIDER].join(",");
    let (kit_arg, port_arg) = (kit.display().to_string(), port.to_string());
    let broker_dir = kit.join("broker").display().to_string();
    let out = crate::provision::provision(&[
        "--config",
        &config.display().to_string(),
        "--out",
        &kit_arg,
        "--broker-host",
        "localhost",
        "--broker-ip",
        "127.0.0.1",
        "--devices",
        &devices,
        "--profile",
        &profile.display().to_string(),
        "--port",
        &port_arg,
        "--broker-dir",
        &broker_dir,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Each site its own kind of images; the evaluation site only scores.
    for (device, domain, extra) in [
        (TRAINERS[0], "rot0", ""),
        (TRAINERS[1], "rot15", ""),
        (JUDGE, "rot45", "role = \"evaluate\"\n"),
    ] {
        let path = kit.join(format!("devices/{device}/profile.toml"));
        let profile = std::fs::read_to_string(&path).unwrap();
        assert!(profile.contains("domain = \"rot15\""), "{profile}");
        let profile = profile.replace("domain = \"rot15\"", &format!("domain = \"{domain}\""));
        std::fs::write(&path, format!("{extra}{profile}")).unwrap();
    }
    kit
}

/// The dashboard's subscription (statuses) and the insider's (round tasks), each with the
/// rights the shipped ACL gives it; the insider answers a task that selects it while
/// `poison` is set.
async fn watch(fleet: &Fleet) -> AsyncClient {
    let topics = Topics::new(FEDERATION).unwrap();
    let dashboard = kit_client(&fleet.kit, fleet.port, "dashboard", "fedge-dashboard");
    let (client, mut events) = AsyncClient::new(dashboard.options("fedge-dashboard", None), 64);
    client
        .subscribe(topics.coordinator_status(), QoS::AtLeastOnce)
        .await
        .unwrap();
    client
        .subscribe(topics.edge_status_filter(), QoS::AtLeastOnce)
        .await
        .unwrap();
    let seen = Arc::clone(&fleet.seen);
    let status_topic = topics.coordinator_status();
    let statuses = topics.clone();
    tokio::spawn(async move {
        let topics = statuses;
        let _client = client;
        loop {
            let Ok(event) = events.poll().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Event::Incoming(Packet::Publish(p)) = event else {
                continue;
            };
            let mut seen = seen.lock().unwrap();
            if p.topic == status_topic {
                if let Ok(status) = serde_json::from_slice(&p.payload) {
                    seen.status = Some(status);
                }
            } else if let Some(device) = topics.client_of_edge_status(&p.topic)
                && let Ok(status) = serde_json::from_slice(&p.payload)
            {
                seen.devices.insert(device.to_owned(), status);
            }
        }
    });

    let insider = kit_client(
        &fleet.kit,
        fleet.port,
        &format!("devices/{INSIDER}"),
        INSIDER,
    );
    let (client, mut events) = AsyncClient::new(insider.options(INSIDER, None), 64);
    let task = topics.round_task();
    for filter in [task.clone(), format!("{task}/+")] {
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    }
    let (seen, key, answering) = (
        Arc::clone(&fleet.seen),
        fleet.insider_key.clone(),
        client.clone(),
    );
    tokio::spawn(async move {
        let mut tasks = fedge_wire::Reassembler::new(30_000, 64 << 20);
        let start = Instant::now();
        loop {
            let Ok(event) = events.poll().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Event::Incoming(Packet::Publish(p)) = event else {
                continue;
            };
            let now = start.elapsed().as_millis() as u64;
            let decoded = fedge_wire::decode_task(&mut tasks, &p.payload, now, INSIDER, Some(&key));
            let Ok(Some(task)) = decoded else {
                continue;
            };
            let frame = {
                let mut seen = seen.lock().unwrap();
                let selected = task.selected.iter().any(|c| c == INSIDER);
                if !seen.poison || !selected || seen.answered.contains(&task.round) {
                    continue;
                }
                seen.answered.push(task.round);
                // Three equal weights: three times the step lands the aggregate on the flip.
                let params = task.params.to_vec();
                let flipped = crate::releases::rotated(&head(), &params, 1);
                let delta: Vec<f32> = (flipped.iter().zip(&params))
                    .map(|(t, p)| 3.0 * (t - p))
                    .collect();
                let update = fedge_wire::ClientUpdate {
                    run: task.run,
                    ..common::client_update(task.round, INSIDER, now, 300, &delta)
                };
                fedge_wire::seal(common::update_frame(update), &[(INSIDER, &key)])
            };
            let topic = Topics::new(FEDERATION).unwrap().update(INSIDER);
            let _ = answering
                .publish(topic, QoS::AtLeastOnce, false, frame)
                .await;
        }
    });
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_survives_restarts_new_runs_kills_a_held_candidate_a_rollback_and_a_promotion() {
    if common::mosquitto_binary().is_none() || !crate::tls::has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let port = fedge_coordinator::io::broker::free_loopback_addr()
        .unwrap()
        .port();
    let kit = provision(&root, port);
    let Some(_broker) = crate::provision::start_broker(&root, &kit, port) else {
        return;
    };
    let insider_key = std::fs::read_to_string(kit.join(format!("devices/{INSIDER}/device.key")));
    let insider_key = DeviceKey::from_hex(insider_key.unwrap().trim()).unwrap();
    let mut fleet = Fleet {
        root,
        kit,
        port,
        coordinator: None,
        agents: BTreeMap::new(),
        seen: Arc::default(),
        insider_key,
    };
    let insider = watch(&fleet).await;
    tokio::task::block_in_place(|| day(&mut fleet, &insider));
}

/// The operator's day, step by step (the module's comment).
fn day(fleet: &mut Fleet, insider: &AsyncClient) {
    let handle = tokio::runtime::Handle::current();
    let minute = Duration::from_secs(60);
    fleet.start_coordinator();
    for device in TRAINERS.into_iter().chain([JUDGE]) {
        fleet.start_agent(device);
    }

    // 1. Run 1, then SIGTERM and a start again.
    fleet.wait("run 1 to finish, served everywhere", 3 * minute, |s| {
        s.state().0 == "finished" && s.all_serve_what_is_served()
    });
    let first_run = fleet.status().run;
    fleet.stop_coordinator();
    fleet.start_coordinator();
    fleet.wait("the restarted coordinator", minute, |s| {
        s.status.as_ref().is_some_and(|s| s.state == "finished")
    });

    // 2. A new run, with cam-02 held back so that its first round cannot close; kill -9 once
    //    cam-01's update is in.
    fleet.signal_agent(TRAINERS[1], "-STOP");
    let started = fleet.ctl_ok(&["new-run", "2"]);
    let outcome = started
        .last_command
        .clone()
        .expect("what became of new-run");
    let second_run = outcome.run.clone().expect("new-run names its run");
    assert!(outcome.applied);
    assert_ne!(second_run, first_run, "a run number never used before");
    let opened = fleet.status().round.max(started.round);
    fleet.wait("cam-01's update in run 2's first round", minute, |s| {
        let (state, round, reported) = s.state();
        state == "training" && round >= opened && reported >= 1
    });
    let resumed_round = fleet.status().round;
    fleet.kill_coordinator();
    fleet.start_coordinator();
    fleet.signal_agent(TRAINERS[1], "-CONT");
    fleet.wait(
        "run 2's first round aggregated after the kill",
        2 * minute,
        |s| {
            s.status
                .as_ref()
                .is_some_and(|c| c.run == second_run && c.run_aggregated.unwrap_or(0) >= 1)
        },
    );
    let log = fleet.log();
    assert!(
        log.contains("resuming the open round from the journal"),
        "the journaled round was not resumed:\n{log}"
    );
    assert!(!log.contains("is not resumed"), "{log}");
    assert!(fleet.status().round > resumed_round);

    // 3. kill -9 after the run's first aggregation: it goes on to its end.
    fleet.kill_coordinator();
    fleet.start_coordinator();
    fleet.wait("run 2 to finish, served everywhere", 3 * minute, |s| {
        let status = s.status.as_ref();
        status.is_some_and(|c| c.run == second_run && c.state == "finished")
            && s.all_serve_what_is_served()
    });

    // 4. The evaluation site and a training device restart.
    for device in [JUDGE, TRAINERS[0]] {
        fleet.agents.remove(device);
        fleet.start_agent(device);
    }
    fleet.wait("the restarted devices back", minute, |s| {
        s.all_serve_what_is_served()
    });
    let before_poison = fleet.seen.lock().unwrap().serving().unwrap();

    // 5. One round with the insider: its label flip is held by the gate.
    fleet.seen.lock().unwrap().poison = true;
    handle.block_on(fleet.insider_online(insider, true));
    fleet.wait("the insider online", minute, |s| {
        s.status.as_ref().is_some_and(|c| c.clients_online >= 3)
    });
    let poisoned = fleet.ctl_ok(&["new-run", "1"]);
    let third_run = poisoned.last_command.and_then(|c| c.run).unwrap();
    assert!(third_run != first_run && third_run != second_run);
    fleet.wait("the gate's verdict on the flipped round", 2 * minute, |s| {
        let release = s.status.as_ref().and_then(|c| c.release.as_ref());
        let gate = release.and_then(|r| r.gate.as_ref());
        gate.is_some_and(|g| g.outcome == fedge_wire::GateOutcome::Held)
            && s.state().0 == "finished"
    });
    assert!(!fleet.seen.lock().unwrap().answered.is_empty());
    let held = fleet.status().release.unwrap().gate.unwrap();
    assert_eq!(
        fleet.seen.lock().unwrap().serving(),
        Some(before_poison.clone())
    );
    fleet.seen.lock().unwrap().poison = false;
    handle.block_on(fleet.insider_online(insider, false));

    // 6. A rollback to the release before, then a run whose candidate waits behind the pin,
    //    promoted by the operator.
    let rolled = fleet.ctl_ok(&["rollback"]);
    let back = rolled.release.clone().unwrap();
    assert!(back.pinned);
    let back_to = back.serving.unwrap().sha256;
    assert_ne!(back_to, before_poison);
    fleet.wait("every device back on the release before", minute, |s| {
        s.serving().as_deref() == Some(&back_to) && s.all_serve_what_is_served()
    });
    let nothing = fleet.ctl(&["new-run", "0"]);
    assert!(!nothing.status.success());
    assert!(
        text(&nothing.stderr).contains("give the number of rounds"),
        "{}",
        text(&nothing.stderr)
    );
    fleet.ctl_ok(&["new-run", "1"]);
    fleet.wait("a candidate waiting behind the pin", 2 * minute, |s| {
        let release = s.status.as_ref().and_then(|c| c.release.as_ref());
        release.is_some_and(|r| r.pinned && r.candidate.is_some()) && s.state().0 == "finished"
    });
    let candidate = fleet.status().release.unwrap().candidate.unwrap();
    let promoted = fleet.ctl_ok(&["promote"]);
    assert!(!promoted.release.as_ref().unwrap().pinned);
    fleet.wait("every device on the promoted release", minute, |s| {
        s.serving().as_deref() == Some(&candidate.sha256) && s.all_serve_what_is_served()
    });
    // Nothing left to promote: refused, with the reason, and ctl says so.
    let again = fleet.ctl(&["promote"]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("nothing to promote"),
        "{}",
        text(&again.stderr)
    );

    // What holds at the end.
    let status = fleet.status();
    assert!(status.resting.is_empty(), "{:?}", status.resting);
    for refused in ["replay", "stale", "not_selected", "wrong_round", "score"] {
        assert_eq!(
            status.rejected_updates.get(refused).copied().unwrap_or(0),
            0,
            "{refused}: {:?}\n{}",
            status.rejected_updates,
            fleet.log()
        );
    }
    let runs: Vec<&str> = status.runs.iter().map(|r| r.run.as_str()).collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    let mut distinct = runs.clone();
    distinct.push(&status.run);
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        4,
        "every run its own number: {runs:?} {}",
        status.run
    );
    audit(
        fleet,
        &[&second_run, &third_run],
        &held.candidate.sha256,
        &candidate.sha256,
    );
}

/// The trail verifies, names the runs `new-run` started, holds the verdict, the rollback and
/// the release every device was told to serve last; no round's release was built by a device
/// twice.
fn audit(fleet: &Fleet, runs: &[&str], held: &str, last: &str) {
    let state = fleet.kit.join("coordinator/state");
    let trail = state.join("audit.jsonl");
    common::succeeded(
        Command::new(common::coordinator_binary())
            .args(["audit", "verify", "--state-dir"])
            .arg(&state),
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trail)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for run in runs {
        assert!(
            lines.iter().any(|l| l["event"] == "control"
                && l["command"]["command"] == "new-run"
                && l["run"] == *run),
            "no new-run naming run {run}"
        );
    }
    assert!(lines.iter().any(|l| {
        l["event"] == "control"
            && l["command"]["command"] == "promote"
            && l["refused"]
                .as_str()
                .is_some_and(|r| r.contains("nothing to promote"))
    }));
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "gate-verdict" && l["sha256"] == held && l["passed"] == false)
    );
    assert!(lines.iter().any(|l| l["event"] == "rollback"));
    let rollout = (lines.iter().rev())
        .find(|l| l["event"] == "rollout")
        .expect("a rollout");
    assert_eq!(rollout["sha256"], last, "{rollout}");
    assert_eq!(rollout["devices"], serde_json::json!(["*"]), "{rollout}");
    for line in lines.iter().filter(|l| l["event"] == "released") {
        let built: Vec<&str> = (line["built_by"].as_array().unwrap().iter())
            .map(|c| c.as_str().unwrap())
            .collect();
        let mut once = built.clone();
        once.sort();
        once.dedup();
        assert_eq!(once.len(), built.len(), "{line}");
    }
}
