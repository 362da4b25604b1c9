//! `fedge bench infer`: the latency of one prediction (batch 1) with a released head over a
//! backbone, as a device answers `POST /v1/predict`, and the memory it takes.
//!
//! Writes what `bench/infer_ort.py` needs to run onnxruntime on the same work: the release
//! (`model.bin`, to export with `fedge-coordinator export`), the images (`images.f32`, raw
//! values at the card's input size) and fedge's logits (`logits.f32`), both little-endian.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use fedge_edge::inference::{Predictor, store};
use fedge_models::HeadConfig;
use fedge_wire::{ModelRelease, TensorF32};

/// The flags of `fedge bench infer`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct InferArgs {
    /// A model card or an `.onnx` file with its card beside it (default: the built-in
    /// `digits-conv`).
    #[arg(long, value_name = "PATH.onnx")]
    pub backbone: Option<PathBuf>,
    /// Predictions timed, one image each.
    #[arg(long, default_value_t = 300)]
    pub requests: usize,
    /// The head's projector width.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// The head's classes.
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
    /// Folder for the release, the images, the logits and `fedge.json` (the figures).
    #[arg(long, value_name = "DIR", default_value = "target/bench-infer")]
    pub out: PathBuf,
}

/// Latency percentiles of a set of timings, in milliseconds.
fn percentiles(mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    serde_json::json!({"p50_ms": at(0.5), "p99_ms": at(0.99), "mean_ms": mean})
}

/// Times predictions image by image, from card-shaped raw values and from PNG files' bytes.
pub fn run(args: InferArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.requests >= 1, "--requests must be at least 1");
    let rss_before = fedge_edge::resources::rss_mib();
    let (backbone, _) = fedge::eval::load_backbone(args.backbone.as_deref())?;
    let backbone = Arc::new(backbone);
    let card = backbone.card().clone();
    let head = HeadConfig::new(card.feature_size, args.classes).with_hidden(args.hidden);
    let params = head.init_flat(7);
    let release = ModelRelease {
        pooled: None,
        federation: "bench".into(),
        run: 1,
        round: 1,
        strategy: "fedavg".into(),
        classes: fedge_wire::numbered_classes(args.classes),
        backbone: card.name.clone(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head: head.clone(),
        feature_norm: fedge_wire::FeatureNorm::None,
    };
    let predictor = Predictor::new(Arc::clone(&backbone), release.clone(), None)?;
    // Deterministic images on the card's raw scale, whole numbers so PNG keeps them.
    let per_image = card.input_len();
    let images: Vec<f32> = (0..args.requests * per_image)
        .map(|i| (((i * 2_654_435_761usize) >> 7) % 256) as f32 * card.raw_max / 255.0)
        .collect();
    let pngs = (images.chunks_exact(per_image))
        .map(|x| png(x, &card))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let model_loaded = fedge_edge::resources::rss_mib();

    // Warm-up: the batch-1 plan and the allocator.
    for image in images.chunks_exact(per_image).take(10) {
        backbone.features(image, 1)?;
    }
    let mut model_ms = Vec::with_capacity(args.requests);
    let mut logits = Vec::with_capacity(args.requests * args.classes);
    for image in images.chunks_exact(per_image) {
        let start = Instant::now();
        let features = backbone.features(image, 1)?;
        let prediction = predictor.predict_features(&features, 3);
        model_ms.push(start.elapsed().as_secs_f64() * 1e3);
        logits.extend(prediction.logits);
    }
    let mut png_ms = Vec::with_capacity(args.requests);
    for bytes in &pngs {
        let start = Instant::now();
        predictor.predict_bytes(bytes, 3)?;
        png_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    store::save(&args.out.join("model.bin"), &release)?;
    write_f32(&args.out.join("images.f32"), &images)?;
    write_f32(&args.out.join("logits.f32"), &logits)?;
    let figures = serde_json::json!({
        "backbone": card.name,
        "input": [card.channels, card.height, card.width],
        "head": [head.features, head.hidden, head.classes],
        "requests": args.requests,
        "model": percentiles(model_ms),
        "png": percentiles(png_ms),
        "rss_before_mib": rss_before,
        "rss_model_loaded_mib": model_loaded,
        "peak_rss_mib": fedge_edge::resources::peak_rss_mib(),
    });
    let path = args.out.join("fedge.json");
    std::fs::write(&path, serde_json::to_string_pretty(&figures)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "{}: {}x{}x{} -> {} -> {} -> {}, {} predictions at batch 1",
        card.name,
        card.channels,
        card.height,
        card.width,
        head.features,
        head.hidden,
        head.classes,
        args.requests
    );
    println!("| path | p50 ms | p99 ms | mean ms |\n|---|---|---|---|");
    for (name, key) in [
        ("image tensor → probabilities", "model"),
        ("PNG bytes → prediction", "png"),
    ] {
        let f = &figures[key];
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            f["p50_ms"].as_f64().unwrap_or(0.0),
            f["p99_ms"].as_f64().unwrap_or(0.0),
            f["mean_ms"].as_f64().unwrap_or(0.0)
        );
    }
    let mib = |v: &serde_json::Value| v.as_f64().map_or("?".into(), |m| format!("{m:.1}"));
    println!(
        "RSS before loading {} MiB, with the model loaded {} MiB, peak {} MiB; figures in {}",
        mib(&figures["rss_before_mib"]),
        mib(&figures["rss_model_loaded_mib"]),
        mib(&figures["peak_rss_mib"]),
        path.display()
    );
    Ok(())
}

/// One card-shaped raw image as an 8-bit PNG (gray for one channel, RGB for three).
fn png(raw: &[f32], card: &fedge_models::ModelCard) -> anyhow::Result<Vec<u8>> {
    let plane = card.height * card.width;
    let byte = |v: f32| (v * 255.0 / card.raw_max).round().clamp(0.0, 255.0) as u8;
    let (w, h) = (card.width as u32, card.height as u32);
    let mut out = std::io::Cursor::new(Vec::new());
    let written = if card.channels == 1 {
        image::GrayImage::from_raw(w, h, raw.iter().map(|&v| byte(v)).collect())
            .map(|i| i.write_to(&mut out, image::ImageFormat::Png))
    } else {
        let rgb = (0..plane)
            .flat_map(|p| (0..3).map(move |c| (c.min(card.channels - 1), p)))
            .map(|(c, p)| byte(raw[c * plane + p]))
            .collect();
        image::RgbImage::from_raw(w, h, rgb).map(|i| i.write_to(&mut out, image::ImageFormat::Png))
    };
    written.context("the card's input size does not make an image")??;
    Ok(out.into_inner())
}

fn write_f32(path: &std::path::Path, values: &[f32]) -> anyhow::Result<()> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
