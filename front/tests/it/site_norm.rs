//! A site-normalised model used as a deployment uses it: `fedge-edge site-stats` on the site,
//! `fedge-edge predict` with the site's own statistics, and `fedge-coordinator export
//! --site-stats` whose ONNX file, run by tract and by onnxruntime, gives the same logits.

use std::path::Path;
use std::process::Command;

use fedge_wire::{FeatureNorm, FeatureStats, Message, ModelRelease, TensorF32};
use serde_json::Value;

use crate::common;
use crate::use_model::{edge_binary, write_site};

fn close(a: &Value, b: &Value, tolerance: f64) -> bool {
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() <= tolerance)
}

#[test]
fn a_site_normalised_model_predicts_and_exports_with_the_sites_own_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A site seen by a dim sensor: rot30's digits, every pixel at 60 %.
    let images = write_site(&root.join("site"), 2, &[], 60);
    for path in &images {
        let mut image = image::open(path).unwrap().to_luma8();
        image
            .pixels_mut()
            .for_each(|p| p.0[0] = (f32::from(p.0[0]) * 0.6) as u8);
        image.save(path).unwrap();
    }
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let profile = root.join("site.toml");
    std::fs::write(
        &profile,
        format!(
            "client_id = \"dim\"\nfederation = \"f\"\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache\"\nbackbone = {card:?}\n\n[broker]\nhost = \"127.0.0.1\"\n\n\
             [data]\nkind = \"imagefolder\"\nroot = \"site\"\n"
        ),
    )
    .unwrap();

    // The site's statistics, as the site computes them.
    let out = common::succeeded(
        Command::new(edge_binary())
            .current_dir(root)
            .args(["site-stats", "--config"])
            .arg(&profile),
    );
    let stats: FeatureStats = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats.mean.len(), 512);
    assert!(stats.inv_std.iter().all(|s| s.is_finite() && *s > 0.0));
    let stats_file = root.join("site-stats.json");
    std::fs::write(&stats_file, &out.stdout).unwrap();

    // A site-normalised head (random, so every logit matters), kept as the coordinator keeps
    // its release.
    let head = fedge_wire::HeadConfig::new(512, 10).with_hidden(16);
    let params = head.init_flat(7);
    let release = ModelRelease {
        pooled: None,
        federation: "f".into(),
        run: 1,
        round: 5,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| k.to_string()).collect(),
        backbone: "digits-conv".into(),
        head,
        feature_norm: FeatureNorm::Site,
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
    };
    let model = root.join("model.bin");
    std::fs::write(&model, fedge_wire::encode(&Message::Model(release.clone()))).unwrap();

    let picked: Vec<_> = images.iter().step_by(7).cloned().collect();
    let out = common::succeeded(
        Command::new(edge_binary())
            .current_dir(root)
            .args(["predict", "--config"])
            .arg(&profile)
            .arg("--model")
            .arg(&model)
            .args(&picked),
    );
    let lines = common::json_lines(&out.stdout);
    assert_eq!(lines.len(), picked.len());

    // Exported without the statistics: refused with what to do.
    let exported = root.join("export/model.onnx");
    std::fs::create_dir_all(exported.parent().unwrap()).unwrap();
    let export = |site_stats: bool| {
        let mut command = Command::new(common::coordinator_binary());
        command
            .args(["export", "--model"])
            .arg(&model)
            .arg("--backbone")
            .arg(&card)
            .arg("--out")
            .arg(&exported);
        if site_stats {
            command.arg("--site-stats").arg(&stats_file);
        }
        command.output().unwrap()
    };
    let refused = export(false);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--site-stats") && stderr.contains("fedge-edge site-stats"),
        "{stderr}"
    );
    assert!(export(true).status.success());

    // The exported file by tract and by onnxruntime: fedge's logits within 1e-4.
    let card_path = exported.with_extension("toml");
    let tract = fedge_models::Backbone::load(&card_path).unwrap();
    let logits_card = logits_of(&card_path);
    for (line, image) in lines.iter().zip(&picked) {
        let raw = pixels(image);
        let logits = logits_card.features_of(&raw, (1, 8, 8), 255.0, 1).unwrap();
        assert!(close(&Value::from(logits), &line["logits"], 1e-4), "{line}");
        let probabilities = tract.features_of(&raw, (1, 8, 8), 255.0, 1).unwrap();
        assert!((probabilities.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
    // The same head without site normalisation answers differently: the statistics are in the
    // file, in front of the head.
    let plain_model = root.join("plain.bin");
    let plain_release = ModelRelease {
        feature_norm: FeatureNorm::None,
        ..release.clone()
    };
    std::fs::write(
        &plain_model,
        fedge_wire::encode(&Message::Model(plain_release)),
    )
    .unwrap();
    let plain_out = root.join("export/plain.onnx");
    common::succeeded(
        Command::new(common::coordinator_binary())
            .args(["export", "--model"])
            .arg(&plain_model)
            .arg("--backbone")
            .arg(&card)
            .arg("--out")
            .arg(&plain_out),
    );
    let plain = logits_of(&plain_out.with_extension("toml"));
    let logits = plain
        .features_of(&pixels(&picked[0]), (1, 8, 8), 255.0, 1)
        .unwrap();
    assert!(!close(&Value::from(logits), &lines[0]["logits"], 1e-3));
    if let Some(python) = common::onnxruntime::python() {
        let answers = common::onnxruntime::predict(&python, &card_path, &picked);
        for (answer, line) in answers.iter().zip(&lines) {
            assert_eq!(answer["class"], line["class"], "{answer}");
            assert!(close(&answer["logits"], &line["logits"], 1e-4), "{answer}");
        }
    }
}

/// An image file's 8-bit grey values.
fn pixels(path: &Path) -> Vec<f32> {
    let image = image::open(path).unwrap().to_luma8();
    image.iter().map(|&p| f32::from(p)).collect()
}

/// The exported model at `card` (its card beside it) with its `logits` output read instead of
/// the probabilities, through a card written next to it.
fn logits_of(card: &Path) -> fedge_models::Backbone {
    let text = std::fs::read_to_string(card).unwrap();
    let logits = card.with_file_name(format!(
        "{}-logits.toml",
        card.file_stem().unwrap().to_string_lossy()
    ));
    let text = text.replace(
        "output_name = \"probabilities\"",
        "output_name = \"logits\"",
    );
    std::fs::write(&logits, text).unwrap();
    fedge_models::Backbone::load(&logits).unwrap()
}
