//! `fedge bench drift`: flags and tables of [`fedge::bench::drift`].

use clap::Args;

/// The flags of `fedge bench drift`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct DriftArgs {
    /// Requests of an unchanged site per seed, on which false alarms are counted.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Sensor switches per seed and sensor, on which the detection delay is measured.
    #[arg(long, default_value_t = 200)]
    pub trials: usize,
    /// Seeds: each deals the digits into sites afresh and draws its own requests.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3,4")]
    pub seeds: Vec<u64>,
    /// Seeds of the re-adaptation table (a deployed site holds about 150 images to score).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19"
    )]
    pub adapt_seeds: Vec<u64>,
    /// Requests after a switch that the site re-estimates its statistics from (the
    /// re-adaptation table).
    #[arg(long, default_value_t = fedge_edge::inference::drift::RECENT_REQUESTS)]
    pub window: usize,
}

/// Prints false alarms per 100,000 requests per seed, then the delay per sensor switched to.
pub fn run(args: DriftArgs) -> anyhow::Result<()> {
    use fedge::bench::drift as b;
    let (backbone, _) = fedge::eval::load_backbone(None)?;
    let options = b::DriftOptions {
        requests: args.requests,
        trials: args.trials,
        seeds: args.seeds,
    };
    let report = b::run(&backbone, &options)?;
    println!("drift alarm on digits-sensor (digits-conv), a clean site switching sensor");
    println!("familiarity distance of what the site sees (over every seed)");
    println!(
        "{:>22} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "", "n", "median", "p99", "p99.9", "max"
    );
    for (what, values) in &report.distances {
        let at = |q: f64| {
            let n = values.len();
            values[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
        };
        println!(
            "{:>22} {:>7} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
            what,
            values.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        );
    }
    println!("false alarms on an unchanged site");
    println!(
        "{:>6} {:>10} {:>7} {:>10}",
        "seed", "requests", "alarms", "per 100k"
    );
    let (mut requests, mut alarms) = (0, 0);
    for q in &report.quiet {
        let rate = q.alarms as f64 * 1e5 / q.requests.max(1) as f64;
        println!(
            "{:>6} {:>10} {:>7} {:>10.2}",
            q.seed, q.requests, q.alarms, rate
        );
        requests += q.requests;
        alarms += q.alarms;
    }
    let rate = alarms as f64 * 1e5 / requests.max(1) as f64;
    println!("{:>6} {:>10} {:>7} {:>10.2}", "all", requests, alarms, rate);
    println!(
        "requests from the switch to the alarm ({} trials per seed and sensor; missed: none within {})",
        options.trials,
        b::MAX_DELAY
    );
    println!(
        "{:>12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "switch to", "median", "p95", "max", "caught", "missed", "early"
    );
    for c in &report.caught {
        let show = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        println!(
            "{:>12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
            c.sensor,
            show(c.quantile(0.5)),
            show(c.quantile(0.95)),
            show(c.delays.last().copied()),
            c.delays.len(),
            c.missed,
            c.early
        );
    }
    let adapted = b::adaptation(&backbone, &args.adapt_seeds, args.window)?;
    println!(
        "accuracy (%) of a deployed site's stream after a switch to the blurred sensor: clean \
         (before, balanced statistics of its own images), stale (after, the same statistics), \
         pooled (the federation's, the default), adapted (balanced, re-estimated from the first \
         {} requests after the switch or half the stream, the rest scored)",
        args.window
    );
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "seed", "clean", "stale", "pooled", "adapted", "gain"
    );
    let gains: Vec<f64> = adapted
        .iter()
        .map(|a| f64::from(a.adapted - a.stale) * 100.0)
        .collect();
    for (a, gain) in adapted.iter().zip(&gains) {
        println!(
            "{:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>+8.1}",
            a.seed,
            a.clean * 100.0,
            a.stale * 100.0,
            a.pooled * 100.0,
            a.adapted * 100.0,
            gain
        );
    }
    let mean = |f: fn(&b::Adapted) -> f32| {
        adapted.iter().map(|a| f64::from(f(a))).sum::<f64>() * 100.0 / adapted.len().max(1) as f64
    };
    let (gain, half) = fedge::eval::interval(&gains).unwrap_or((0.0, 0.0));
    println!(
        "{:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>+8.1}  (adapted - stale, paired 95% interval ±{:.1})",
        "mean",
        mean(|a| a.clean),
        mean(|a| a.stale),
        mean(|a| a.pooled),
        mean(|a| a.adapted),
        gain,
        half
    );
    Ok(())
}
