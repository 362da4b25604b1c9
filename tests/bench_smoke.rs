//! `fedge bench` on the built-in digits: a two-round smoke run of every algorithm, and the
//! same results when run again with the same seed.

use fedge::fdg::{BenchOptions, Dataset, Scenario, markdown, parse_algorithm, run_lodo};

#[test]
fn every_algorithm_runs_two_rounds_on_every_held_out_digits_domain() {
    let names = [
        "fedavg",
        "fedprox",
        "fedavgm",
        "fedomg",
        "feddim",
        "feddim+fedomg",
    ];
    let algorithms: Vec<_> = names.iter().map(|n| parse_algorithm(n).unwrap()).collect();
    let options = BenchOptions {
        dataset: Dataset::Digits,
        scenario: Scenario::Lodo,
        rounds: 2,
        seeds: 1,
        local_epochs: 1,
        hidden: 32,
    };
    let results = run_lodo(&algorithms, &options, |_| {}).unwrap();
    assert_eq!(results.len(), names.len() * 6);
    let mut targets: Vec<&str> = results.iter().map(|r| r.target.as_str()).collect();
    targets.dedup();
    assert_eq!(
        targets,
        ["rot0", "rot15", "rot30", "rot45", "rot60", "rot75"]
    );
    for r in &results {
        let what = (&r.algorithm, &r.target, r.best_round, r.best_source_val);
        assert!((1..=2).contains(&r.best_round), "{what:?}");
        assert!((0.0..=1.0).contains(&r.target_accuracy), "{what:?}");
        assert!(
            r.best_source_val > 0.2,
            "the heads learned nothing: {what:?}"
        );
    }
    let table = markdown(&results);
    assert!(table.starts_with("| algorithm | rot0 |"), "{table}");
    assert_eq!(table.lines().count(), 2 + names.len());

    // Same seed, same numbers: the run does not depend on timing or thread scheduling.
    let again = run_lodo(&algorithms[4..], &options, |_| {}).unwrap();
    let before: Vec<_> = results
        .iter()
        .filter(|r| r.algorithm.starts_with("feddim"))
        .cloned()
        .collect();
    let mut again_sorted = again.clone();
    again_sorted.sort_by(|a, b| (&a.algorithm, &a.target).cmp(&(&b.algorithm, &b.target)));
    let mut before_sorted = before;
    before_sorted.sort_by(|a, b| (&a.algorithm, &a.target).cmp(&(&b.algorithm, &b.target)));
    assert_eq!(again_sorted, before_sorted);
}

/// The benchmark's in-process simulation and a real federation over the embedded MQTT broker
/// (agents, coordinator driver, chunked frames) pick the same round and end with the same
/// global head, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_and_mqtt_runs_give_identical_results() {
    use fedge::fdg::{digits, run_one, run_one_mqtt};
    use fedge_models::HeadConfig;

    let seed = 0;
    let options = BenchOptions {
        dataset: Dataset::Digits,
        scenario: Scenario::Lodo,
        rounds: 2,
        seeds: 1,
        local_epochs: 1,
        hidden: 32,
    };
    let algorithm = parse_algorithm("feddim+fedomg").unwrap();
    let (domains, features, classes) = digits(seed).unwrap();
    let head = HeadConfig::new(features, classes).with_hidden(options.hidden);
    let target = domains.len() - 1;
    let simulated = run_one(&algorithm, &domains, target, seed, &head, &options).unwrap();
    let over_mqtt = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        run_one_mqtt(&algorithm, &domains, target, seed, &head, &options),
    )
    .await
    .expect("federation timed out")
    .unwrap();
    assert_eq!(simulated.final_params.len(), over_mqtt.final_params.len());
    assert!(
        simulated.final_params == over_mqtt.final_params,
        "in-process and MQTT heads differ"
    );
    let summary = |r: &fedge::fdg::RunResult| {
        (
            r.best_round,
            r.best_source_val,
            r.target_accuracy,
            r.final_target_accuracy,
        )
    };
    assert_eq!(summary(&simulated), summary(&over_mqtt));
}

#[test]
fn the_multi_scenario_samples_clients_from_split_domains() {
    let algorithms = vec![parse_algorithm("feddim+fedomg").unwrap()];
    let options = BenchOptions {
        dataset: Dataset::Digits,
        scenario: Scenario::Multi {
            clients_per_domain: 4,
            sample: 6,
        },
        rounds: 3,
        seeds: 1,
        local_epochs: 3,
        hidden: 32,
    };
    let results = run_lodo(&algorithms, &options, |_| {}).unwrap();
    assert_eq!(results.len(), 6);
    for r in &results {
        let what = (&r.target, r.best_round, r.best_source_val);
        assert!((1..=3).contains(&r.best_round), "{what:?}");
        assert!(
            r.best_source_val > 0.2,
            "the heads learned nothing: {what:?}"
        );
    }
}

/// `fedge bench --json` as a user runs it: the document's fields and one entry per run.
#[test]
fn the_json_report_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("runs.json");
    let markdown = dir.path().join("table.md");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fedge"))
        .args([
            "bench",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--local-epochs",
            "1",
        ])
        .args(["--algorithms", "fedavg,feddim+fedomg", "--json"])
        .arg(&json)
        .arg("--markdown")
        .arg(&markdown)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["dataset"], "digits");
    assert_eq!(doc["scenario"], "lodo");
    assert_eq!(
        (doc["rounds"].as_u64(), doc["seeds"].as_u64()),
        (Some(1), Some(1))
    );
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 6);
    for run in runs {
        for key in [
            "algorithm",
            "target",
            "seed",
            "best_round",
            "best_source_val",
            "target_accuracy",
            "final_target_accuracy",
        ] {
            assert!(!run[key].is_null(), "{key} missing in {run}");
        }
        assert!(
            run.get("final_params").is_none(),
            "parameters stay out of the report"
        );
    }
    let table = std::fs::read_to_string(&markdown).unwrap();
    assert!(table.contains("| feddim+fedomg |"), "{table}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_fedge"))
        .args(["bench", "--dataset", "imagenet"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("available: digits, fashion-mnist"));
}
