//! EfficientNet-Lite0 converted by `models/tools/fetch-efficientnet-lite0.sh`: tract runs it and
//! agrees with the converter's own numpy forward pass.
//!
//! The converted file is not in the repository. The test looks in `$FEDGE_BACKBONES` (default
//! `~/.cache/fedge/backbones`); without the file it says so and passes, unless
//! `FEDGE_REQUIRE_EFFICIENTNET=1` (set by CI, which runs the fetch script first).

use std::path::PathBuf;

use fedge_models::{Backbone, check_sample};

pub(crate) fn card_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("FEDGE_BACKBONES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/fedge/backbones"),
    };
    let path = dir.join("efficientnet-lite0.toml");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_EFFICIENTNET").as_deref() != Ok("1"),
        "{} is missing: run models/tools/fetch-efficientnet-lite0.sh",
        path.display()
    );
    eprintln!(
        "skipped: {} is missing (models/tools/fetch-efficientnet-lite0.sh makes it)",
        path.display()
    );
    None
}

#[test]
fn tract_agrees_with_the_converter_on_the_sample() {
    let Some(path) = card_path() else { return };
    let backbone = Backbone::load(&path).unwrap();
    let card = backbone.card();
    assert_eq!(
        (card.channels, card.feature_size, card.raw_max),
        (3, 1280, 255.0)
    );
    let check = check_sample(&backbone, &path)
        .unwrap()
        .expect("the converter writes a sample next to the card");
    eprintln!("{check:?}");
    assert!(check.agrees(), "{check:?}");
    assert!(
        check.max_abs > 0.1,
        "features of a real image are not all zero: {check:?}"
    );
}

/// tract on three threads gives the features of one: the threads split the depthwise
/// convolutions' channels and the matrix products' tiles, not a sum. Only in a build with the
/// opt-in `tract-threads` feature (`cargo test -p fedge --test it --features tract-threads`).
#[cfg(feature = "tract-threads")]
#[test]
fn tract_on_three_threads_gives_the_features_of_one() {
    let Some(path) = card_path() else { return };
    let runtime = fedge_models::RuntimeConfig::tract();
    let one = Backbone::load_with(&path, &runtime, 1).unwrap();
    let three = Backbone::load_with(&path, &runtime, 3).unwrap();
    let card = one.card();
    let images: Vec<f32> = (0..5 * card.input_len())
        .map(|i| ((i * 2_654_435_761usize) >> 9) as f32 % 256.0)
        .collect();
    let a = one.features(&images, 5).unwrap();
    let b = three.features(&images, 5).unwrap();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    eprintln!("largest difference, 1 against 3 threads: {diff:e}");
    assert!(diff <= 1e-4, "{diff}");
    assert!(a.iter().any(|v| *v > 0.1));
}

#[test]
fn grayscale_images_of_another_size_are_adapted_and_batched() {
    let Some(path) = card_path() else { return };
    let backbone = Backbone::load(&path).unwrap();
    // Three 28x28 grayscale images (Fashion-MNIST's shape) on 0..=255.
    let images: Vec<f32> = (0..3 * 28 * 28)
        .map(|i| ((i * 37) % 256) as f32 * ((i / 784) as f32 + 1.0) / 3.0)
        .collect();
    let all = backbone
        .features_of(&images, (1, 28, 28), 255.0, 2)
        .unwrap();
    assert_eq!(all.len(), 3 * 1280);
    assert!(all.iter().all(|v| v.is_finite()));
    let one = backbone
        .features_of(&images[2 * 784..], (1, 28, 28), 255.0, 1)
        .unwrap();
    let diff = one
        .iter()
        .zip(&all[2 * 1280..])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-4, "batching changes nothing: {diff}");
    assert_ne!(
        &all[..1280],
        &all[1280..2560],
        "different images, different features"
    );
}

#[test]
fn the_exported_model_agrees_with_fedge_in_onnxruntime() {
    let Some(path) = card_path() else { return };
    let Some(python) = crate::common::onnxruntime::python() else {
        return;
    };
    let backbone = std::sync::Arc::new(Backbone::load(&path).unwrap());
    let head = fedge_models::HeadConfig::new(1280, 4).with_hidden(32);
    let params = head.init_flat(3);
    let release = fedge_wire::ModelRelease {
        pooled: None,
        federation: "lite".into(),
        run: 1,
        round: 2,
        strategy: "fedavg".into(),
        classes: ["ok", "scratch", "dent", "stain"].map(String::from).into(),
        backbone: backbone.card().name.clone(),
        sha256: fedge_wire::ModelRelease::digest(&params),
        params: fedge_wire::TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lite.onnx");
    fedge_coordinator::export::export_files(&release, &path, None, &out).unwrap();
    // RGB pictures at the card's input size, so no resize differs between the two sides.
    let (h, w) = (backbone.card().height as u32, backbone.card().width as u32);
    let images: Vec<PathBuf> = (0..3u32)
        .map(|k| {
            let image = image::RgbImage::from_fn(w, h, |x, y| {
                image::Rgb([
                    (x * 7 + k * 50) as u8,
                    (y * 5) as u8,
                    ((x + y) * 3 + k) as u8,
                ])
            });
            let file = dir.path().join(format!("{k}.png"));
            image.save(&file).unwrap();
            file
        })
        .collect();
    let predictor = fedge_edge::inference::Predictor::new(backbone, release, None).unwrap();
    let answers =
        crate::common::onnxruntime::predict(&python, &out.with_extension("toml"), &images);
    for (answer, image) in answers.iter().zip(&images) {
        let ours = predictor.predict_file(image, 1).unwrap();
        let theirs: Vec<f64> = (answer["logits"].as_array().unwrap().iter())
            .map(|v| v.as_f64().unwrap())
            .collect();
        let worst = (ours.logits.iter().zip(&theirs))
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-4, "{}: {worst}", image.display());
        assert_eq!(answer["class"], ours.class.as_str());
    }
}
