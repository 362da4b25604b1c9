//! `[model] runtime = "onnxruntime"`: the backbone in ONNX Runtime, loaded at run time from the
//! library of PyPI's onnxruntime wheel (as on a user's machine), gives tract's features within
//! 1e-4 on the built-in backbone and on EfficientNet-Lite0; the device's inference endpoint
//! answers with it what it answers with tract; and `fedge-edge check` on such a profile says
//! which engine and providers the device gets, and why CUDA is not among them here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use fedge_models::{Backbone, Provider, Runtime, RuntimeConfig};

use crate::common;

fn digits_card() -> PathBuf {
    common::repo_root().join("models/assets/digits-conv.toml")
}

/// ONNX Runtime from `library`, CUDA first (the CPU wheel has no CUDA provider: skipped with
/// its reason), then the CPU.
fn onnxruntime(library: &Path) -> RuntimeConfig {
    RuntimeConfig::onnxruntime(
        Some(library.to_owned()),
        vec![Provider::Cuda, Provider::Cpu],
    )
}

/// The largest absolute difference between two feature sets of the same length.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Features of `images` packed images in both engines, in batches of `batch`.
fn both(card: &Path, library: &Path, raw: &[f32], batch: usize) -> (Vec<f32>, Vec<f32>) {
    let tract = Backbone::load(card).unwrap();
    let ort = Backbone::load_with(card, &onnxruntime(library), 1).unwrap();
    (
        tract.features(raw, batch).unwrap(),
        ort.features(raw, batch).unwrap(),
    )
}

#[test]
fn onnxruntime_gives_tracts_features_on_the_builtin_backbone() {
    let Some(library) = common::onnxruntime::library() else {
        return;
    };
    let ort = Backbone::load_with(&digits_card(), &onnxruntime(&library), 1).unwrap();
    let report = ort.runtime();
    assert_eq!(report.runtime, Runtime::Onnxruntime);
    assert_eq!(report.providers, [Provider::Cpu], "{report}");
    assert!(
        report.skipped.len() == 1 && report.skipped[0].starts_with("cuda skipped: "),
        "{report}"
    );
    assert!(
        report
            .version
            .as_deref()
            .is_some_and(|v| v.starts_with("1.")),
        "{report}"
    );
    // 37 digits: whole batches of 8 and a short last one (tract pads it, ONNX Runtime not).
    let digits = &fedge_edge::data::digits_domains(&[0.0], 3)[0].data;
    let raw = &digits.images[..37 * 64];
    for batch in [1, 8, 37] {
        let (tract, ort) = both(&digits_card(), &library, raw, batch);
        assert_eq!(tract.len(), 37 * 512);
        assert!(
            tract.iter().any(|v| *v > 1.0),
            "features that are not all small"
        );
        let diff = max_abs_diff(&tract, &ort);
        eprintln!("digits-conv, batch {batch}: max |tract - onnxruntime| = {diff:e}");
        assert!(
            diff <= 1e-4,
            "batch {batch}: max |tract - onnxruntime| = {diff}"
        );
    }
}

#[test]
fn onnxruntime_gives_tracts_features_on_efficientnet_lite0() {
    let (Some(card), Some(library)) = (
        crate::efficientnet::card_path(),
        common::onnxruntime::library(),
    ) else {
        return;
    };
    let backbone = Backbone::load(&card).unwrap();
    let c = backbone.card().clone();
    // Three images of smooth gradients and noise on the card's raw scale.
    let per_image = c.input_len();
    let raw: Vec<f32> = (0..3 * per_image)
        .map(|i| {
            ((i * 37 % 251) as f32 / 250.0 * 0.5 + (i % per_image) as f32 / per_image as f32 * 0.5)
                * c.raw_max
        })
        .collect();
    let (tract, ort) = both(&card, &library, &raw, 2);
    assert_eq!(tract.len(), 3 * c.feature_size);
    let diff = max_abs_diff(&tract, &ort);
    eprintln!("EfficientNet-Lite0: max |tract - onnxruntime| = {diff:e}");
    assert!(diff <= 1e-4, "max |tract - onnxruntime| = {diff}");
}

