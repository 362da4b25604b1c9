//! A federation that trains the backbone's tail with the head (the simulator, the real
//! coordinator and device machines, Burn training through the tail), its release exported to
//! ONNX, and the exported file run by onnxruntime and by tract: the device's own answers (the
//! backbone up to the cut, then the trained tail and head in fedge's code) within 1e-4.

use std::path::PathBuf;
use std::sync::Arc;

use fedge_coordinator::boot::Plan;
use fedge_coordinator::{RoundConfig, StrategyConfig};
use fedge_device::FeatureSet;
use fedge_device::train::DeviceData;
use fedge_models::{Backbone, ModelCard, ModelLayout, Tail};
use fedge_sim::{CoordinatorSpec, DeviceSpec, Sim};
use fedge_wire::layout::{HeadTensors, TailTensors};
use fedge_wire::{Codec, FeatureNorm, ModelRelease, TrainParams};
use serde_json::Value;

use crate::common;
use crate::common::onnxruntime::{assert_close, softmax};
use crate::use_model::write_site;

fn card_path() -> PathBuf {
    common::repo_root().join("models/assets/digits-conv.toml")
}

/// The images' 8-bit pixels as the device reads them, and their labels from the folder names.
fn read_images(files: &[PathBuf], classes: &[String]) -> (Vec<f32>, Vec<u32>) {
    let mut raw = Vec::new();
    let mut labels = Vec::new();
    for file in files {
        let pixels = image::open(file).unwrap().to_luma8();
        raw.extend(pixels.iter().map(|&p| f32::from(p)));
        let class = file
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy();
        labels.push(classes.iter().position(|c| *c == class).unwrap() as u32);
    }
    (raw, labels)
}

/// The cut's activations of `files`, with their labels.
fn cut_rows(cut: &Backbone, files: &[PathBuf], classes: &[String]) -> FeatureSet {
    let (raw, labels) = read_images(files, classes);
    FeatureSet {
        dim: cut.card().feature_size,
        features: cut.features_of(&raw, (1, 8, 8), 255.0, 16).unwrap(),
        labels,
    }
}

