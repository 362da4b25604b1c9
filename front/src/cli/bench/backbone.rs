//! `fedge bench backbone`: a backbone's feature extraction speed with tract, per batch size.

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench backbone`.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(mut_arg("json", |a| a.help(
    "Also write images per second per batch size as JSON here (read by bench/backbone_ort.py, \
     which runs onnxruntime on the same file)"
)))]
pub struct BackboneArgs {
    /// A model card or an `.onnx` file with its card beside it (default: the built-in
    /// `digits-conv`).
    #[arg(long, value_name = "PATH.onnx")]
    pub backbone: Option<PathBuf>,
    /// Images per measurement.
    #[arg(long, default_value_t = 256)]
    pub images: usize,
    /// Batch sizes to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub batch: Vec<usize>,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Times the backbone on deterministic images at each batch size.
pub fn run(args: BackboneArgs) -> anyhow::Result<()> {
    let (backbone, _) = fedge::eval::load_backbone(args.backbone.as_deref())?;
    let card = backbone.card().clone();
    // Deterministic images on the card's raw scale.
    let images: Vec<f32> = (0..args.images * card.input_len())
        .map(|i| ((i * 2_654_435_761usize) >> 7) as f32 % (card.raw_max + 1.0))
        .collect();
    println!(
        "{}: {}x{}x{} -> {} features, {} images",
        card.name, card.channels, card.height, card.width, card.feature_size, args.images
    );
    println!("| batch | ms per image | images/s |\n|---|---|---|");
    let mut rows = Vec::new();
    for &batch in &args.batch {
        backbone.features(&images[..card.input_len() * batch.max(1)], batch)?;
        let start = std::time::Instant::now();
        backbone.features(&images, batch)?;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "| {batch} | {:.3} | {:.0} |",
            secs * 1e3 / args.images as f64,
            args.images as f64 / secs
        );
        rows.push(serde_json::json!({"batch": batch, "images_per_s": args.images as f64 / secs}));
    }
    args.json
        .write(&serde_json::json!({"backbone": card.name, "images": args.images, "tract": rows}))
}
