//! `fedge demo`: its flags, and the progress bar and table around [`fedge::demo::run`]. The
//! federation itself (broker, coordinator, agents) is the library's; this module only turns
//! flags into [`DemoOptions`] and prints.

use clap::Args;
use fedge::attack::KindChoice;
use fedge::demo::{self, DemoOptions, DemoResult, RoundRow};
use fedge_coordinator::buffer::{AggregationConfig, AggregationMode};
use fedge_coordinator::config::PrivacySettings;
use fedge_models::Backend;
use fedge_wire::{Codec, Objective};
use indicatif::{ProgressBar, ProgressStyle};

use super::args::{JsonArgs, StrategyArgs, backend_parser};

/// The flags of `fedge demo`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct DemoArgs {
    /// Rounds to run.
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    /// Edge agents (each its own MQTT client); the five source domains are shared among them.
    #[arg(long, default_value_t = 5)]
    pub clients: usize,
    /// Sites: S site aggregators, each on its own embedded broker with the agents of one source
    /// domain (the domain is the site; --clients counts agents, at least S); the global
    /// coordinator's clients are the sites (docs/sites.md).
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub sites: usize,
    /// Instead of a federation over MQTT, tell the story of a site that changes after
    /// deployment (digits-sensor, --seed): the drift alarm when its camera blurs, label-free
    /// re-adaptation, the labels its queue asks for and what they are worth after the next
    /// rounds, in one table and one plot (--plot). About ten seconds.
    #[arg(long)]
    pub drift: bool,
    /// With --drift: where to draw the plot (PNG).
    #[arg(long, value_name = "PATH.png", default_value = "fedge-drift.png")]
    pub plot: std::path::PathBuf,
    /// Seed for the data split, the initial head and client sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Give every agent a random key: updates and tasks carry HMAC-SHA256 tags, as in a
    /// deployment with `[auth] keys_file`.
    #[arg(long)]
    pub auth: bool,
    /// Announce the coordinator's sensors through Home Assistant MQTT discovery.
    #[arg(long)]
    pub home_assistant: bool,
    /// Use this broker (mqtt://HOST:PORT) instead of starting the embedded one.
    #[arg(long)]
    pub broker: Option<String>,
    /// Only print the final table.
    #[arg(long)]
    pub quiet: bool,
    /// Seconds a round stays open before the coordinator closes it with the updates it has
    /// [default: 30, or 5 with --attack, whose made-up devices never answer].
    #[arg(long)]
    pub round_timeout: Option<f64>,
    /// How updates become models: `synchronous` rounds, or `buffered` (FedBuff: a model
    /// version every --buffer-size updates, nobody waiting for the slowest agent).
    #[arg(long, default_value = "synchronous", value_parser = mode_parser(), help_heading = "Aggregation")]
    pub mode: AggregationMode,
    /// Buffered: updates per model version, at least 2 [default: one less than the agents (at
    /// least 2), so that each version waits for all but the slowest; a smaller buffer goes
    /// faster but, when speed goes with the data (a site all slow), leans towards the fast
    /// agents' data].
    #[arg(long, help_heading = "Aggregation")]
    pub buffer_size: Option<usize>,
    /// The straggler mix: the last tenth of the agents train twenty times slower and the
    /// fifth before them five times slower (each idles for the rest of its training).
    #[arg(long, help_heading = "Aggregation")]
    pub stragglers: bool,
    /// Buffered: `none` (FedBuff: each update by its samples) or `interval` (its samples
    /// times the versions since its agent's last update counted, so slow agents' data are
    /// not outvoted by fast ones'); the coordinator's default.
    #[arg(long, default_value = fedge_coordinator::buffer::ParticipationWeight::default().name(), value_parser = super::bench::buffered::participation_parser(), help_heading = "Aggregation")]
    pub participation: fedge_coordinator::buffer::ParticipationWeight,
    /// Add one hostile participant running these attacks every round (comma-separated, or
    /// `all`; see `fedge attack --help`).
    #[arg(long, value_enum, value_delimiter = ',', help_heading = "Attacks")]
    pub attack: Vec<KindChoice>,
    /// Packets per second per attack.
    #[arg(long, default_value_t = fedge::attack::DEFAULT_RATE, help_heading = "Attacks")]
    pub attack_rate: f64,
    /// Attack a federation without device keys. By default --attack turns --auth on and gives
    /// the attacking devices that take part in rounds keys of their own (compromised devices);
    /// without keys nobody can tell a status or an update in a device's name from its own, and
    /// forged statuses can stall the federation.
    #[arg(
        long,
        requires = "attack",
        conflicts_with = "auth",
        help_heading = "Attacks"
    )]
    pub attack_keyless: bool,
    #[command(flatten)]
    pub strategy: StrategyArgs,
    /// Central DP-FedAvg: noise multiplier σ (the noise on each round's sum has standard
    /// deviation σ × --dp-clip); every round's ε is printed and in --json. docs/privacy.md
    #[arg(
        long,
        value_name = "SIGMA",
        requires = "dp_clip",
        help_heading = "Privacy"
    )]
    pub dp_noise: Option<f64>,
    /// With --dp-noise: the L2 norm every device's delta is clipped to.
    #[arg(
        long,
        value_name = "C",
        requires = "dp_noise",
        help_heading = "Privacy"
    )]
    pub dp_clip: Option<f64>,
    /// With --dp-noise: the δ at which ε is reported.
    #[arg(
        long,
        default_value_t = 1e-5,
        value_name = "DELTA",
        help_heading = "Privacy"
    )]
    pub dp_delta: f64,
    /// FedDIM's server momentum m of the global insight matrices.
    #[arg(long, default_value_t = 0.5, help_heading = "Server strategy")]
    pub insight_momentum: f32,
    #[command(flatten)]
    pub local: LocalArgs,
    #[command(flatten)]
    pub json: JsonArgs,
    /// Write the final model here as ONNX: DIR/model.onnx (backbone and head, softmax at the
    /// end) and DIR/model.toml (its card, with the class list), for onnxruntime or tract.
    #[arg(long, value_name = "DIR")]
    pub export: Option<std::path::PathBuf>,
}