#[test]
fn a_tail_trained_federation_exports_a_model_onnxruntime_runs_as_the_device_does() {
    let dir = tempfile::tempdir().unwrap();
    let card = ModelCard::load(&card_path()).unwrap();
    let onnx = std::fs::read(card.onnx_path(&card_path())).unwrap();
    let tail = Arc::new(Tail::read(&card, &onnx, None).unwrap());
    let cut = Backbone::from_bytes(tail.cut_card(&card), &onnx, &card_path()).unwrap();
    let classes = fedge_sim::class_names(10);
    let head = fedge_models::HeadConfig::new(card.feature_size, 10).with_tail(tail.config);

    // Two sites of rotated digits train three rounds of FedAvg, the tail with the head.
    let mut sim = Sim::new(5);
    let train = TrainParams {
        local_epochs: 2,
        batch_size: 16,
        learning_rate: 0.05,
        feature_norm: FeatureNorm::None,
        update_codec: Codec::F32,
        ..TrainParams::default()
    };
    let round = RoundConfig {
        federation: "tail".into(),
        classes: classes.clone(),
        head: Some(head.clone()),
        rounds: 3,
        min_clients: 2,
        min_updates: 2,
        round_timeout_ms: 60_000,
        train,
        ..RoundConfig::default()
    };
    let initial = ModelLayout::new(head.clone(), false).init_flat(3);
    sim.add_coordinator(CoordinatorSpec {
        plan: Plan {
            round,
            strategy: StrategyConfig::default(),
            noise_seed: None,
            initial: initial.clone(),
        },
        upstream: None,
    })
    .unwrap();
    for site in 0..2 {
        let files = write_site(&dir.path().join(format!("site-{site}")), site, &[], 200);
        let (train, val) = files.split_at(160);
        let data = DeviceData::new(
            Arc::new(cut_rows(&cut, train, &classes)),
            Arc::new(cut_rows(&cut, val, &classes)),
            None,
        );
        let mut device = DeviceSpec::new(&format!("site-{site}"), "tail", head.clone(), data);
        device.tail = Some(Arc::clone(&tail));
        sim.add_device(device).unwrap();
    }
    assert!(
        sim.run_to_finish(0, 10_000_000),
        "the federation did not finish"
    );
    let coordinator = sim.coordinator(0).unwrap();
    let release = coordinator.release(3).expect("a release of round 3");
    assert_eq!(
        release.head.tail,
        Some(tail.config),
        "the release names its tail"
    );
    let params = release.verify().unwrap();
    let offsets = head.split_tail(&params).unwrap().unwrap();
    let moved = offsets.weight.iter().map(|v| v.abs()).fold(0.0, f32::max);
    assert!(
        moved > 1e-3,
        "the tail trained: its largest offset is {moved}"
    );

    // Exported over the whole backbone; its card is what a user's runtime reads.
    let out = dir.path().join("export/model.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let exported =
        fedge_coordinator::export::write_export(&release, &card, &onnx, None, &out).unwrap();
    let exported_card = exported.card;

    // The device's answers: the backbone up to the cut (tract), then the trained tail and the
    // head in fedge's own code.
    let unseen = write_site(&dir.path().join("unseen"), 4, &[], 24);
    let (raw, _) = read_images(&unseen, &classes);
    let activations = cut.features_of(&raw, (1, 8, 8), 255.0, 8).unwrap();
    let features = tail.apply(&offsets, &activations);
    let plain = fedge_models::HeadConfig {
        tail: None,
        ..head.clone()
    };
    let tensors: HeadTensors<'_, f32> = plain.split(&params[head.tail_params()..]).unwrap();
    let mut logits = fedge_models::Forward::new(&plain);
    let device: Vec<Value> = (features.chunks_exact(head.features))
        .map(|x| Value::from(logits.logits(&tensors, x).to_vec()))
        .collect();

    // tract, reading the exported card as fedge's own loader does.
    let tract = Backbone::load(&exported_card).unwrap();
    for (image, expected) in raw.chunks_exact(64).zip(&device) {
        let probabilities = tract.features_of(image, (1, 8, 8), 255.0, 1).unwrap();
        assert_close(&Value::from(probabilities), &softmax(expected), 1e-4);
    }
    // onnxruntime, as a user outside fedge runs the file.
    let Some(python) = common::onnxruntime::python() else {
        return;
    };
    let answers = common::onnxruntime::predict(&python, &exported_card, &unseen);
    assert_eq!(answers.len(), unseen.len());
    for (answer, expected) in answers.iter().zip(&device) {
        assert_close(&answer["logits"], expected, 1e-4);
    }
    // The backbone's own tail would answer otherwise: what agrees is the trained one.
    let tail_config = head.tail.unwrap();
    let (weight, bias) = (
        vec![0.0; tail_config.weight_len()],
        vec![0.0; tail_config.channels],
    );
    let frozen = tail.apply(
        &TailTensors {
            weight: &weight,
            bias: &bias,
        },
        &activations,
    );
    let gap = (frozen.chunks_exact(head.features).zip(&device))
        .map(|(x, expected)| {
            let frozen = logits.logits(&tensors, x);
            (expected.as_array().unwrap().iter().zip(frozen))
                .map(|(e, f)| (e.as_f64().unwrap() as f32 - f).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max);
    assert!(gap > 1e-3, "the trained tail moves the logits by {gap}");
}

/// Waits for `path` to hold a release of `round`, for up to `within`.
fn release_at(path: &std::path::Path, round: u64, within: std::time::Duration) -> ModelRelease {
    let end = std::time::Instant::now() + within;
    loop {
        if let Ok(release) = fedge_coordinator::export::read_release(path)
            && release.round >= round
        {
            return release;
        }
        assert!(
            std::time::Instant::now() < end,
            "no release of round {round} in {}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn deployed_devices_train_the_tail_and_serve_what_the_exported_file_answers() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_site(&root.join("site-a"), 0, &[], 300);
    write_site(&root.join("site-b"), 2, &[], 300);
    let unseen = write_site(&root.join("unseen"), 4, &[], 20);
    // The coordinator's [head.tail], as `fedge-edge check` prints it for this backbone.
    let card = ModelCard::load(&card_path()).unwrap();
    let onnx = std::fs::read(card.onnx_path(&card_path())).unwrap();
    let tail = Tail::read(&card, &onnx, None).unwrap();
    let classes: String = (0..10).map(|k| format!("{k}\n")).collect();
    std::fs::write(root.join("classes.txt"), classes).unwrap();
    let coordinator = root.join("coordinator.toml");
    std::fs::write(
        &coordinator,
        format!(
            "federation = \"tail\"\nrounds = 2\nmin_clients = 2\nmin_updates = 2\n\
             round_timeout_s = 120\nstate_dir = \"state\"\n\n\
             [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
             [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n[head.tail]\n{}\n\
             [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n\n\
             [train]\nlocal_epochs = 2\nfeature_norm = \"none\"\nupdate_codec = \"f32\"\n",
            toml::to_string(&tail.config).unwrap()
        ),
    )
    .unwrap();
    let profiles: Vec<PathBuf> = ["site-a", "site-b"]
        .iter()
        .map(|id| {
            let path = root.join(format!("{id}.toml"));
            let profile = format!(
                "client_id = \"{id}\"\nfederation = \"tail\"\nhidden = 16\nseed = 1\n\
                 train_tail = true\ncache_dir = \"cache-{id}\"\nbackbone = {:?}\n\n\
                 [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
                 [data]\nkind = \"imagefolder\"\nroot = \"{id}\"\n",
                card_path()
            );
            std::fs::write(&path, profile).unwrap();
            path
        })
        .collect();
    let _agents: Vec<_> = (profiles.iter())
        .map(|p| crate::use_model::spawn(&crate::use_model::edge_binary(), &["run", "--config"], p))
        .collect();
    let mut coordinator = crate::use_model::spawn(
        &common::coordinator_binary(),
        &["run", "--config"],
        &coordinator,
    );
    let within = std::time::Duration::from_secs(240);
    let model = release_at(&root.join("state/model.bin"), 2, within);
    assert_eq!(model.head.tail, Some(tail.config));
    let status = coordinator.0.wait().unwrap();
    assert!(status.success(), "coordinator: {status}");
    // The device kept the final release; it answers with it through the tail.
    let kept = root.join("cache-site-a/site-a.model.bin");
    let kept = release_at(&kept, 2, std::time::Duration::from_secs(30));
    assert_eq!(kept.sha256, model.sha256);
    let out = common::succeeded(
        std::process::Command::new(crate::use_model::edge_binary())
            .args(["predict", "--config"])
            .arg(&profiles[0])
            .args(&unseen),
    );
    let lines = common::json_lines(&out.stdout);
    assert_eq!(lines.len(), unseen.len());
    // The release exported by the coordinator's command, run by onnxruntime.
    let exported = root.join("export/model.onnx");
    common::succeeded(
        std::process::Command::new(common::coordinator_binary())
            .args(["export", "--state"])
            .arg(root.join("state"))
            .arg("--backbone")
            .arg(card_path())
            .arg("--out")
            .arg(&exported),
    );
    let Some(python) = common::onnxruntime::python() else {
        return;
    };
    let answers = common::onnxruntime::predict(&python, &exported.with_extension("toml"), &unseen);
    for (answer, line) in answers.iter().zip(&lines) {
        assert_eq!(answer["class"], line["class"], "{answer}");
        assert_close(&answer["logits"], &line["logits"], 1e-4);
    }
}
