//! `fedge bench gate`: flags and table of [`fedge::bench::gate`].

use clap::Args;

/// The flags of `fedge bench gate`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct GateArgs {
    /// Simulated sites per case.
    #[arg(long, default_value_t = 20_000)]
    pub trials: u32,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Prints how often each rule holds the candidate, case by case.
pub fn run(args: GateArgs) -> anyhow::Result<()> {
    use fedge::bench::gate as b;
    println!(
        "one evaluation site, served release right on {:.0} % of its images; held, in %",
        100.0 * b::SERVED
    );
    println!(
        "{:>6} {:>9} {:>9} {:>13} {:>17} {:>13}",
        "images", "disagree", "cand-serv", "paired exact", "paired simulated", "rule before"
    );
    for (i, case) in b::cases().into_iter().enumerate() {
        let r = b::rates(case, args.trials, args.seed.wrapping_add(i as u64));
        println!(
            "{:>6} {:>8.0}% {:>+9.1} {:>13.1} {:>17.1} {:>13.1}",
            case.images,
            100.0 * (case.gain + case.lose),
            case.difference_points(),
            100.0 * r.paired_exact,
            100.0 * r.paired_simulated,
            100.0 * r.before_simulated
        );
    }
    Ok(())
}
