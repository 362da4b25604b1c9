//! `fedge eval`: the leave-one-domain-out accuracy benchmark's flags, progress and outputs
//! (table, Markdown, JSON, plots). The runs themselves are [`fedge::eval`]'s; this module
//! turns flags into its options and prints what comes back.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use fedge::eval::{
    self, Algorithm, BenchOptions, Calibration, LabelShift, Scenario, SiteOptions, Transport,
};

use super::args::{DatasetArgs, FeatureArgs, JsonArgs, write_file};

/// The flags of `fedge eval` (and of `fedge bench` without a subcommand, for one release).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct EvalArgs {
    #[command(flatten)]
    pub data: DatasetArgs,
    #[command(flatten)]
    pub features: FeatureArgs,
    /// Comma list of `objective`, `strategy` or `objective+strategy`, each optionally
    /// `@f32`, `@f16` (the default) or `@int8` (how clients pack their updates), then optionally
    /// `/key=value` training settings as in `[train]` (`stable-fedadg/stable_schedule=epochs`). [default:
    /// fedavg,fedprox,fedavgm,fedomg,feddim,feddim+fedomg,stable-fedadg,fedddl,fedddl+fedomg;
    /// without fedddl on an image folder without boxes.csv, which FedDDL needs]
    #[arg(long, value_delimiter = ',', help_heading = "Runs")]
    pub algorithms: Vec<String>,
    /// Try a small grid of each algorithm's own hyper-parameters (FedAvg's learning rate at the
    /// run's local epochs and at one, FedProx mu, FedDIM lambda, FedDDL's and Stable-FedADG's
    /// weights, server momentum beta, FedOMG kappa) and report, per algorithm, the setting with
    /// the best mean source-validation accuracy (the target is never looked at to choose); then
    /// the one setting chosen over all algorithms (the first algorithm unless another beats it
    /// on source validation beyond noise, paired by seed), against the first algorithm and
    /// against the best in hindsight (with `--json`, all of it under `tuning`).
    #[arg(long, help_heading = "Runs")]
    pub tune: bool,
    /// FedDDL's counterfactual draws per image, built per client on its own training rows;
    /// every round trains on one of them per image, picked at random. 0: DEB alone (real
    /// images and the prototype pull, no counterfactuals), an ablation.
    #[arg(long, default_value_t = fedge_edge::views::DEFAULT_POOL as u16,
          value_parser = clap::value_parser!(u16).range(0..=16),
          help_heading = "Runs")]
    pub counterfactuals: u16,
    /// Where FedDDL's object masks come from: `exact` (the data set's own pixel masks, or an
    /// image folder's `boxes.csv`) or `bright-box` (boxes from the project's bright-box
    /// detector run through tract on every training image, as the FedDDL paper takes boxes
    /// from a detector; single-channel images).
    #[arg(long, value_enum, default_value_t = eval::MaskSource::Exact, help_heading = "Runs")]
    pub masks: eval::MaskSource,
    /// Train the backbone's last convolution block with the head: the backbone runs to the
    /// block's input once per image (those activations are cached), and every algorithm trains
    /// the block's offsets from its pretrained weights and the head together. Features reach
    /// the head unstandardised (`feature_norm = none` for every algorithm; site statistics
    /// after a moving tail are not built yet).
    #[arg(long, help_heading = "Backbone")]
    pub train_tail: bool,
    /// How source domains become clients.
    #[arg(long, value_enum, default_value_t = ScenarioKind::Lodo, help_heading = "Runs")]
    pub scenario: ScenarioKind,
    /// Clients per source domain in the `multi` scenario, devices per site in `sites`.
    #[arg(long, default_value_t = 10, help_heading = "Runs")]
    pub clients_per_domain: usize,
    /// Clients selected per round in the `multi` scenario.
    #[arg(long, default_value_t = 10, help_heading = "Runs")]
    pub sample: usize,
    /// Rounds per run.
    #[arg(long, default_value_t = 20, help_heading = "Runs")]
    pub rounds: u64,
    /// Seeds: a count (3: seeds 0 to 2), a range (100..105, seeds never used to tune
    /// anything) or a list (3,7,11).
    #[arg(long, default_value = "3", help_heading = "Runs")]
    pub seeds: crate::cli::seeds::Seeds,
    /// Shifts every seed by this much (the spelling of earlier releases: --seeds 5
    /// --first-seed 100 is --seeds 100..105).
    #[arg(long, default_value_t = 0, hide = true)]
    pub first_seed: u64,
    /// Local epochs per round.
    #[arg(long, default_value_t = 5, help_heading = "Runs")]
    pub local_epochs: u32,
    /// How tasks and updates travel.
    #[arg(long, value_enum, default_value_t = Transport::InProcess, help_heading = "Runs")]
    pub transport: Transport,
    /// The held-out site's class mix, drawn per seed: `none` (the domain's own), `dirichlet:ALPHA`,
    /// `dominant:SHARE` (one class holds SHARE of its images), `classes:K` (only K classes).
    /// A camera that mostly sees one product is the normal case in the field.
    #[arg(
        long,
        default_value = "none",
        value_name = "MIX",
        help_heading = "Held-out site"
    )]
    pub label_shift: LabelShift,
    /// How many unlabelled images of the held-out site its statistics see (`feature_norm =
    /// "site"`), from one half of its images; the site is scored on the other half, whatever
    /// the normalisation. `all`: every image, the scored ones included (transductive).
    /// [default: 128; all with --transport mqtt]
    #[arg(long, value_name = "N|all", help_heading = "Held-out site")]
    pub calibration: Option<Calibration>,
    /// Central DP-FedAvg: comma list of noise multipliers σ, each run as its own variant of
    /// every algorithm (0: the algorithm without DP, for reference); prints the
    /// privacy–utility table and, with --plot, draws PATH-privacy.png. Devices are drawn each
    /// round with probability --sample / clients (Poisson). docs/privacy.md
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIGMA",
        requires = "dp_clip",
        help_heading = "Privacy"
    )]
    pub dp_noise: Vec<f64>,
    /// With --dp-noise: the L2 norm every device's delta is clipped to.
    #[arg(long, value_name = "C", help_heading = "Privacy")]
    pub dp_clip: Option<f64>,
    /// With --dp-noise: the δ at which ε is reported.
    #[arg(
        long,
        default_value_t = 1e-5,
        value_name = "DELTA",
        help_heading = "Privacy"
    )]
    pub dp_delta: f64,
    /// Also pair every algorithm by seed against each of these (names as in --algorithms), as
    /// against the first: `--paired-against fedavg` with `fedavg/feature_norm=none` first gives
    /// both the gain over no standardisation and over the default `pooled`.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "ALGORITHM",
        help_heading = "Output"
    )]
    pub paired_against: Vec<String>,
    #[command(flatten)]
    pub json: JsonArgs,
    /// Write the table as Markdown.
    #[arg(long, value_name = "PATH.md", help_heading = "Output")]
    pub markdown: Option<PathBuf>,
    /// Draw the held-out accuracy per round per algorithm as PNG, and the average per
    /// algorithm with error bars over seeds next to it (PATH-bars.png).
    #[arg(long, value_name = "PATH.png", help_heading = "Output")]
    pub plot: Option<PathBuf>,
}

