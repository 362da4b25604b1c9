//! `fedge-coordinator aggregate` as a user runs it: the worked example of docs/algorithms.md §2
//! through .npy files and the real binary.

use std::path::Path;
use std::process::Command;

use fedge_coordinator::replay::npy;

fn write_example(dir: &Path) {
    // Equal counts make p_u = 1/3, so the deltas are 3·g_u; η_ref = 0.5 is global_lr = 0.5/3.
    let g = [
        [1.0f32, 0.0, 0.5, -0.2],
        [0.0, 1.0, 0.5, 0.1],
        [-0.3, 0.2, 1.0, 0.0],
    ];
    let deltas = dir.join("deltas");
    std::fs::create_dir_all(&deltas).unwrap();
    npy::write_f32(&dir.join("G.npy"), &[0.1, -0.2, 0.3, 0.4]).unwrap();
    for (name, row) in ["alpha", "beta", "gamma"].iter().zip(g) {
        let delta: Vec<f32> = row.iter().map(|x| x * 3.0).collect();
        npy::write_f32(&deltas.join(format!("{name}.npy")), &delta).unwrap();
    }
    std::fs::write(
        deltas.join("counts.json"),
        r#"{"alpha": 7, "beta": 7, "gamma": 7}"#,
    )
    .unwrap();
}

fn run(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fedge-coordinator"))
        .current_dir(dir)
        .args(["aggregate", "--global", "G.npy", "--deltas", "deltas"])
        .args(["--out", "NEW.npy", "--report", "report.json"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn aggregate_reproduces_the_worked_example_through_npy_files() {
    let dir = tempfile::tempdir().unwrap();
    write_example(dir.path());
    let out = run(
        dir.path(),
        &[
            "--strategy",
            "fedomg",
            "--kappa",
            "0.5",
            "--global-lr",
            "0.16666666666666666",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theta = npy::read_f32(&dir.path().join("NEW.npy")).unwrap();
    let want = [0.2779579292, -0.0120674882, 0.7010115382, 0.3665870888];
    for (got, want) in theta.iter().zip(want) {
        assert!((*got as f64 - want).abs() < 1e-6 * want.abs(), "{theta:?}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(report["n_clients"], 3);
    let gamma = [
        ("alpha", 0.5502149834),
        ("beta", 0.0672155945),
        ("gamma", 0.3825694221),
    ];
    for (client, want) in gamma {
        let got = report["gamma"][client].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6 * want, "{client}: {got}");
    }
    assert!((report["objective"].as_f64().unwrap() - 0.7856505870).abs() < 1e-6);
    assert!(report["lambda"].as_f64().unwrap() > 0.0);

    // The converged solver reaches an objective at least as low.
    let out = run(
        dir.path(),
        &[
            "--solver",
            "converged",
            "--global-lr",
            "0.16666666666666666",
        ],
    );
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["solver"], "converged");
    assert!(report["objective"].as_f64().unwrap() <= 0.7856505870 + 1e-9);
}

#[test]
fn a_mismatched_delta_fails_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    write_example(dir.path());
    npy::write_f32(&dir.path().join("deltas/beta.npy"), &[1.0, 2.0, 3.0]).unwrap();
    let out = run(dir.path(), &["--strategy", "fedavg"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("beta.npy") && stderr.contains("3 values"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("NEW.npy").exists(),
        "nothing written on error"
    );
}

#[test]
fn a_nan_delta_is_one_line_of_error_even_with_backtraces_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    write_example(dir.path());
    npy::write_f32(
        &dir.path().join("deltas/beta.npy"),
        &[1.0, f32::NAN, 3.0, 4.0],
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fedge-coordinator"))
        .current_dir(dir.path())
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .args(["aggregate", "--global", "G.npy", "--deltas", "deltas"])
        .args(["--out", "NEW.npy"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        lines[0].contains("beta.npy") && lines[0].contains("not finite"),
        "{stderr}"
    );
    assert!(!dir.path().join("NEW.npy").exists(), "nothing written");
}
