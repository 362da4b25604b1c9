//! The red-team tool against real federations: `fedge demo --attack all` (device keys on, the
//! attacking devices holding keys of their own) must end like the same demo without attacks
//! (every round aggregated, the same accuracy within 0.02) while every attack sent something,
//! the coordinator refused what it could see, and none of the attacks judged by what the
//! coordinator did got through ([`AttackKind::breaches`]); `fedge attack` pointed at a running
//! federation reports on every attack; and in a federation whose releases pass the gate and a
//! canary stage (the `fedge-coordinator` and `fedge-edge` binaries, an evaluation-only agent
//! named as the gate's evaluator), lying scores, a forged drift alarm, another run's score and
//! a poisoned feature summary move neither the gate, nor the canary, nor the pooled summary.

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fedge::attack::AttackKind;
use serde_json::Value;

use crate::common::{self, KillOnDrop};

/// What a finished command printed.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `command` to its end with its output in files of `dir` (the logs of a federation
/// under attack are long), killing it after `limit`.
fn run_within(command: &mut Command, dir: &Path, limit: Duration) -> Ran {
    let (out, err) = (dir.join("stdout.txt"), dir.join("stderr.txt"));
    let child = command
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < limit,
            "{command:?} still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    Ran {
        status,
        stdout: text(&out),
        stderr: text(&err),
    }
}

/// The last lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn demo(dir: &Path, name: &str, extra: &[&str]) -> Value {
    let json = dir.join(format!("{name}.json"));
    let out = run_within(
        Command::new(env!("CARGO_BIN_EXE_fedge"))
            .args(["demo", "--rounds", "4", "--clients", "3", "--seed", "7"])
            .args(["--quiet", "--json"])
            .arg(&json)
            .args(extra),
        dir,
        Duration::from_secs(110),
    );
    assert!(out.status.success(), "{name}: {}", tail(&out.stderr));
    read_json(&json)
}

/// `fedge demo --attack all` over the embedded broker ends as the clean demo does.
#[test]
fn the_demo_shrugs_off_every_attack() {
    let dir = tempfile::tempdir().unwrap();
    let clean = demo(dir.path(), "clean", &[]);
    let attacked = demo(
        dir.path(),
        "attacked",
        &["--attack", "all", "--round-timeout", "3"],
    );
    let attacks = &attacked["attacks"];
    let mut failures = Vec::new();
    for kind in AttackKind::ALL {
        let report = &attacks[kind.name()];
        let sent = report["sent"].as_u64().unwrap_or(0);
        let rejected = report["rejected"].as_u64().unwrap_or(0);
        if sent == 0 {
            failures.push(format!("{kind} sent nothing: {report}"));
        }
        if kind.coordinator_sees() && rejected == 0 {
            failures.push(format!("{kind} was never rejected: {report}"));
        }
        for effect in kind.breaches() {
            if let Some(n) = report["effects"][effect].as_u64().filter(|n| *n > 0) {
                failures.push(format!("{kind} got through ({effect} × {n}): {report}"));
            }
        }
    }
    let rows = attacked["rounds"].as_array().unwrap();
    let aggregated = rows
        .iter()
        .filter(|r| !r["target_accuracy"].is_null())
        .count();
    if aggregated != rows.len() || rows.len() != 4 {
        failures.push(format!(
            "{aggregated} of {} rounds aggregated (4 wanted, none abandoned)",
            rows.len()
        ));
    }
    let clean_acc = clean["final_target_accuracy"].as_f64().unwrap();
    match attacked["final_target_accuracy"].as_f64() {
        Some(acc) if (acc - clean_acc).abs() <= 0.02 => {}
        other => failures.push(format!(
            "final accuracy {other:?} under attack, {clean_acc} without"
        )),
    }
    assert!(
        attacked["rejected"]
            .as_object()
            .is_some_and(|r| !r.is_empty()),
        "no rejection counts by reason: {attacked}"
    );
    assert!(
        failures.is_empty(),
        "{}\nattacks: {attacks:#}\nrejected: {}\nuntraced: {}",
        failures.join("\n"),
        attacked["rejected"],
        attacked["attacks_untraced"]
    );
}