/// How the agents train.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Local training")]
pub struct LocalArgs {
    /// Local objective.
    #[arg(long, value_enum, default_value_t = Objective::CrossEntropy)]
    pub objective: Objective,
    /// FedProx mu.
    #[arg(long, default_value_t = 0.01)]
    pub mu: f32,
    /// FedDIM's lambda (weight of the insight term).
    #[arg(long, default_value_t = 0.01)]
    pub lambda: f32,
    /// How agents pack their updates: f32 (lossless), f16 or int8 (per-tensor scale).
    #[arg(long, value_enum, default_value_t = Codec::F16)]
    pub codec: Codec,
    /// Local epochs per round.
    #[arg(long, default_value_t = 5)]
    pub local_epochs: u32,
    /// Local SGD learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub lr: f32,
    /// Local batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,
    /// Burn CPU backend of the agents.
    #[arg(long, default_value = "flex", value_parser = backend_parser())]
    pub backend: Backend,
}

/// Runs the demo and prints its table.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.drift {
        return tokio::task::spawn_blocking(move || drift_story(&args)).await?;
    }
    let defaults = DemoOptions::default();
    let local = &args.local;
    let attack = fedge::attack::expand(&args.attack);
    let round_timeout_s = args.round_timeout.unwrap_or(if attack.is_empty() {
        defaults.round_timeout_s
    } else {
        5.0
    });
    anyhow::ensure!(
        round_timeout_s.is_finite() && round_timeout_s >= 0.01,
        "--round-timeout {round_timeout_s}: give at least 0.01 seconds"
    );
    anyhow::ensure!(
        args.attack_rate.is_finite() && args.attack_rate > 0.0,
        "--attack-rate {}: give packets per second above 0",
        args.attack_rate
    );
    let options = DemoOptions {
        rounds: args.rounds,
        clients: args.clients,
        strategy: args.strategy.config(),
        train: fedge_wire::TrainParams {
            objective: local.objective,
            local_epochs: local.local_epochs,
            learning_rate: local.lr,
            batch_size: local.batch_size,
            prox_mu: local.mu,
            insight_lambda: local.lambda,
            update_codec: local.codec,
            feature_norm: fedge_wire::FeatureNorm::default_under(args.dp_noise.is_some()),
            ..defaults.train.clone()
        },
        insight_momentum: args.insight_momentum,
        auth: args.auth,
        home_assistant: args.home_assistant,
        seed: args.seed,
        round_timeout_s,
        attack,
        attack_rate: args.attack_rate,
        attack_keyless: args.attack_keyless,
        sites: args.sites,
        aggregation: match args.mode {
            AggregationMode::Buffered => AggregationConfig {
                participation: args.participation,
                ..AggregationConfig::buffered(
                    // A buffer of one would disable the update guards: refused by the
                    // configuration check, so the default is never below 2.
                    args.buffer_size
                        .unwrap_or(args.clients.saturating_sub(1).max(2)),
                    0,
                    AggregationConfig::default().max_staleness,
                )
            },
            AggregationMode::Synchronous => AggregationConfig::default(),
        },
        stragglers: args.stragglers,
        // A demo is a simulation: its noise repeats with --seed.
        privacy: args.dp_noise.zip(args.dp_clip).map(|(noise, clip)| {
            PrivacySettings::simulated(noise, clip, args.dp_delta).for_run(args.seed)
        }),
        backend: local.backend,
        broker: args
            .broker
            .as_deref()
            .map(fedge_mqtt::BrokerConfig::parse_url)
            .transpose()?,
        ..defaults
    };
    let data = demo::prepare(&options)?;
    if options.sites > 0 {
        eprintln!(
            "fedge demo: {} sites, each its own broker and site aggregator with the agents of its \
             source domains (site s holds the domains d with d mod {} = s, and is named after them)",
            options.sites, options.sites
        );
    }
    let runs = match options.aggregation.is_buffered() {
        true => format!(
            "versions (buffered: one every {} updates{})",
            options.aggregation.buffer_size,
            if options.stragglers {
                ", with stragglers"
            } else {
                ""
            }
        ),
        false if options.stragglers => "rounds (with stragglers)".to_owned(),
        false => "rounds".to_owned(),
    };
    eprintln!(
        "fedge demo: {} edge agents on rotated digits (0°–60°), target 75° held out; model of {} parameters; {} {runs} of {}",
        options.clients,
        fedge_models::ModelLayout::new(data.head.clone(), local.objective.carries_generator())
            .num_params(),
        options.rounds,
        options.strategy.strategy
    );
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(options.rounds)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} round {pos}/{len} {msg} [{elapsed_precise}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let result = demo::run(&options, &data, |row| {
        bar.set_position(row.round.min(options.rounds));
        if let Some(acc) = row.target_accuracy {
            bar.set_message(format!("target accuracy {acc:.3}"));
        }
    })
    .await?;
    bar.finish_and_clear();
    let mut result = result;
    if let Some(dir) = &args.export {
        let release = result.release.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "no round aggregated, so there is no model to export to {}",
                dir.display()
            )
        })?;
        let written = demo::export(release, &data.target, dir)?;
        if !args.quiet {
            eprintln!(
                "exported round {} to {} and {}",
                release.round,
                written.onnx.display(),
                written.card.display()
            );
        }
        result.export = Some(written.onnx);
    }
    print_table(&result, options.rounds);
    args.json.write(&result)?;
    Ok(())
}

