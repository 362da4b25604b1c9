//! `fedge bench drift`: flags and tables of [`fedge::bench::drift`].

use clap::Args;

/// The flags of `fedge bench drift`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct DriftArgs {
    /// Requests of an unchanged site per seed and stream (independent, AR(1) 0.5 and 0.9), on
    /// which false alarms are counted.
    #[arg(long, default_value_t = 200_000)]
    pub requests: u64,
    /// Changes per seed and kind of change, on which the detection delay is measured.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Seeds, each a deployment: the digits dealt into sites afresh, its own requests. A count
    /// (5), a range (100..120) or a list (3,7,11). The detector's constants were set on none
    /// of the defaults.
    #[arg(long, default_value = "100..200")]
    pub seeds: crate::cli::seeds::Seeds,
    /// Seeds of the re-adaptation table (a deployed site holds about 150 images to score): a
    /// count, a range or a list, as --seeds.
    #[arg(long, default_value = "20")]
    pub adapt_seeds: crate::cli::seeds::Seeds,
    /// Seeds of the canary table (a head trained twice per seed): a count, a range or a list.
    #[arg(long, default_value = "100..120")]
    pub canary_seeds: crate::cli::seeds::Seeds,
    /// Canary stages per seed and candidate.
    #[arg(long, default_value_t = 20)]
    pub canary_trials: usize,
    /// Requests per canary device before a stage passes.
    #[arg(long, default_value_t = 500)]
    pub canary_requests: u64,
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
        seeds: args.seeds.0,
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
    for detector in b::Detector::ALL {
        println!(
            "{}: false alarms on an unchanged site, per deployment ({} seeds, {} requests each)",
            detector.name(),
            options.seeds.len(),
            options.requests
        );
        println!(
            "{:>10} {:>7} {:>9} {:>12} {:>8} {:>8} {:>8}",
            "stream", "alarms", "per 100k", "≤1 per 100k", "median", "p95", "worst"
        );
        for stream in b::Stream::ALL {
            let mut rates: Vec<f64> = report
                .quiet_of(detector, stream)
                .map(b::Quiet::rate)
                .collect();
            rates.sort_by(f64::total_cmp);
            let alarms: u64 = report.quiet_of(detector, stream).map(|q| q.alarms).sum();
            let requests: u64 = report.quiet_of(detector, stream).map(|q| q.requests).sum();
            let n = rates.len().max(1);
            let at = |q: f64| rates.get(((q * n as f64).ceil() as usize).clamp(1, n) - 1);
            let show = |v: Option<&f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            println!(
                "{:>10} {:>7} {:>9.2} {:>11.0}% {:>8} {:>8} {:>8}",
                stream.name(),
                alarms,
                alarms as f64 * 1e5 / requests.max(1) as f64,
                rates.iter().filter(|r| **r <= 1.0).count() as f64 * 100.0 / n as f64,
                show(at(0.5)),
                show(at(0.95)),
                show(rates.last())
            );
        }
        println!(
            "{}: requests from the change to the alarm ({} trials per seed and change; missed: \
             none within {}); cost: the accuracy the change takes from a head trained on the \
             federation (points, mean over seeds)",
            detector.name(),
            options.trials,
            b::MAX_DELAY
        );
        println!(
            "{:>24} {:>7} {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9}",
            "change", "median", "p95", "max", "≤300", "caught", "missed", "early", "cost (pt)"
        );
        for c in report.caught.iter().filter(|c| c.detector == detector) {
            let show = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
            println!(
                "{:>24} {:>7} {:>7} {:>7} {:>7.1}% {:>7} {:>7} {:>7} {:>9}",
                c.change.name(),
                show(c.quantile(0.5)),
                show(c.quantile(0.95)),
                show(c.delays.last().copied()),
                c.caught_within(300) * 100.0,
                c.delays.len(),
                c.missed,
                c.early,
                c.cost().map_or("-".to_owned(), |c| format!("{c:.1}"))
            );
        }
    }
    let stages = b::canary::run(
        &backbone,
        &args.canary_seeds.0,
        args.canary_trials,
        args.canary_requests,
    )?;
    println!(
        "canary stages of three devices ({}), each candidate against the release it replaces \
         on the same requests; rolled back when a majority of the canaries object (≥ {} \
         confident answers, more than {:.0}% of them changed), passed after {} requests each",
        b::canary::CANARY_SENSORS.join(", "),
        fedge_wire::head_check::MIN_CONFIDENT,
        fedge_wire::head_check::MAX_CHANGED * 100.0,
        args.canary_requests
    );
    println!(
        "{:>10} {:>7} {:>12} {:>16} {:>16}",
        "candidate", "stages", "rolled back", "requests (med)", "changed (med)"
    );
    for s in &stages {
        let median = |v: &[u64]| v.get(v.len() / 2).map_or("-".to_owned(), |v| v.to_string());
        let changed = s.changed.get(s.changed.len() / 2).copied().unwrap_or(0.0);
        println!(
            "{:>10} {:>7} {:>11.1}% {:>16} {:>15.1}%",
            s.candidate,
            s.trials,
            s.rolled_back.len() as f64 * 100.0 / s.trials.max(1) as f64,
            median(&s.rolled_back),
            changed * 100.0
        );
    }
    let adapted = b::adaptation(&backbone, &args.adapt_seeds.0, args.window)?;
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
