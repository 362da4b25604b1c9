//! `fedge bench buffered`: flags and tables of [`fedge::bench::buffered`].

use clap::Args;

use crate::cli::args::FeatureArgs;

/// The flags of `fedge bench buffered`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct BufferedArgs {
    /// Seeds: each splits the digits into devices afresh, draws the stragglers and absences,
    /// and holds out another rotation.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Devices per rotation (source domain).
    #[arg(long, default_value_t = 10)]
    pub clients_per_domain: usize,
    /// Devices per synchronous round, and devices training at once when buffered.
    #[arg(long, default_value_t = 10)]
    pub sample: usize,
    /// Synchronous rounds (buffered runs as many updates in all).
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    /// Buffered: updates per model version.
    #[arg(long, default_value_t = 5)]
    pub buffer_size: usize,
    /// Buffered: most versions an update may lag behind.
    #[arg(long, default_value_t = 10)]
    pub max_staleness: u64,
    /// Local epochs per training.
    #[arg(long, default_value_t = 3)]
    pub local_epochs: u32,
    /// Every device stays online (no absences; the speeds still differ).
    #[arg(long)]
    pub always_online: bool,
    #[command(flatten)]
    pub features: FeatureArgs,
}

/// Runs the three arms with every seed and prints each run, then the comparison.
pub fn run(args: BufferedArgs) -> anyhow::Result<()> {
    use fedge::bench::buffered as b;
    let options = b::BufferedOptions {
        seeds: args.seeds,
        clients_per_domain: args.clients_per_domain,
        sample: args.sample,
        rounds: args.rounds,
        buffer_size: args.buffer_size,
        max_staleness: args.max_staleness,
        local_epochs: args.local_epochs,
        offline: !args.always_online,
    };
    let spinner = indicatif::ProgressBar::new_spinner();
    let prepared = fedge::eval::prepare(
        &fedge::eval::Dataset::Digits,
        args.features.backbone.as_deref(),
        args.features.cache_dir().as_deref(),
        None,
        |domain| spinner.set_message(format!("features of {domain}")),
    )?;
    spinner.finish_and_clear();
    let bar = indicatif::ProgressBar::new(options.seeds.max(1) * 3);
    let runs = b::run(&prepared, &options, |_| bar.inc(1))?;
    bar.finish_and_clear();
    println!(
        "buffered (FedBuff) against synchronous rounds, FedAvg, rotated digits, {} devices per \
         rotation, {} training at once; 70 % nominal speed (1 s a training), 20 % ×5, 10 % ×20{}",
        options.clients_per_domain,
        options.sample,
        if options.offline {
            ", 30 % away in random windows"
        } else {
            ""
        }
    );
    let report = b::Report::of(&runs);
    print!("{}", report.markdown());
    Ok(())
}