fn fmt_acc(v: Option<f32>) -> String {
    v.map(|a| format!("{a:.3}")).unwrap_or_else(|| "-".into())
}

fn print_table(result: &DemoResult, asked: u64) {
    // Buffered: each version's updates by how many versions behind they started.
    let buffered = result.rounds.iter().any(|r| !r.staleness.is_empty());
    println!(
        "{:>5}  {:>10}  {:>10}  {:>7}  {:>10}  {:>10}  {:>7}{}",
        if buffered { "ver." } else { "round" },
        "target acc",
        "source val",
        "clients",
        "bytes up",
        "bytes down",
        "seconds",
        if buffered {
            "  staleness (versions:updates)"
        } else {
            ""
        }
    );
    for RoundRow {
        round,
        target_accuracy,
        source_val_accuracy,
        clients,
        bytes_up,
        bytes_down,
        seconds,
        staleness,
        ..
    } in &result.rounds
    {
        let ages: Vec<String> = (staleness.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| format!("{s}:{n}"))
            .collect();
        println!(
            "{round:>5}  {:>10}  {:>10}  {clients:>7}  {bytes_up:>10}  {bytes_down:>10}  {seconds:>7.2}  {}",
            fmt_acc(*target_accuracy),
            fmt_acc(*source_val_accuracy),
            ages.join(" ")
        );
    }
    println!(
        "untrained head: {:.3} on the 75° target; after {} {} of {}: {}; {:.1} s; rejected updates: {}",
        result.initial_target_accuracy,
        result.rounds.len(),
        if buffered { "versions" } else { "rounds" },
        result.strategy,
        fmt_acc(result.final_target_accuracy),
        result.seconds,
        result.rejected.values().sum::<u64>()
    );
    if let Some(line) =
        fedge::demo::norm_scaled_summary((result.rounds.iter()).flat_map(|r| &r.norm_scaled))
    {
        println!("{line}");
    }
    if let Some(served) = &result.served_at_target {
        println!(
            "served at the unseen site (per-site choice, judged on {} labelled images, scored on \
             {} others): {} {:.3} (the release as it is: {:.3}); {}",
            served.labelled,
            served.scored,
            served.variant.name(),
            served.served,
            served.release,
            served.reason
        );
    }
    if let (Some(delta), Some(epsilon)) = (
        result.delta,
        result.rounds.iter().rev().find_map(|r| r.epsilon),
    ) {
        println!("central DP: ε = {epsilon:.3} spent at δ = {delta:e} (every round's in --json)");
    }
    if !result.attacks.is_empty() {
        print_attacks(result, asked);
    }
    if !result.sites.is_empty() {
        let width = (result.sites.keys().map(|n| n.chars().count()))
            .max()
            .unwrap_or(0)
            .max(12);
        println!(
            "{:<width$} {:>7} {:>8} {:>7}",
            "site", "devices", "samples", "gamma"
        );
        for (name, site) in &result.sites {
            let gamma = site.gamma.map_or("-".into(), |g| format!("{g:.3}"));
            println!(
                "{name:<width$} {:>7} {:>8} {gamma:>7}",
                site.devices, site.samples
            );
        }
    }
}

