//! `fedge bench feddim`: flags and tables of [`fedge::bench::feddim`].

use clap::Args;
use fedge_models::Backend;

use crate::cli::args::{HeadShapeArgs, TimingArgs};

/// The flags of `fedge bench feddim`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FeddimArgs {
    #[command(flatten)]
    pub shape: HeadShapeArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
}

/// Prints the insight bytes of three head shapes and the training time with and without it.
pub fn run(args: FeddimArgs) -> anyhow::Result<()> {
    use fedge::bench::feddim as b;
    println!("insight part of one update, postcard-encoded");
    println!(
        "{:>4} {:>5} {:>12} {:>12} {:>7}",
        "K", "H", "compact B", "full B", "ratio"
    );
    for (k, h) in [(10, 64), (10, 128), (65, 512)] {
        let r = b::insight_bytes(k, h);
        println!(
            "{:>4} {:>5} {:>12} {:>12} {:>7.1}",
            k,
            h,
            r.compact,
            r.full,
            r.full as f64 / r.compact as f64
        );
    }
    let (shape, t) = (&args.shape, &args.timing);
    let timing = b::timing(
        &shape.head(),
        t.samples,
        t.epochs,
        t.batch_size,
        t.repeats,
        Backend::default(),
    );
    println!(
        "local epoch, head {}->{}->{}, {} samples, batch {}, median of {}: ce {:.1} ms, feddim {:.1} ms, ratio {:.2}",
        shape.features,
        shape.hidden,
        shape.classes,
        t.samples,
        t.batch_size,
        t.repeats,
        timing.ce_epoch_s * 1e3,
        timing.feddim_epoch_s * 1e3,
        timing.feddim_epoch_s / timing.ce_epoch_s
    );
    Ok(())
}
