//! `fedge bench labelling`: flags and tables of [`fedge::bench::labelling`].

use clap::Args;
use fedge::bench::labelling::{self as b, Difference, LabellingReport};

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench labelling`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct LabellingArgs {
    /// Seeds: each deals the digits afresh, and draws its own head, trainings and picks.
    /// A count (5: seeds 0 to 4), a range (100..105) or a list (3,7,11).
    #[arg(long, default_value = "5")]
    pub seeds: crate::cli::seeds::Seeds,
    /// Labels the deployed site can afford (the queue's places).
    #[arg(long, default_value_t = 50)]
    pub budget: usize,
    /// Requests the deployed (blurred) site serves before labelling; the rest of its images
    /// (about 900 in all) score it.
    #[arg(long, default_value_t = 600)]
    pub stream: usize,
    /// Rounds of the five training sites before the site labels.
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    /// Rounds with the site's update after it joined with its labels.
    #[arg(long, default_value_t = 10)]
    pub after: u64,
    /// Local epochs per round.
    #[arg(long, default_value_t = 5)]
    pub local_epochs: u32,
    /// The head's projector width.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// The federation's algorithm, spelled as in `fedge eval --algorithms`.
    #[arg(long, default_value = "fedavg")]
    pub algorithm: String,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Runs the three arms per seed under a progress bar, prints the table and the intervals.
pub fn run(args: LabellingArgs) -> anyhow::Result<()> {
    let algorithm = fedge::eval::parse_algorithm(&args.algorithm)?;
    let (backbone, _) = fedge::eval::load_backbone(None)?;
    let options = b::LabellingOptions {
        seeds: args.seeds.0.clone(),
        budget: args.budget,
        stream: args.stream,
        rounds: args.rounds,
        after: args.after,
        local_epochs: args.local_epochs,
        hidden: args.hidden,
    };
    // Three arms a seed; the labelling ones wait one round for the site to join.
    let per_seed = 3 * (options.rounds + options.after + 1);
    let bar = indicatif::ProgressBar::new(per_seed * options.seeds.len() as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} rounds, {msg} [{elapsed} / ~{duration}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = b::run(&backbone, &algorithm, &options, |tick| {
        bar.set_message(format!("seed {}, {} arm", tick.seed, tick.arm));
        bar.inc(1);
    });
    bar.finish_and_clear();
    let report = report?;
    print!("{}", markdown(&report));
    args.json.write(&report)
}

/// The per-seed table and the paired differences.
pub fn markdown(report: &LabellingReport) -> String {
    let o = &report.options;
    let mut out = format!(
        "labelling queue on digits-sensor (digits-conv, {}): a blurred site labels {} of {} \
         requests after round {}, then trains as a sixth site for {} rounds; accuracy (%) on its \
         held-out images\n\n",
        report.algorithm, o.budget, o.stream, o.rounds, o.after
    );
    out.push_str(
        "| seed | at deployment | no labels | random | queue | queue − random | queue, served per site | variant served | uncertainty random / queue | wrong random / queue | classes random / queue |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    let pct = |v: f32| f64::from(v) * 100.0;
    for s in &report.seeds {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:+.1} | {:.1} | {} | {:.2} / {:.2} | {} / {} | {} / {} |\n",
            s.seed,
            pct(s.before),
            pct(s.none),
            pct(s.random.accuracy),
            pct(s.queue.accuracy),
            pct(s.queue.accuracy - s.random.accuracy),
            pct(s.queue.served),
            s.queue.variant.name(),
            s.random.mean_uncertainty,
            s.queue.mean_uncertainty,
            s.random.wrong,
            s.queue.wrong,
            s.random.classes,
            s.queue.classes,
        ));
    }
    let n = report.seeds.len().max(1) as f64;
    let mean =
        |f: fn(&b::SeedResult) -> f32| report.seeds.iter().map(|s| pct(f(s))).sum::<f64>() / n;
    out.push_str(&format!(
        "| mean | {:.1} | {:.1} | {:.1} | {:.1} | {:+.1} | {:.1} | | | | |\n\n",
        mean(|s| s.before),
        mean(|s| s.none),
        mean(|s| s.random.accuracy),
        mean(|s| s.queue.accuracy),
        mean(|s| s.queue.accuracy - s.random.accuracy),
        mean(|s| s.queue.served),
    ));
    let line = |what: &str, d: &Option<Difference>| match d {
        Some(d) => format!(
            "{what}: {:+.1} points, 95 % interval [{:+.1}, {:+.1}], above zero in {}/{} seeds\n",
            d.mean, d.low, d.high, d.wins, d.seeds
        ),
        None => format!("{what}: no seeds\n"),
    };
    out.push_str(&line("queue − random", &report.queue_vs_random));
    out.push_str(&line("random − no labels", &report.random_vs_none));
    out.push_str(&line("queue − no labels", &report.queue_vs_none));
    out.push_str(&line(
        "queue, served per site − no labels",
        &report.served_vs_none,
    ));
    out.push_str(&line(
        "queue, served per site − queue in the federation only",
        &report.served_vs_queue,
    ));
    out.push_str(&line(
        "served per site: queue − random",
        &report.served_queue_vs_random,
    ));
    out.push_str(&line(
        "queue, served per site − label-free adaptation (balanced, no labels)",
        &report.served_vs_label_free,
    ));
    if let (Some(s), Some(d)) = (report.seeds.first(), &report.queue_vs_random) {
        out.push_str(&format!(
            "{} held-out images per seed (one image = {:.2} points); goal queue − random ≥ +2: {}\n",
            s.test,
            100.0 / s.test.max(1) as f64,
            if d.low >= 2.0 {
                "met (the whole interval)"
            } else if d.mean >= 2.0 {
                "mean only (the interval reaches below +2)"
            } else {
                "not met"
            }
        ));
    }
    let arms = (report.seeds.iter()).flat_map(|s| [&s.random, &s.queue]);
    let (scaled, rounds) = arms.fold((0, 0), |(n, m), a| {
        (n + a.norm_scaled, m + a.rounds_with_site)
    });
    if scaled > 0 {
        out.push_str(&format!(
            "the norm guard scaled the site's update down in {scaled} of its {rounds} rounds \
             (both labelling arms, every seed)\n"
        ));
    }
    out
}
