//! `fedge bench buffered`: flags and tables of [`fedge::bench::buffered`].

use clap::Args;

use fedge_coordinator::buffer::{ParticipationWeight, StalenessWeight};

use crate::cli::args::FeatureArgs;

/// The flags of `fedge bench buffered`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct BufferedArgs {
    /// Seeds: each splits the digits into devices afresh, draws the stragglers and absences,
    /// and holds out another rotation.
    /// A count (5: seeds 0 to 4), a range (100..105) or a list (3,7,11).
    #[arg(long, default_value = "5")]
    pub seeds: crate::cli::seeds::Seeds,
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
    /// Draw the speed per rotation instead of per device: a whole domain is slow, as when
    /// one site's gateways are all on a slow link.
    #[arg(long)]
    pub slow_domains: bool,
    /// Buffered: the staleness weight, `inverse-sqrt` (1/√(1+s)) or `constant`.
    #[arg(long, default_value = StalenessWeight::default().name(), value_parser = staleness_parser())]
    pub staleness: StalenessWeight,
    /// Buffered: the participation weight, `none` (FedBuff) or `interval` (the samples times
    /// the versions since the device's last update counted); the coordinator's default.
    #[arg(long, default_value = ParticipationWeight::default().name(), value_parser = participation_parser())]
    pub participation: ParticipationWeight,
    #[command(flatten)]
    pub features: FeatureArgs,
}

/// Runs the three arms with every seed and prints each run, then the comparison.
pub fn run(args: BufferedArgs) -> anyhow::Result<()> {
    use fedge::bench::buffered as b;
    let options = b::BufferedOptions {
        seeds: args.seeds.0.clone(),
        clients_per_domain: args.clients_per_domain,
        sample: args.sample,
        rounds: args.rounds,
        buffer_size: args.buffer_size,
        max_staleness: args.max_staleness,
        local_epochs: args.local_epochs,
        offline: !args.always_online,
        slow_domains: args.slow_domains,
        staleness: args.staleness,
        participation: args.participation,
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
    let bar = indicatif::ProgressBar::new(options.seeds.len().max(1) as u64 * 3);
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
    if options.slow_domains {
        println!("speeds drawn per rotation: every device of a rotation is as slow as the others");
    }
    let report = b::Report::of(&runs);
    print!("{}", report.markdown());
    Ok(())
}

/// `--staleness`: the names `[aggregation] staleness` takes in TOML.
fn staleness_parser() -> impl clap::builder::TypedValueParser<Value = StalenessWeight> {
    use clap::builder::TypedValueParser;
    const WEIGHTS: [StalenessWeight; 2] = [StalenessWeight::InverseSqrt, StalenessWeight::Constant];
    clap::builder::PossibleValuesParser::new(WEIGHTS.map(StalenessWeight::name)).map(|name| {
        WEIGHTS
            .into_iter()
            .find(|w| w.name() == name)
            .unwrap_or_default()
    })
}

/// `--participation`: the names `[aggregation] participation` takes in TOML.
pub fn participation_parser() -> impl clap::builder::TypedValueParser<Value = ParticipationWeight> {
    use clap::builder::TypedValueParser;
    const WEIGHTS: [ParticipationWeight; 2] =
        [ParticipationWeight::None, ParticipationWeight::Interval];
    clap::builder::PossibleValuesParser::new(WEIGHTS.map(ParticipationWeight::name)).map(|name| {
        WEIGHTS
            .into_iter()
            .find(|w| w.name() == name)
            .unwrap_or_default()
    })
}