/// How source domains become clients (`--scenario`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScenarioKind {
    /// One client per source domain, all train every round.
    Lodo,
    /// Each source domain split into --clients-per-domain clients, --sample of them train per
    /// round.
    Multi,
    /// Each source domain a site of --clients-per-domain devices: all train, each site merges
    /// its devices' updates by sample count, the strategy aggregates the sites (not with
    /// FedDIM, whose compact statistics do not merge).
    Sites,
}

impl ScenarioKind {
    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Lodo => "lodo",
            ScenarioKind::Multi => "multi",
            ScenarioKind::Sites => "sites",
        }
    }
}

/// `fedge eval`'s algorithms when `--algorithms` is not given.
pub const DEFAULT_ALGORITHMS: [&str; 9] = [
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedomg",
    "feddim",
    "feddim+fedomg",
    "stable-fedadg",
    "fedddl",
    "fedddl+fedomg",
];

impl EvalArgs {
    /// The held-out site: with MQTT, an evaluation-only device computes its statistics over
    /// the rows it scores, so the calibration defaults to `all` there.
    fn site(&self) -> SiteOptions {
        let calibration = self.calibration.unwrap_or(match self.transport {
            Transport::InProcess => Calibration::default(),
            Transport::Mqtt => Calibration::All,
        });
        SiteOptions {
            label_shift: self.label_shift,
            calibration,
        }
    }