fn print_attacks(result: &DemoResult, asked: u64) {
    let list = |map: &std::collections::BTreeMap<String, u64>| {
        let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        if parts.is_empty() {
            "-".to_string()
        } else {
            parts.join(" ")
        }
    };
    // "traced" counts the coordinator's rejections traced to each attack: its own packets, and
    // for the attacks acting under real devices' names (chunk-hijack, replay, stale-task,
    // control-replay) the genuine packets they spoiled, which is why it can pass "sent".
    println!(
        "{:<17} {:>7} {:>8}  rejections traced to it, by reason (its own packets and, for \
         attacks acting as real devices, the genuine ones they spoiled)",
        "attack", "sent", "traced"
    );
    for (kind, report) in &result.attacks {
        println!(
            "{:<17} {:>7} {:>8}  {}",
            kind.name(),
            report.sent,
            report.rejected,
            list(&report.reasons)
        );
    }
    let aggregated = result.rounds.iter().filter(|r| !r.aborted).count();
    println!(
        "under attack: {aggregated} rounds aggregated of {asked} asked, {} ended; rejections traced to no attack: {}",
        result.rounds.len(),
        list(&result.attacks_untraced)
    );
}

/// `fedge demo --drift`: the story's table on standard output, its plot in --plot, its numbers
/// in --json.
fn drift_story(args: &DemoArgs) -> anyhow::Result<()> {
    use fedge::bench::story;
    let (backbone, _) = fedge::eval::load_backbone(None)?;
    eprintln!(
        "fedge demo --drift: a site on digits-sensor (seed {}): drift alarm, re-adaptation, \
         labels",
        args.seed
    );
    let bar = indicatif::ProgressBar::new(3 * 31).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rounds, {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let told = story::run(&backbone, args.seed, |tick| {
        bar.set_message(format!("{} arm", tick.arm));
        bar.inc(1);
    });
    bar.finish_and_clear();
    let told = told?;
    print!("{}", story::markdown(&told));
    fedge::plot::write(
        &args.plot,
        "A site that changes: its accuracy (%) step by step",
        &story::bars(&told),
    )?;
    eprintln!("plot: {}", args.plot.display());
    args.json.write(&told)
}

/// `--mode`: the names `[aggregation] mode` takes in TOML.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = AggregationMode> {
    const MODES: [AggregationMode; 2] = [AggregationMode::Synchronous, AggregationMode::Buffered];
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(MODES.map(AggregationMode::name)).map(|name| {
        MODES
            .into_iter()
            .find(|m| m.name() == name)
            .unwrap_or_default()
    })
}
