//! The red-team tool against real federations: `fedge demo --attack all` (device keys on, the
//! attacking devices holding keys of their own) must end like the same demo without attacks
//! (every round aggregated, the same accuracy within 0.02) while every attack sent something
//! and the coordinator refused what it could see; and `fedge attack` pointed at a running
//! federation reports on every attack.

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