    fn scenario(&self) -> anyhow::Result<Scenario> {
        Ok(match self.scenario {
            ScenarioKind::Lodo => Scenario::Lodo,
            ScenarioKind::Multi => {
                anyhow::ensure!(
                    self.clients_per_domain >= 1 && self.sample >= 1,
                    "--clients-per-domain and --sample must be at least 1"
                );
                Scenario::Multi {
                    clients_per_domain: self.clients_per_domain,
                    sample: self.sample,
                }
            }
            ScenarioKind::Sites => {
                anyhow::ensure!(
                    self.clients_per_domain >= 1,
                    "--clients-per-domain must be at least 1"
                );
                anyhow::ensure!(
                    self.transport == Transport::InProcess,
                    "--scenario sites runs in process only; leave out --transport mqtt"
                );
                Scenario::Sites {
                    devices: self.clients_per_domain,
                }
            }
        })
    }

    /// The algorithms asked for, or the default list; on data without object masks the
    /// default leaves FedDDL out and says so.
    fn algorithm_names(&self, dataset: &fedge::eval::Dataset) -> Vec<String> {
        if !self.algorithms.is_empty() {
            return self.algorithms.clone();
        }
        let all = DEFAULT_ALGORITHMS.iter().map(|a| a.to_string());
        if dataset.has_masks() {
            return all.collect();
        }
        eprintln!(
            "fedge eval: FedDDL left out: this image folder has no object masks (FedDDL swaps \
             backgrounds around them); add boxes.csv (file,x1,y1,x2,y2) to each domain folder \
             and name fedddl in --algorithms to run it"
        );
        all.filter(|a| !a.starts_with("fedddl")).collect()
    }

