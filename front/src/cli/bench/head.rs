//! `fedge bench head`: flags and table of [`fedge::bench::head`].

use clap::Args;
use fedge_models::Backend;

use crate::cli::args::{HeadShapeArgs, JsonArgs, TimingArgs, backend_parser};

/// The flags of `fedge bench head`.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(
    mut_arg("hidden", |a| a.default_value("128")),
    mut_arg("json", |a| a.help("Also write the measurements as JSON here (read by bench/head_torch.py)")),
)]
pub struct HeadArgs {
    /// Backends to time, side by side (`ndarray` beside `flex` in a build with
    /// `--features ndarray`).
    #[arg(long, value_delimiter = ',', default_value = "flex", value_parser = backend_parser())]
    pub backends: Vec<Backend>,
    /// Threads a batch may be split across, each timed side by side (1: one thread).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    #[command(flatten)]
    pub shape: HeadShapeArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Trains the head on every backend and prints samples per second.
pub fn run(args: HeadArgs) -> anyhow::Result<()> {
    let (shape, t) = (&args.shape, &args.timing);
    let head = shape.head();
    println!(
        "head {}->{}->{}, {} samples x {} epochs, batch {}, median of {} runs",
        shape.features, shape.hidden, shape.classes, t.samples, t.epochs, t.batch_size, t.repeats
    );
    let mut results = fedge::bench::head::run(
        &head,
        t.samples,
        t.epochs,
        t.batch_size,
        t.repeats,
        &args.backends,
        &args.threads,
    );
    results.push(fedge::bench::head::plain(
        &head,
        t.samples,
        t.epochs,
        t.batch_size as usize,
        t.repeats,
    ));
    let base = results.first().map(|r| r.samples_per_s).unwrap_or(1.0);
    println!(
        "{:>9}  {:>7}  {:>12}  {:>8}  {:>10}",
        "backend", "threads", "samples/s", "ratio", "final loss"
    );
    for r in &results {
        println!(
            "{:>9}  {:>7}  {:>12.0}  {:>8.2}  {:>10.4}",
            r.backend,
            r.threads,
            r.samples_per_s,
            r.samples_per_s / base,
            r.final_loss
        );
    }
    let train = fedge_wire::TrainParams::default();
    args.json.write(&serde_json::json!({
        "features": shape.features, "hidden": shape.hidden, "classes": shape.classes,
        "samples": t.samples, "epochs": t.epochs, "batch_size": t.batch_size,
        "learning_rate": train.learning_rate,
        "momentum": train.momentum,
        "weight_decay": train.weight_decay,
        "results": results,
    }))
}
