//! `fedge-edge predict` as a user runs it: one JSON line per image, the same answer as
//! `Predictor::predict_bytes`, an error line for an unreadable image and exit code 1, and
//! messages that say how to get a model when there is none.

use std::ffi::OsStr;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;

use fedge_edge::inference::{Prediction, Predictor, store};
use fedge_models::HeadConfig;
use fedge_wire::{ModelRelease, TensorF32};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn release(round: u64) -> ModelRelease {
    let head = HeadConfig::new(512, 10).with_hidden(16);
    let params = head.init_flat(round);
    ModelRelease {
        pooled: None,
        federation: "demo".into(),
        run: 3,
        round,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| format!("digit-{k}")).collect(),
        backbone: "digits-conv".into(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    }
}

/// Digit `index` of the built-in set as an 8-bit grayscale PNG.
fn digit_png(index: usize) -> Vec<u8> {
    let set = fedge_edge::data::digits_domains(&[0.0], 1).remove(0).data;
    let raw = &set.images[index * 64..(index + 1) * 64];
    let pixels = raw
        .iter()
        .map(|v| (v * 255.0 / 16.0).round() as u8)
        .collect();
    let mut out = Cursor::new(Vec::new());
    image::GrayImage::from_raw(8, 8, pixels)
        .unwrap()
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

/// The shipped generic profile in `dir`, its backbone made absolute, with `cache_dir` when
/// given.
fn profile(dir: &Path, cache_dir: Option<&Path>) -> PathBuf {
    let configs = repo_root().join("firmware-configs");
    let text = std::fs::read_to_string(configs.join("generic-x86_64.toml")).unwrap();
    let backbone = repo_root().join("models/assets/digits-conv.toml");
    let mut out: String = text
        .lines()
        .map(|line| {
            if line.starts_with("backbone = ") {
                format!("backbone = {backbone:?}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    if let Some(cache) = cache_dir {
        out = format!("cache_dir = {cache:?}\n{out}");
    }
    let path = dir.join("profile.toml");
    std::fs::write(&path, out).unwrap();
    path
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Checks a JSON prediction against the predictor's own, logits within 1e-6.
fn assert_same(json: &Value, expected: &Prediction) {
    assert_eq!(json["class"], expected.class.as_str(), "{json}");
    assert_eq!(json["index"], expected.index, "{json}");
    assert_eq!(json["model_round"], expected.model_round, "{json}");
    let logits = json["logits"].as_array().unwrap();
    assert_eq!(logits.len(), expected.logits.len());
    for (got, want) in logits.iter().zip(&expected.logits) {
        assert!(
            (got.as_f64().unwrap() - f64::from(*want)).abs() <= 1e-6,
            "{json}"
        );
    }
    let top: Vec<&str> = json["top_k"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["class"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = expected.top_k.iter().map(|s| s.class.as_str()).collect();
    assert_eq!(top, want);
}

fn run_predict<A: AsRef<OsStr>>(args: &[A]) -> (i32, Vec<String>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fedge-edge"))
        .arg("predict")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines = stdout.lines().map(str::to_owned).collect();
    (out.status.code().unwrap_or(-1), lines, stderr)
}

#[test]
fn fedge_edge_predict_prints_a_line_per_image() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let profile_with_cache = profile(dir.path(), Some(&cache));
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    let no_cache = profile(&bare, None);
    let images: Vec<PathBuf> = (0..2)
        .map(|i| {
            let path = dir.path().join(format!("digit-{i}.png"));
            std::fs::write(&path, digit_png(i)).unwrap();
            path
        })
        .collect();
    let broken = dir.path().join("broken.png");
    std::fs::write(&broken, &digit_png(3)[..20]).unwrap();
    let flag = |s: &str| PathBuf::from(s);

    // No model yet: say how to get one.
    let (code, _, stderr) = run_predict(&[&flag("--config"), &profile_with_cache, &images[0]]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("run the agent") && stderr.contains("--model"),
        "{stderr}"
    );
    let (code, _, stderr) = run_predict(&[&flag("--config"), &no_cache, &images[0]]);
    assert_ne!(code, 0);
    assert!(stderr.contains("cache_dir"), "{stderr}");

    // The release the agent keeps: one line per image, a broken one in its place, exit 1.
    store::save(&store::model_path(&cache, "site-rot15"), &release(6)).unwrap();
    let card = repo_root().join("models/assets/digits-conv.toml");
    let backbone = std::sync::Arc::new(fedge_edge::features::load_backbone(&card).unwrap().0);
    let predictor = Predictor::new(backbone, release(6), None).unwrap();
    let args = [
        &flag("--config"),
        &profile_with_cache,
        &flag("--top-k"),
        &flag("2"),
        &images[0],
        &broken,
        &images[1],
    ];
    let (code, lines, stderr) = run_predict(&args);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (line, image) in [(&lines[0], &images[0]), (&lines[2], &images[1])] {
        let line = json(line);
        assert_eq!(line["file"], image.to_str().unwrap());
        assert!(line["probability"].as_f64().unwrap() > 0.0);
        let bytes = std::fs::read(image).unwrap();
        assert_same(&line, &predictor.predict_bytes(&bytes, 2).unwrap());
    }
    let error = json(&lines[1]);
    assert_eq!(error["file"], broken.to_str().unwrap());
    assert!(error["error"].as_str().unwrap().contains("PNG or JPEG"));

    // --model: a file such as the coordinator's state/model.bin.
    let model = dir.path().join("model.bin");
    store::save(&model, &release(7)).unwrap();
    let (code, lines, stderr) = run_predict(&[
        &flag("--config"),
        &no_cache,
        &flag("--model"),
        &model,
        &images[0],
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&lines[0])["model_round"], 7);

    // --help says where the model comes from.
    let help = Command::new(env!("CARGO_BIN_EXE_fedge-edge"))
        .args(["predict", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(
        help.contains("--model") && help.contains("state/model.bin"),
        "{help}"
    );
}

#[test]
fn a_site_without_data_serves_a_pooled_release_with_the_federations_statistics() {
    let dir = tempfile::tempdir().unwrap();
    // A profile whose image folder holds nothing: a site that only serves.
    let empty = dir.path().join("images");
    std::fs::create_dir(&empty).unwrap();
    let path = profile(dir.path(), None);
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "kind = \"digits\"\ndomain = \"rot15\"",
        &format!("kind = \"imagefolder\"\nroot = {empty:?}"),
    );
    assert!(text.contains("imagefolder"), "{text}");
    std::fs::write(&path, text).unwrap();
    let image = dir.path().join("digit.png");
    std::fs::write(&image, digit_png(4)).unwrap();
    // A balanced release with the federation's pooled summary of some digits' features.
    let card = repo_root().join("models/assets/digits-conv.toml");
    let backbone = std::sync::Arc::new(fedge_edge::features::load_backbone(&card).unwrap().0);
    let set = fedge_edge::data::digits_domains(&[0.0], 1).remove(0).data;
    let features = fedge_edge::features::extract(&backbone, 0, &set, None).unwrap();
    let pooled = fedge_device::site_norm::summary_of(&features, 10).unwrap();
    let pooled_release = ModelRelease {
        feature_norm: fedge_wire::FeatureNorm::Balanced,
        pooled: Some(pooled.clone()),
        ..release(8)
    };
    let model = dir.path().join("model.bin");
    store::save(&model, &pooled_release).unwrap();
    let flag = |s: &str| PathBuf::from(s);
    let (code, lines, stderr) =
        run_predict(&[&flag("--config"), &path, &flag("--model"), &model, &image]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("pooled statistics"), "{stderr}");
    let stats = pooled.balanced_stats();
    let predictor = Predictor::new(backbone, pooled_release, stats).unwrap();
    let bytes = std::fs::read(&image).unwrap();
    assert_same(
        &json(&lines[0]),
        &predictor.predict_bytes(&bytes, 3).unwrap(),
    );
}