#[test]
fn the_endpoint_serves_with_onnxruntime_what_it_serves_with_tract() {
    let Some(library) = common::onnxruntime::library() else {
        return;
    };
    let tract = Arc::new(Backbone::load(&digits_card()).unwrap());
    let ort = Arc::new(Backbone::load_with(&digits_card(), &onnxruntime(&library), 1).unwrap());
    crate::inference::serve_and_compare(ort, tract, 1e-4);
}

/// `fedge-edge check --dry-run` on the generic profile with `[model]` set.
fn check_with(model: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let profile = common::profile_copy("generic-x86_64.toml", dir.path(), |text| {
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("cache_dir"))
            .map(|l| format!("{l}\n"))
            .collect();
        format!("{kept}\n[model]\n{model}\n")
    });
    let edge = common::coordinator_binary().with_file_name("fedge-edge");
    let out = Command::new(edge)
        .args(["check", "--dry-run", "--config"])
        .arg(&profile)
        .env_remove("ORT_DYLIB_PATH")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn check_names_the_engine_and_providers_a_profile_gets() {
    let Some(library) = common::onnxruntime::library() else {
        return;
    };
    let text = check_with(&format!(
        "runtime = \"onnxruntime\"\nonnxruntime_library = {library:?}\nproviders = [\"tensorrt\", \"cuda\", \"cpu\"]"
    ));
    let line = text
        .lines()
        .find(|l| l.contains("runtime"))
        .unwrap_or_else(|| panic!("no runtime line: {text}"));
    assert!(line.contains("onnxruntime 1."), "{line}");
    assert!(line.contains("(providers: cpu)"), "{line}");
    assert!(
        line.contains("tensorrt skipped: not in this ONNX Runtime library"),
        "{line}"
    );
    assert!(
        line.contains("cuda skipped: not in this ONNX Runtime library"),
        "{line}"
    );
    let tract = check_with("runtime = \"tract\"");
    assert!(
        tract
            .lines()
            .any(|l| l.contains("runtime") && l.trim_end().ends_with("tract")),
        "{tract}"
    );
}

#[test]
fn a_missing_library_is_an_error_that_says_what_to_set() {
    let err = Backbone::load_with(
        &digits_card(),
        &RuntimeConfig::onnxruntime(
            Some(PathBuf::from("/nonexistent/libonnxruntime.so")),
            vec![Provider::Cpu],
        ),
        1,
    );
    // One library per process: after another test loaded the wheel's, this one is refused
    // for naming another file; either way the message names the setting.
    let message = err.unwrap_err().to_string();
    assert!(message.contains("onnxruntime"), "{message}");
}

/// `fedge bench backbone` as README gives it, on the built-in backbone (compiled in, no file on
/// disk): tract and the library side by side at one thread and all, figures in the JSON.
#[test]
fn the_backbone_benchmark_times_both_engines_on_the_builtin_backbone() {
    let Some(library) = common::onnxruntime::library() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = common::succeeded(
        std::process::Command::new(env!("CARGO_BIN_EXE_fedge"))
            .args(["bench", "backbone", "--images", "16", "--batch", "1,4"])
            .args(["--runtime", "tract,onnxruntime", "--threads", "1,0"])
            .arg("--onnxruntime-library")
            .arg(&library)
            .arg("--json")
            .arg(&json),
    );
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows["rows"].as_array().unwrap();
    let count = |runtime: &str, threads: &str| {
        (rows.iter())
            .filter(|r| r["runtime"] == runtime && r["threads"] == threads)
            .inspect(|r| assert!(r["images_per_s"].as_f64().unwrap() > 0.0, "{r}"))
            .count()
    };
    assert_eq!(count("onnxruntime", "1"), 2, "{rows:?}");
    assert_eq!(count("onnxruntime", "all"), 2, "{rows:?}");
    assert_eq!(count("tract", "1"), 2, "{rows:?}");
    // tract on all cores only in a build with `tract-threads`; otherwise the run says why not.
    let stderr = String::from_utf8_lossy(&out.stderr);
    match fedge_models::TRACT_THREADS_BUILT {
        true => assert_eq!(count("tract", "all"), 2, "{rows:?}"),
        false => {
            assert_eq!(count("tract", "all"), 0, "{rows:?}");
            assert!(stderr.contains("--features tract-threads"), "{stderr}");
        }
    }
}
