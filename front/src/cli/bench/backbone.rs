//! `fedge bench backbone`: a backbone's feature extraction speed per batch size, with tract
//! and, side by side, with an installed ONNX Runtime library (`[model] runtime =
//! "onnxruntime"`, the engine a device can load instead of tract).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fedge_models::{Backbone, Provider, Runtime, RuntimeConfig};

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench backbone`.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(mut_arg("json", |a| a.help(
    "Also write images per second per engine, thread count and batch size as JSON here (read \
     by bench/backbone_ort.py, which runs Python's onnxruntime on the same file)"
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
    /// Engines to time, each at every `--threads`: `tract` (on one thread unless built with
    /// the `tract-threads` feature) and `onnxruntime` (the library of `--onnxruntime-library`,
    /// CPU provider).
    #[arg(long, value_delimiter = ',', default_value = "tract")]
    pub runtime: Vec<Runtime>,
    /// The ONNX Runtime library (`libonnxruntime.so.1.x`, e.g. from the onnxruntime Python
    /// wheel's `onnxruntime/capi/`); default: `ORT_DYLIB_PATH`, else the loader's search.
    #[arg(long, value_name = "PATH")]
    pub onnxruntime_library: Option<PathBuf>,
    /// Threads per run to compare (0: one per core).
    #[arg(long, value_delimiter = ',', default_value = "1,0")]
    pub threads: Vec<usize>,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Times each engine on deterministic images at each batch size.
pub fn run(args: BackboneArgs) -> anyhow::Result<()> {
    let (tract, _) = fedge::eval::load_backbone(args.backbone.as_deref())?;
    let card = tract.card().clone();
    // Deterministic images on the card's raw scale.
    let images: Vec<f32> = (0..args.images * card.input_len())
        .map(|i| ((i * 2_654_435_761usize) >> 7) as f32 % (card.raw_max + 1.0))
        .collect();
    println!(
        "{}: {}x{}x{} -> {} features, {} images",
        card.name, card.channels, card.height, card.width, card.feature_size, args.images
    );
    // The model's bytes for the other engines and thread counts: the built-in backbone's are
    // compiled in, a card's are read once.
    let onnx: std::borrow::Cow<[u8]> = match &args.backbone {
        None => fedge_models::generate::DIGITS_CONV_ONNX.into(),
        Some(_) => std::fs::read(tract.origin())
            .with_context(|| format!("cannot read {}", tract.origin().display()))?
            .into(),
    };
    let mut engines: Vec<(String, usize, Backbone)> = Vec::new();
    for runtime in &args.runtime {
        let config = match runtime {
            Runtime::Tract => RuntimeConfig::tract(),
            Runtime::Onnxruntime => {
                RuntimeConfig::onnxruntime(args.onnxruntime_library.clone(), vec![Provider::Cpu])
            }
        };
        for &threads in &args.threads {
            if *runtime == Runtime::Tract && threads != 1 && !fedge_models::TRACT_THREADS_BUILT {
                eprintln!(
                    "tract at {} threads skipped: this build runs tract on one thread (build \
                     with --features tract-threads)",
                    threads_label(threads)
                );
                continue;
            }
            // The backbone loaded above is tract on one thread.
            let backbone = match (runtime, threads) {
                (Runtime::Tract, 1) => tract.clone(),
                _ => Backbone::from_bytes_with(
                    card.clone(),
                    &onnx,
                    tract.origin(),
                    &config,
                    threads,
                )?,
            };
            let name = match runtime {
                Runtime::Tract => "tract".to_string(),
                Runtime::Onnxruntime => format!("fedge + {}", backbone.runtime()),
            };
            engines.push((name, threads, backbone));
        }
    }
    println!("| engine | threads | batch | ms per image | images/s |\n|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (name, threads, backbone) in &engines {
        for &batch in &args.batch {
            // A warm-up batch: plans and sessions are made on first use of a size.
            backbone.features(&images[..card.input_len() * batch.max(1)], batch)?;
            let start = std::time::Instant::now();
            backbone.features(&images, batch)?;
            let secs = start.elapsed().as_secs_f64();
            let threads = threads_label(*threads);
            println!(
                "| {name} | {threads} | {batch} | {:.3} | {:.0} |",
                secs * 1e3 / args.images as f64,
                args.images as f64 / secs
            );
            rows.push(serde_json::json!({
                "engine": name,
                "runtime": backbone.runtime().runtime,
                "threads": threads,
                "batch": batch,
                "images_per_s": args.images as f64 / secs,
            }));
        }
    }
    args.json.write(&serde_json::json!({
        "backbone": card.name,
        "images": args.images,
        "rows": rows,
    }))
}

/// A thread count as the tables and the JSON give it: `all` for 0 (one per core).
fn threads_label(threads: usize) -> String {
    match threads {
        0 => "all".to_string(),
        n => n.to_string(),
    }
}