    /// Each asked algorithm with the variants to run for it: itself, or its grid with --tune.
    fn grids(
        &self,
        dataset: &fedge::eval::Dataset,
    ) -> anyhow::Result<Vec<(Algorithm, Vec<Algorithm>)>> {
        self.algorithm_names(dataset)
            .iter()
            .map(|name| {
                let a = eval::parse_algorithm(name)?;
                let variants = if self.tune {
                    eval::grid(&a, self.local_epochs)
                } else {
                    vec![a.clone()]
                };
                Ok((a, variants))
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .and_then(|grids| self.with_privacy(grids))
    }

    /// With --dp-noise: each algorithm once per noise level, each its own grid (a noise level
    /// is a setting to compare, never one to choose).
    fn with_privacy(
        &self,
        grids: Vec<(Algorithm, Vec<Algorithm>)>,
    ) -> anyhow::Result<Vec<(Algorithm, Vec<Algorithm>)>> {
        let Some(clip) = self.dp_clip.filter(|_| !self.dp_noise.is_empty()) else {
            return Ok(grids);
        };
        anyhow::ensure!(!self.tune, "--dp-noise runs without --tune");
        let mut out = Vec::new();
        for (a, _) in grids {
            for &noise in &self.dp_noise {
                let variant = match noise {
                    0.0 => a.clone(),
                    _ => a.with_central_dp(noise, clip, self.dp_delta)?,
                };
                out.push((variant.clone(), vec![variant]));
            }
        }
        Ok(out)
    }
}

/// Runs every algorithm with every domain held out, for every seed, and prints the table.
/// The seeds `--seeds` names, each shifted by `--first-seed`, or why they cannot be run.
pub fn shifted_seeds(first: u64, seeds: &crate::cli::seeds::Seeds) -> anyhow::Result<Vec<u64>> {
    (seeds.0.iter())
        .map(|seed| {
            seed.checked_add(first).ok_or_else(|| {
                anyhow::anyhow!(
                    "--first-seed {first} shifts seed {seed} past the largest seed ({}): give a \
                     smaller --first-seed",
                    u64::MAX
                )
            })
        })
        .collect()
}

pub async fn run(args: EvalArgs) -> anyhow::Result<()> {
    let seeds = shifted_seeds(args.first_seed, &args.seeds)?;
    let dataset = args.data.dataset()?;
    let scenario = args.scenario()?;
    let mut grids = args.grids(&dataset)?;
    if args.train_tail {
        // Features after a moving tail have no site statistics yet: every algorithm, and the
        // head-only runs it is compared with, see them as the tail makes them.
        for (algorithm, variants) in &mut grids {
            for a in std::iter::once(algorithm).chain(variants.iter_mut()) {
                a.base.feature_norm = fedge_wire::FeatureNorm::None;
            }
        }
    }
    let algorithms: Vec<Algorithm> = grids.iter().flat_map(|(_, v)| v.clone()).collect();
    for baseline in &args.paired_against {
        let names = || grids.iter().map(|(a, _)| a.name.as_str());
        anyhow::ensure!(
            names().any(|n| n == baseline),
            "--paired-against {baseline}: name one of --algorithms ({})",
            names().collect::<Vec<_>>().join(", ")
        );
    }
    let options = BenchOptions {
        scenario,
        rounds: args.rounds,
        seeds,
        local_epochs: args.local_epochs,
        hidden: 64,
        site: args.site(),
        pace: Default::default(),
    };
    // Refused before the features are computed, not at the first run.
    options.check(args.transport)?;
    let start = std::time::Instant::now();
    let spinner = indicatif::ProgressBar::new_spinner();
    let fedddl = (algorithms.iter()).any(|a| a.objective == fedge_wire::Objective::FedDdl);
    let prepared = eval::prepare_with(
        &dataset,
        args.features.backbone.as_deref(),
        args.features.cache_dir().as_deref(),
        fedddl.then_some(usize::from(args.counterfactuals)),
        args.masks,
        args.train_tail,
        |domain| spinner.set_message(format!("features of {domain}")),
    )?;
    spinner.finish_and_clear();
    let results =
        super::eval_progress::run_with_progress(&prepared, &algorithms, &options, args.transport)
            .await?;
    let all_runs = results;
    let (results, choices) = eval::choose(&grids, &all_runs);
    if args.tune {
        println!("settings chosen on mean source-validation accuracy (%):");
        for choice in &choices {
            let tried: Vec<String> = choice
                .source_val
                .iter()
                .map(|(name, val)| format!("{name} {:.2}", val * 100.0))
                .collect();
            println!(
                "  {} -> {} ({})",
                choice.algorithm,
                choice.chosen,
                tried.join(", ")
            );
        }
    }
    let selection = args
        .tune
        .then(|| eval::select(&choices, &results))
        .flatten();
    if let Some(s) = &selection {
        let against = |p: &Option<eval::Paired>, name: &str| match p {
            Some(p) => format!(
                "{:+.1} [{:+.1}, {:+.1}] points against {name} ({} seeds)",
                p.mean, p.low, p.high, p.seeds
            ),
            None => format!("it is {name}"),
        };
        let baseline = results.first().map_or("", |r| r.algorithm.as_str());
        if let (true, Some(g)) = (s.highest != s.chosen, &s.highest_gap) {
            println!(
                "highest source validation: {}, {:+.2} [{:+.2}, {:+.2}] points over {baseline} ({} seeds): not beyond noise, so not chosen",
                s.highest, g.mean, g.low, g.high, g.seeds
            );
        }
        println!(
            "chosen over all algorithms on source validation (moving off {baseline} only for a lead beyond noise): {} ({:.2} %); held out: {}; {} (the best in hindsight, by the held-out labels)",
            s.chosen,
            s.source_val * 100.0,
            against(&s.against_baseline, baseline),
            against(&s.against_hindsight, &s.hindsight),
        );
    }
    let table = eval::markdown(&results);
    println!(
        "{}, {} backbone, {}, {} rounds, {} local epochs, {} seeds; held-out accuracy (%) at the best source-validation round{}, then the average after the last round and an oracle's (best round by the held-out labels: an upper bound, not a result); {:.0} s",
        args.data.dataset,
        prepared.backbone,
        options.scenario,
        options.rounds,
        options.local_epochs,
        options.seeds.len(),
        if options.seeds.len() > 1 {
            ", mean ± std over seeds"
        } else {
            " (one seed: no spread)"
        },
        start.elapsed().as_secs_f64()
    );
    println!("{table}");
    let paired = eval::paired(&results);
    if !paired.is_empty() && options.seeds.len() > 1 {
        println!(
            "paired by seed against the first algorithm (held-out site: label shift {}, calibration {}):",
            options.site.label_shift, options.site.calibration
        );
        println!("{}", eval::paired_markdown(&paired));
    }
    let also_paired = eval::paired_against(&args.paired_against, &results)?;
    if options.seeds.len() > 1 {
        for (baseline, rows) in &also_paired {
            println!("paired by seed against {baseline}:");
            println!("{}", eval::paired_markdown(rows));
        }
    }
    let prior_em = eval::Tta::prior_em_counts();
    if prior_em.iter().any(|c| *c > 0) {
        let [kept, few, no_better, not_finite] = prior_em;
        println!(
            "prior-em over every scored round: fit kept {kept}, pooled for too few calibration \
             rows {few}, for no better likelihood on rows the fit did not see {no_better}, for \
             values not finite {not_finite}"
        );
    }
    if let Some(line) = fedge::demo::norm_scaled_summary(&eval::norm_scaled()) {
        println!("{line}");
    }
    let served = eval::served_counts();
    if served.iter().any(|(_, n)| *n > 0) {
        let counts: Vec<String> = (served.iter())
            .map(|(variant, n)| format!("{} {n}", variant.name()))
            .collect();
        println!(
            "the per-site choice over every scored round served: {}",
            counts.join(", ")
        );
    }
    if let Some(path) = &args.markdown {
        write_file(path, &table)?;
    }
    if let Some(path) = &args.plot {
        let what = format!(
            "{}, {}, {}, {} rounds, {} seeds",
            args.data.dataset,
            prepared.backbone,
            args.scenario.name(),
            options.rounds,
            options.seeds.len()
        );
        let title = format!("{what}: held-out accuracy per round");
        fedge::plot::write_curves(path, &title, &eval::curves(&results))?;
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let bars_path = path.with_file_name(format!("{stem}-bars.png"));
        let title = format!("{what}: held-out accuracy at the best source-validation round");
        fedge::plot::write(&bars_path, &title, &eval::plot_bars(&results))?;
        eprintln!("wrote {} and {}", path.display(), bars_path.display());
    }
    let privacy = eval::privacy_rows(&results);
    if !privacy.is_empty() {
        println!(
            "privacy–utility: central DP-FedAvg, clip {}, Poisson sampling; held-out accuracy after the last round, mean ± std over seeds",
            args.dp_clip.unwrap_or_default()
        );
        println!("{}", eval::privacy_markdown(&privacy, args.dp_delta));
        if let Some(path) = &args.plot {
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            let privacy_path = path.with_file_name(format!("{stem}-privacy.png"));
            let title = format!(
                "{}, {}, {} rounds, {} seeds: held-out accuracy against ε (δ = {:e}, clip {})",
                args.data.dataset,
                args.scenario.name(),
                options.rounds,
                options.seeds.len(),
                args.dp_delta,
                args.dp_clip.unwrap_or_default()
            );
            let lines = eval::tradeoff_lines(&privacy);
            fedge::plot::write_tradeoff(&privacy_path, &title, &lines)?;
            eprintln!("wrote {}", privacy_path.display());
        }
    }
    let meta = eval::ReportMeta {
        dataset: &args.data.dataset,
        scenario: args.scenario.name(),
        backbone: &prepared.backbone,
        rounds: options.rounds,
        seeds: options.seeds.len() as u64,
        local_epochs: options.local_epochs,
        site: options.site,
    };
    let mut report = eval::report_json(&meta, &results);
    report["paired"] = serde_json::json!(eval::paired(&results));
    if !also_paired.is_empty() {
        let rows: serde_json::Map<String, serde_json::Value> = (also_paired.into_iter())
            .map(|(baseline, rows)| (baseline, serde_json::json!(rows)))
            .collect();
        report["paired_against"] = serde_json::Value::Object(rows);
    }
    if prior_em.iter().any(|c| *c > 0) {
        let [kept, too_few_rows, no_better, not_finite] = prior_em;
        report["prior_em"] = serde_json::json!({"kept": kept, "too_few_rows": too_few_rows,
            "no_better": no_better, "not_finite": not_finite});
    }
    if fedddl {
        // How FedDDL's views were made.
        report["fedddl"] =
            serde_json::json!({"counterfactuals": args.counterfactuals, "masks": args.masks});
    }
    if args.tune {
        report["tuning"] = eval::tuning_json(&choices, selection.as_ref());
        // Every setting of the grid, not only the kept ones: a setting not kept is still a
        // control (FedAvg at twice its learning rate against FedDDL's doubled step).
        report["tuning"]["runs"] = eval::report_json(&meta, &all_runs)["results"].take();
    }
    if !privacy.is_empty() {
        report["delta"] = serde_json::json!(args.dp_delta);
        report["privacy"] = serde_json::to_value(&privacy)?;
    }
    args.json.write(&report)
}
