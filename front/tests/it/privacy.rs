//! Central DP end to end, as a user runs it: `fedge demo --dp-noise` spends the ε that Google's
//! dp-accounting gives for the same mechanism (the recorded vectors of
//! `privacy/tests/reference.json`), `fedge eval --dp-noise` writes its privacy–utility table,
//! JSON and chart, and a combination central DP cannot run is refused with the reason.

use std::process::Command;

use serde_json::Value;

use crate::common;

fn fedge(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fedge"))
        .args(args)
        .output()
        .unwrap()
}

/// dp-accounting's ε for `steps` rounds of the Gaussian mechanism with noise multiplier
/// `sigma`, every device in every round (q = 1), at δ = 1e-5.
fn reference_epsilon(sigma: f64, steps: f64) -> f64 {
    let path = common::repo_root().join("privacy/tests/reference.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            let step = &c["steps"][0];
            c["sampling"] == "poisson"
                && c["delta"] == 1e-5
                && c["steps"].as_array().map(Vec::len) == Some(1)
                && [step[0].as_f64(), step[1].as_f64(), step[2].as_f64()]
                    == [Some(1.0), Some(sigma), Some(steps)]
        })
        .expect("a recorded case");
    case["epsilon"].as_f64().unwrap()
}

#[test]
fn a_demo_under_central_dp_spends_the_epsilon_dp_accounting_gives() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("dp.json");
    let out = fedge(&[
        "demo",
        "--rounds",
        "10",
        "--quiet",
        "--dp-noise",
        "1",
        "--dp-clip",
        "0.5",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(result["delta"], 1e-5);
    let rounds = result["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 10);
    let spent: Vec<f64> = rounds
        .iter()
        .map(|r| r["epsilon"].as_f64().unwrap())
        .collect();
    assert!(spent.windows(2).all(|w| w[1] > w[0]), "{spent:?}");
    let expected = reference_epsilon(1.0, 10.0);
    let relative = (spent[9] - expected).abs() / expected;
    assert!(
        relative < 0.01,
        "ε {} against dp-accounting's {expected}",
        spent[9]
    );
    assert_eq!(result["strategy"], "dp-fedavg");

    // FedOMG reads each device's delta: refused with the reason, before anything runs.
    let out = fedge(&[
        "demo",
        "--rounds",
        "1",
        "--quiet",
        "--dp-noise",
        "1",
        "--dp-clip",
        "0.5",
        "--strategy",
        "fedomg",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("fedomg") || said.contains("FedOMG"), "{said}");
}

#[test]
fn eval_draws_the_privacy_utility_curve() {
    let dir = tempfile::tempdir().unwrap();
    let (json, plot) = (dir.path().join("eval.json"), dir.path().join("eval.png"));
    let out = fedge(&[
        "eval",
        "--dataset",
        "digits",
        "--algorithms",
        "fedavg",
        "--seeds",
        "1",
        "--rounds",
        "3",
        "--local-epochs",
        "1",
        "--scenario",
        "multi",
        "--clients-per-domain",
        "4",
        "--sample",
        "8",
        "--dp-noise",
        "0,0.5,2",
        "--dp-clip",
        "0.5",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("| fedavg | 0 | ∞ (no DP) |"), "{said}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["privacy"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let eps: Vec<f64> = rows[1..]
        .iter()
        .map(|r| r["epsilon"].as_f64().unwrap())
        .collect();
    assert!(
        eps[0] > eps[1] && eps[1] > 0.0,
        "more noise spends less: {eps:?}"
    );
    let chart = image::open(dir.path().join("eval-privacy.png")).unwrap();
    assert!(chart.width() > 500 && chart.height() > 300);
}