/// `fedge attack` against a federation running on the embedded broker: the report parses and
/// lists every attack, and those that need no round to act sent something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fedge_attack_reports_on_every_attack_against_a_running_federation() {
    let broker = common::embedded_broker();
    let federation = "attack-cli";
    let options = fedge::demo::DemoOptions {
        rounds: 1_000,
        clients: 3,
        round_timeout_s: 2.0,
        ..common::demo_options(Some(broker.clone()), federation)
    };
    let data = fedge::demo::prepare(&options).unwrap();
    let (first_round, mut rounds) = tokio::sync::watch::channel(0u64);
    let running = tokio::spawn(async move {
        fedge::demo::run(&options, &data, |row| {
            let _ = first_round.send(row.round);
        })
        .await
    });
    // The attack starts on a federation that has run a round (and has a retained task).
    tokio::time::timeout(Duration::from_secs(60), rounds.wait_for(|r| *r > 0))
        .await
        .expect("the federation ran no round within a minute")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("attack.json");
    let url = format!("mqtt://{}:{}", broker.host, broker.port);
    let out = {
        let (json, dir) = (json.clone(), dir.path().to_owned());
        tokio::task::spawn_blocking(move || {
            run_within(
                Command::new(env!("CARGO_BIN_EXE_fedge"))
                    .args(["attack", "--broker", &url, "--federation", federation])
                    .args(["--kind", "all", "--duration", "4", "--json"])
                    .arg(&json),
                &dir,
                Duration::from_secs(60),
            )
        })
        .await
        .unwrap()
    };
    running.abort();
    assert!(out.status.success(), "{}", tail(&out.stderr));
    let table = out.stdout;
    let report = read_json(&json);
    assert_eq!(report["federation"], federation);
    let kinds = report["kinds"].as_object().unwrap();
    assert_eq!(kinds.len(), AttackKind::ALL.len(), "{report:#}");
    for kind in AttackKind::ALL {
        let entry = &report["kinds"][kind.name()];
        for field in ["sent", "bytes", "rejected"] {
            assert!(entry[field].is_u64(), "{kind}.{field}: {entry}");
        }
        assert!(entry["reasons"].is_object() && entry["effects"].is_object());
        assert!(table.contains(kind.name()), "{table}");
    }
    for kind in [
        AttackKind::OversizedStatus,
        AttackKind::ChunkFlood,
        AttackKind::ForgedStatus,
        AttackKind::Junk,
        AttackKind::IdTakeover,
    ] {
        assert!(
            report["kinds"][kind.name()]["sent"].as_u64() > Some(0),
            "{kind} sent nothing: {report:#}"
        );
    }
    let answer = &report["federation_answer"];
    assert!(answer["rounds_opened"].as_u64() > Some(0), "{answer}");
    assert!(
        answer["coordinator_state"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
}

/// The gated federation's name.
const GATED: &str = "gated-attack";
/// Its agents: `(client id, digits domain, evaluation-only)`; `judge` is the only evaluation
/// site the gate takes scores from.
const GATED_AGENTS: [(&str, &str, bool); 3] = [
    ("site-a", "rot0", false),
    ("site-b", "rot15", false),
    ("judge", "rot45", true),
];
/// The attacks on what devices say of releases and of their features.
const STATUS_ATTACKS: [AttackKind; 4] = [
    AttackKind::PoisonSummary,
    AttackKind::LyingScore,
    AttackKind::CanaryVeto,
    AttackKind::StaleStatus,
];

/// The coordinator's configuration (returned) and the agents' profiles, in `root`: no device
/// keys (every status is believed as it is), releases gated with `judge` as the only
/// evaluation site, every online device a canary for three seconds.
fn gated_configs(root: &Path, port: u16) -> std::path::PathBuf {
    let classes: String = (0..10).map(|k| format!("{k}\n")).collect();
    std::fs::write(root.join("classes.txt"), classes).unwrap();
    let broker = format!("[broker]\nhost = \"127.0.0.1\"\nport = {port}\n");
    let config = format!(
        "federation = \"{GATED}\"\nrounds = 5\nstay_up = true\nmin_clients = 2\n\
         min_updates = 2\nround_timeout_s = 10\nstate_dir = \"state\"\n\n{broker}\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n\n\
         [train]\nlocal_epochs = 1\n\n\
         [release]\nmode = \"gated\"\nevaluators = [\"judge\"]\ncanary_share = 1.0\n\
         canary_window_s = 3\ntimeout_s = 60\n\n\
         [auth]\noperator_key_file = \"operator.key\"\n"
    );
    // Staying up after the last round takes an operator key (nobody here uses it).
    let operator = fedge_wire::DeviceKey::from_bytes([9; 32]).to_hex();
    common::write_private(&root.join("operator.key"), format!("{operator}\n"));
    let path = root.join("coordinator.toml");
    std::fs::write(&path, config).unwrap();
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    for (id, domain, evaluates) in GATED_AGENTS {
        let role = if evaluates {
            "role = \"evaluate\"\n"
        } else {
            ""
        };
        let profile = format!(
            "client_id = \"{id}\"\nfederation = \"{GATED}\"\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache-{id}\"\nbackbone = {card:?}\n{role}\n{broker}\n\
             [data]\nkind = \"digits\"\ndomain = \"{domain}\"\n"
        );
        std::fs::write(root.join(format!("{id}.toml")), profile).unwrap();
    }
    path
}

/// The coordinator's status as a watcher sees it, until `done` holds of it, at most `within`;
/// fails when the `coordinator` process ends first.
async fn watch_coordinator(
    broker: &fedge_mqtt::BrokerConfig,
    coordinator: &mut KillOnDrop,
    within: Duration,
    log: &Path,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let topics = fedge_wire::Topics::new(GATED).unwrap();
    let (client, mut events) = rumqttc::AsyncClient::new(broker.options("gated-watcher", None), 64);
    client
        .subscribe(topics.coordinator_status(), rumqttc::QoS::AtLeastOnce)
        .await
        .unwrap();
    let end = tokio::time::Instant::now() + within;
    let mut status = Value::Null;
    let log = || tail(&std::fs::read_to_string(log).unwrap_or_default());
    while !done(&status) {
        if let Some(exit) = coordinator.try_wait().unwrap() {
            panic!("the coordinator ended ({exit}); its log:\n{}", log());
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the gated federation did not settle within {within:?}; last status: {status:#}\n\
             coordinator log:\n{}",
            log()
        );
        let Ok(event) = tokio::time::timeout(Duration::from_millis(500), events.poll()).await
        else {
            continue;
        };
        match event {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                if let Ok(value) = serde_json::from_slice::<Value>(&p.payload) {
                    status = value;
                }
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let _ = client.try_disconnect();
    status
}

/// A gated federation of real agents (`fedge-coordinator` and `fedge-edge` binaries, no device
/// keys) with the status attacks and the poisoned summary beside it from its first round task
/// on, until its last candidate is judged and no canary stage is under way. None of them gets
/// through: the scores of a site the operator did not name and of a release the coordinator
/// never made count for nothing, one device's alarm does not fail a canary stage (and no
/// release is ever rolled back), and the pooled summary is not poisoned. Each attack must also
/// have met what it aims at: a canary stage that drew the attacker, a gate verdict or a site
/// list after the lies, a round that took (or refused) the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lies_a_forged_alarm_and_a_poisoned_summary_move_neither_gate_nor_canary_nor_pool() {
    let broker = common::embedded_broker();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = gated_configs(root, broker.port);
    // The attackers join once the first round is open (the honest devices open it), and are
    // online long before the first canary stage, which may draw them.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let attack = fedge::attack::AttackConfig {
        wait_for_task: true,
        duration: None,
        grace: Duration::from_secs(1),
        ..fedge::attack::AttackConfig::new(broker.clone(), GATED, STATUS_ATTACKS.to_vec())
    };
    let attack = tokio::spawn(fedge::attack::run(attack, stop));
    let log = root.join("coordinator.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut coordinator = KillOnDrop(
        Command::new(common::coordinator_binary())
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap(),
    );
    let _agents: Vec<KillOnDrop> = (GATED_AGENTS.iter())
        .map(|(id, _, _)| {
            crate::use_model::spawn(
                &crate::use_model::edge_binary(),
                &["run", "--config"],
                &root.join(format!("{id}.toml")),
            )
        })
        .collect();
    // Settled: every round run, no canary stage under way, no candidate waiting.
    let within = Duration::from_secs(300);
    let status = watch_coordinator(&broker, &mut coordinator, within, &log, |s| {
        let release = &s["release"];
        s["state"] == "finished"
            && release["canary"].is_null()
            && (release["candidate"].is_null() || release["gate"]["outcome"] != "waiting")
    })
    .await;
    // The attacks see the last pointer and status, then judge.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop_tx.send(true);
    let outcome = tokio::time::timeout(Duration::from_secs(30), attack)
        .await
        .expect("the attacks did not end within 30 s")
        .unwrap()
        .unwrap();
    let report = &outcome.report;
    let count = |kind: AttackKind, names: &[&str]| {
        let r = &report.kinds[&kind];
        (names.iter())
            .map(|n| {
                r.effects
                    .get(*n)
                    .or(r.reasons.get(*n))
                    .copied()
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    let mut failures = Vec::new();
    for kind in STATUS_ATTACKS {
        for effect in kind.breaches() {
            if count(kind, &[effect]) > 0 {
                failures.push(format!("{kind} got through: {effect}"));
            }
        }
    }
    let met = [
        (
            AttackKind::CanaryVeto,
            &["canary_member"][..],
            "never drawn as a canary",
        ),
        (
            AttackKind::CanaryVeto,
            &["canary_survived"],
            "no canary stage judged after its alarm",
        ),
        (
            AttackKind::LyingScore,
            &["gate_unswayed", "too_late", "score_ignored"],
            "no verdict or site list judged after a lie",
        ),
        (
            AttackKind::StaleStatus,
            &["stale_score_ignored"],
            "no site list judged after the stale status",
        ),
        (
            AttackKind::PoisonSummary,
            &["summaries_1e9"],
            "never sent its poisoned summary",
        ),
    ];
    for (kind, names, what) in met {
        if count(kind, names) == 0 {
            failures.push(format!("{kind}: {what}"));
        }
    }
    if report.kinds[&AttackKind::PoisonSummary].rejected == 0 {
        failures.push("poison-summary: neither refused nor judged unmoved".into());
    }
    // No release was ever rolled back (the audit trail has every rollback).
    let trail = std::fs::read_to_string(root.join("state/audit.jsonl")).unwrap_or_default();
    if trail.contains("\"rollback\"") {
        failures.push(format!(
            "a release was rolled back:\n{}",
            (trail.lines())
                .filter(|l| l.contains("\"rollback\""))
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    eprintln!("{report}");
    assert!(
        failures.is_empty(),
        "{}\n{report}\nreport: {:#}\nlast coordinator status: {status:#}",
        failures.join("\n"),
        serde_json::to_value(report).unwrap()
    );
}
