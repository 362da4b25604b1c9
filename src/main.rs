//! `fedge`: demo and tools.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fedge::demo::{self, DemoOptions, DemoResult, RoundRow};
use fedge_coordinator::strategy::{RobustKind, SolverKind, StrategyKind};
use fedge_models::Backend;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "fedge",
    version,
    about = "Federated learning on edge devices: demo and tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole federation in one process: embedded MQTT broker, coordinator and edge agents
    /// on the built-in rotated digits; the 75° domain is held out as the unseen site.
    Demo(DemoArgs),
    /// Federated domain generalisation benchmark: leave one domain out, every algorithm, a
    /// table of target accuracies (selected on source validation).
    Bench(BenchArgs),
    /// Time local head training on each Burn CPU backend, side by side.
    BenchHead(BenchHeadArgs),
    /// Time a backbone's feature extraction with tract, per batch size.
    BenchBackbone(BenchBackboneArgs),
    /// Time the coordinator's FedAvg and FedOMG aggregation against numpy, side by side.
    BenchAggregate(BenchAggregateArgs),
    /// FedDIM's cost: insight bytes (compact vs full) and local training with and without it.
    BenchFeddim(BenchFeddimArgs),
    /// Simulate many lightweight devices (each its own MQTT connection, no training) against a
    /// running coordinator, and check that every update is accounted for (see bench/fleet.sh).
    BenchFleet(BenchFleetArgs),
    /// Bytes per update and per round task for each update codec (f32, f16, int8), against
    /// raw f32 parameters plus FedDIM's full insight matrices (see bench/wire.sh for Flower's).
    BenchWire(BenchWireArgs),
}

#[derive(clap::Args)]
struct BenchWireArgs {
    /// Devices selected per round (each adds a tag to the round task).
    #[arg(long, default_value_t = 10)]
    selected: usize,
    /// Broker packet limit the frames are chunked at.
    #[arg(long, default_value_t = fedge_wire::DEFAULT_MAX_PACKET)]
    max_packet: usize,
    /// Also write the rows as JSON here.
    #[arg(long, value_name = "PATH.json")]
    json: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct BenchFleetArgs {
    /// Simulated devices.
    #[arg(long, default_value_t = 200)]
    devices: usize,
    /// Rounds to watch.
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Broker URL of the federation.
    #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
    broker: String,
    /// Federation name.
    #[arg(long, default_value = "fleet")]
    federation: String,
    /// The coordinator's keys file, when it authenticates devices (`fleet-00000` …).
    #[arg(long)]
    keys: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// `digits` (built in, six rotated domains), `fashion-mnist` (IDX files, see --data-dir; six
    /// rotated domains), `digits-bg` / `fashion-mnist-bg` (objects on backgrounds that follow
    /// the class differently at each site) or `imagefolder:PATH` (PATH/<domain>/<class>/*.png|jpg,
    /// e.g. PACS).
    #[arg(long, default_value = "digits")]
    dataset: String,
    /// Backbone: a model card (`.toml`) or an `.onnx` file with its card beside it, e.g. the
    /// EfficientNet-Lite0 that models/tools/fetch-efficientnet-lite0.sh converts. Default: the
    /// built-in `digits-conv`.
    #[arg(long, value_name = "PATH.onnx")]
    backbone: Option<PathBuf>,
    /// Where backbone features are cached, keyed by backbone and images (default
    /// ~/.cache/fedge/features).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compute features again instead of reading or writing the cache.
    #[arg(long)]
    no_cache: bool,
    /// Try a small grid of each algorithm's own hyper-parameters (FedProx mu, FedDIM lambda,
    /// server momentum beta, FedOMG kappa) and report, per algorithm, the setting with the best
    /// mean source-validation accuracy (the target is never looked at to choose).
    #[arg(long)]
    tune: bool,
    /// Folder of the Fashion-MNIST IDX files (default: where Debian's dataset-fashion-mnist
    /// puts them).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Fashion-MNIST images drawn in all (0 = all 70,000).
    #[arg(long, default_value_t = 12_000)]
    limit: usize,
    /// Comma list of `objective`, `strategy` or `objective+strategy`, each optionally
    /// `@f32`, `@f16` (the default) or `@int8`: how clients pack their updates.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fedavg,fedprox,fedavgm,fedomg,feddim,feddim+fedomg,stable-fedadg,fedddl,fedddl+fedomg"
    )]
    algorithms: Vec<String>,
    /// `lodo` (one client per source domain, all train) or `multi` (each source domain split
    /// into --clients-per-domain clients, --sample of them train per round).
    #[arg(long, default_value = "lodo")]
    scenario: String,
    /// Clients per source domain in the `multi` scenario.
    #[arg(long, default_value_t = 10)]
    clients_per_domain: usize,
    /// Clients selected per round in the `multi` scenario.
    #[arg(long, default_value_t = 10)]
    sample: usize,
    /// Rounds per run.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// Seeds (0..N).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Local epochs per round.
    #[arg(long, default_value_t = 5)]
    local_epochs: u32,
    /// `inprocess` (tasks and updates handed to the round machine directly) or `mqtt` (a real
    /// federation over an embedded broker; slower, same numbers).
    #[arg(long, default_value = "inprocess")]
    transport: String,
    /// Write every run as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the table as Markdown.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Draw the held-out accuracy per round per algorithm as PNG, and the average per
    /// algorithm with error bars over seeds next to it (PATH-bars.png).
    #[arg(long, value_name = "PATH.png")]
    plot: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BenchFeddimArgs {
    /// Backbone feature size F of the timed head.
    #[arg(long, default_value_t = 512)]
    features: usize,
    /// Projector width H of the timed head.
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// Classes K of the timed head.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Training samples.
    #[arg(long, default_value_t = 4096)]
    samples: usize,
    /// Epochs per timed run.
    #[arg(long, default_value_t = 2)]
    epochs: u32,
    /// Batch size.
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Timed runs each way (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(clap::Args)]
struct BenchAggregateArgs {
    /// Client counts N (comma list).
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    n: Vec<usize>,
    /// Parameter counts M (comma list; 66954 is the 512→128→10 head).
    #[arg(long, value_delimiter = ',', default_value = "66954,1000000")]
    m: Vec<usize>,
    /// Timed runs per case (medians reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Python with numpy for the peer measurement.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// The numpy transcription of FedOMG's step.
    #[arg(long)]
    script: Option<PathBuf>,
    /// Skip numpy.
    #[arg(long)]
    no_numpy: bool,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BenchBackboneArgs {
    /// A model card or an `.onnx` file with its card beside it (default: the built-in
    /// `digits-conv`).
    #[arg(long, value_name = "PATH.onnx")]
    backbone: Option<PathBuf>,
    /// Images per measurement.
    #[arg(long, default_value_t = 256)]
    images: usize,
    /// Batch sizes to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    batch: Vec<usize>,
    /// Also write images per second per batch size as JSON here (read by
    /// bench/backbone_ort.py, which runs onnxruntime on the same file).
    #[arg(long, value_name = "PATH.json")]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BenchHeadArgs {
    /// Backbone feature size F.
    #[arg(long, default_value_t = 512)]
    features: usize,
    /// Projector width H.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Classes K.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Training samples.
    #[arg(long, default_value_t = 4096)]
    samples: usize,
    /// Epochs per timed run.
    #[arg(long, default_value_t = 2)]
    epochs: u32,
    /// Batch size.
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Timed runs per backend (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Backends to time, side by side.
    #[arg(long, value_delimiter = ',', default_value = "ndarray,flex")]
    backends: Vec<Backend>,
    /// Also write the measurements as JSON here (read by bench/head_torch.py).
    #[arg(long, value_name = "PATH.json")]
    json: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Rounds to run.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// Edge agents (each its own MQTT client); the five source domains are shared among them.
    #[arg(long, default_value_t = 5)]
    clients: usize,
    /// Server strategy.
    #[arg(long, value_enum, default_value_t = StrategyKind::Fedavg)]
    strategy: StrategyKind,
    /// FedOMG's kappa.
    #[arg(long, default_value_t = 0.5)]
    kappa: f64,
    /// FedOMG's server learning rate, in FedAvg units.
    #[arg(long, default_value_t = 1.0)]
    global_lr: f64,
    /// FedOMG's solver: reference (the authors' 20 SGD steps) or converged.
    #[arg(long, value_enum, default_value_t = SolverKind::Reference)]
    solver: SolverKind,
    /// Server momentum around the strategy (0 = off; fedavgm defaults to 0.9).
    #[arg(long, default_value_t = 0.0)]
    server_momentum: f32,
    /// Server learning rate of the momentum update.
    #[arg(long, default_value_t = 1.0)]
    server_lr: f32,
    /// Robust rewrite of the deltas around the strategy.
    #[arg(long, value_enum, default_value_t = RobustKind::None)]
    robust: RobustKind,
    /// Norm bound of --robust clip; 0 clips to the round's median norm.
    #[arg(long, default_value_t = 0.0)]
    clip_norm: f64,
    /// Fraction pulled in at each end of every coordinate by --robust trimmed-mean.
    #[arg(long, default_value_t = 0.1)]
    trim_fraction: f64,
    /// Local objective: ce, fedprox, feddim, stable-fedadg or fedddl.
    #[arg(long, default_value = "ce")]
    objective: String,
    /// FedProx mu.
    #[arg(long, default_value_t = 0.01)]
    mu: f32,
    /// FedDIM's lambda (weight of the insight term).
    #[arg(long, default_value_t = 0.01)]
    lambda: f32,
    /// How agents pack their updates: f32 (lossless), f16 or int8 (per-tensor scale).
    #[arg(long, default_value = "f16")]
    codec: fedge_wire::Codec,
    /// FedDIM's server momentum m of the global insight matrices.
    #[arg(long, default_value_t = 0.5)]
    insight_momentum: f32,
    /// Give every agent a random key: updates and tasks carry HMAC-SHA256 tags, as in a
    /// deployment with `[auth] keys_file`.
    #[arg(long)]
    auth: bool,
    /// Announce the coordinator's sensors through Home Assistant MQTT discovery.
    #[arg(long)]
    home_assistant: bool,
    /// Local epochs per round.
    #[arg(long, default_value_t = 5)]
    local_epochs: u32,
    /// Local SGD learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Local batch size.
    #[arg(long, default_value_t = 32)]
    batch_size: u32,
    /// Seed for the data split, the initial head and client sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Burn CPU backend of the agents: ndarray or flex.
    #[arg(long, default_value = "flex")]
    backend: Backend,
    /// Use this broker (mqtt://HOST:PORT) instead of starting the embedded one.
    #[arg(long)]
    broker: Option<String>,
    /// Write per-round results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only print the final table.
    #[arg(long)]
    quiet: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rumqttd=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Demo(args) => run_demo(args).await,
        Command::Bench(args) => bench(args).await,
        Command::BenchBackbone(args) => bench_backbone(args),
        Command::BenchHead(args) => bench_head(args),
        Command::BenchAggregate(args) => bench_aggregate(args),
        Command::BenchFleet(args) => bench_fleet(args).await,
        Command::BenchWire(args) => bench_wire(args),
        Command::BenchFeddim(args) => {
            bench_feddim(args);
            Ok(())
        }
    }
}

async fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    let objective = demo::objective_by_name(&args.objective)?;
    let defaults = DemoOptions::default();
    let options = DemoOptions {
        rounds: args.rounds,
        clients: args.clients,
        strategy: fedge_coordinator::strategy::StrategyConfig {
            strategy: args.strategy,
            kappa: args.kappa,
            global_lr: args.global_lr,
            solver: args.solver,
            server_momentum: args.server_momentum,
            server_learning_rate: args.server_lr,
            robust: args.robust,
            clip_norm: args.clip_norm,
            trim_fraction: args.trim_fraction,
        },
        train: fedge_wire::TrainParams {
            objective,
            local_epochs: args.local_epochs,
            learning_rate: args.lr,
            batch_size: args.batch_size,
            prox_mu: args.mu,
            insight_lambda: args.lambda,
            update_codec: args.codec,
            ..defaults.train.clone()
        },
        insight_momentum: args.insight_momentum,
        auth: args.auth,
        home_assistant: args.home_assistant,
        seed: args.seed,
        backend: args.backend,
        broker: args
            .broker
            .as_deref()
            .map(fedge_mqtt::BrokerConfig::parse_url)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        ..defaults
    };
    let data = demo::prepare(&options)?;
    eprintln!(
        "fedge demo: {} edge agents on rotated digits (0°–60°), target 75° held out; model of {} parameters; {} rounds of {}",
        options.clients,
        fedge_models::ModelLayout::new(data.head.clone(), objective.carries_generator())
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
    print_table(&result);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&result)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn fmt_acc(v: Option<f32>) -> String {
    v.map(|a| format!("{a:.3}")).unwrap_or_else(|| "-".into())
}

fn print_table(result: &DemoResult) {
    println!(
        "{:>5}  {:>10}  {:>10}  {:>7}  {:>10}  {:>10}  {:>7}",
        "round", "target acc", "source val", "clients", "bytes up", "bytes down", "seconds"
    );
    for RoundRow {
        round,
        target_accuracy,
        source_val_accuracy,
        clients,
        bytes_up,
        bytes_down,
        seconds,
        ..
    } in &result.rounds
    {
        println!(
            "{round:>5}  {:>10}  {:>10}  {clients:>7}  {bytes_up:>10}  {bytes_down:>10}  {seconds:>7.2}",
            fmt_acc(*target_accuracy),
            fmt_acc(*source_val_accuracy)
        );
    }
    println!(
        "untrained head: {:.3} on the 75° target; after {} rounds of {}: {}; {:.1} s; rejected updates: {}",
        result.initial_target_accuracy,
        result.rounds.len(),
        result.strategy,
        fmt_acc(result.final_target_accuracy),
        result.seconds,
        result.rejected.values().sum::<u64>()
    );
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    use fedge::fdg;
    let dataset = fdg::Dataset::parse(&args.dataset, args.data_dir.as_deref(), args.limit)?;
    let scenario = match args.scenario.as_str() {
        "lodo" => fdg::Scenario::Lodo,
        "multi" => {
            anyhow::ensure!(
                args.clients_per_domain >= 1 && args.sample >= 1,
                "--clients-per-domain and --sample must be at least 1"
            );
            fdg::Scenario::Multi {
                clients_per_domain: args.clients_per_domain,
                sample: args.sample,
            }
        }
        other => anyhow::bail!("unknown scenario {other:?}; available: lodo, multi"),
    };
    let asked = args
        .algorithms
        .iter()
        .map(|a| fdg::parse_algorithm(a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let grids: Vec<(fdg::Algorithm, Vec<fdg::Algorithm>)> = asked
        .iter()
        .map(|a| {
            let variants = if args.tune {
                fdg::grid(a)
            } else {
                vec![a.clone()]
            };
            (a.clone(), variants)
        })
        .collect();
    let algorithms: Vec<fdg::Algorithm> = grids.iter().flat_map(|(_, v)| v.clone()).collect();
    let transport = match args.transport.as_str() {
        "inprocess" => fdg::Transport::InProcess,
        "mqtt" => fdg::Transport::Mqtt,
        other => anyhow::bail!("unknown transport {other:?}; available: inprocess, mqtt"),
    };
    let options = fdg::BenchOptions {
        scenario,
        rounds: args.rounds,
        seeds: args.seeds,
        local_epochs: args.local_epochs,
        hidden: 64,
    };
    let start = std::time::Instant::now();
    let cache_dir = match (&args.cache_dir, args.no_cache) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.clone()),
        (None, false) => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("fedge/features")),
    };
    let spinner = indicatif::ProgressBar::new_spinner();
    let prepared = fdg::prepare(
        &dataset,
        args.backbone.as_deref(),
        cache_dir.as_deref(),
        algorithms
            .iter()
            .any(|a| a.objective == fedge_wire::Objective::FedDdl),
        |domain| spinner.set_message(format!("features of {domain}")),
    )?;
    spinner.finish_and_clear();
    let runs = algorithms.len() as u64 * prepared.domains.len() as u64 * options.seeds.max(1);
    let bar = indicatif::ProgressBar::new(runs * options.rounds).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} rounds, {msg} [{elapsed} / ~{duration}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut done = 0u64;
    let results = fdg::run_all(&prepared, &algorithms, &options, transport, |p| match p {
        fdg::Progress::Round {
            algorithm,
            target,
            seed,
            round,
        } => {
            bar.set_message(format!(
                "run {}/{runs}: {algorithm} on {target} (seed {seed}), round {round}",
                done + 1
            ));
            bar.inc(1);
        }
        fdg::Progress::Run(r) => {
            done += 1;
            // Rounds a run did not aggregate still count as done.
            bar.set_position(done * options.rounds);
            bar.set_message(format!(
                "{} on {}: {:.3}",
                r.algorithm, r.target, r.target_accuracy
            ));
        }
    })
    .await?;
    bar.finish_and_clear();
    let (results, choices) = fdg::choose(&grids, &results);
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
    let table = fdg::markdown(&results);
    println!(
        "{}, {} backbone, {} ({:?}), {} rounds, {} local epochs, {} seeds; held-out accuracy (%) at the best source-validation round, mean ± std over seeds; {:.0} s",
        args.dataset,
        prepared.backbone,
        args.scenario,
        options.scenario,
        options.rounds,
        options.local_epochs,
        options.seeds,
        start.elapsed().as_secs_f64()
    );
    println!("{table}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &table).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let what = format!(
            "{}, {}, {}, {} rounds, {} seeds",
            args.dataset, prepared.backbone, args.scenario, options.rounds, options.seeds
        );
        let title = format!("{what}: held-out accuracy per round");
        fedge::plot::write_curves(path, &title, &fdg::curves(&results))
            .map_err(anyhow::Error::msg)?;
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let bars_path = path.with_file_name(format!("{stem}-bars.png"));
        let title = format!("{what}: held-out accuracy at the best source-validation round");
        fedge::plot::write(&bars_path, &title, &fdg::plot_bars(&results))
            .map_err(anyhow::Error::msg)?;
    }
    if let Some(path) = &args.json {
        let meta = fdg::ReportMeta {
            dataset: &args.dataset,
            scenario: &args.scenario,
            backbone: &prepared.backbone,
            rounds: options.rounds,
            seeds: options.seeds,
            local_epochs: options.local_epochs,
        };
        let json = fdg::report_json(&meta, &results);
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn bench_backbone(args: BenchBackboneArgs) -> anyhow::Result<()> {
    let (backbone, _) = fedge::fdg::load_backbone(args.backbone.as_deref())?;
    let card = backbone.card().clone();
    // Deterministic images on the card's raw scale.
    let images: Vec<f32> = (0..args.images * card.input_len())
        .map(|i| ((i * 2_654_435_761usize) >> 7) as f32 % (card.raw_max + 1.0))
        .collect();
    println!(
        "{}: {}x{}x{} -> {} features, {} images",
        card.name, card.channels, card.height, card.width, card.feature_size, args.images
    );
    println!("| batch | ms per image | images/s |\n|---|---|---|");
    let mut rows = Vec::new();
    for &batch in &args.batch {
        backbone.features(&images[..card.input_len() * batch.max(1)], batch)?;
        let start = std::time::Instant::now();
        backbone.features(&images, batch)?;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "| {batch} | {:.3} | {:.0} |",
            secs * 1e3 / args.images as f64,
            args.images as f64 / secs
        );
        rows.push(serde_json::json!({"batch": batch, "images_per_s": args.images as f64 / secs}));
    }
    if let Some(path) = &args.json {
        let report =
            serde_json::json!({"backbone": card.name, "images": args.images, "tract": rows});
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

fn bench_feddim(args: BenchFeddimArgs) {
    use fedge::bench_feddim as b;
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
    let head = fedge_models::HeadConfig::new(args.features, args.classes).with_hidden(args.hidden);
    let t = b::timing(
        &head,
        args.samples,
        args.epochs,
        args.batch_size,
        args.repeats,
        Backend::default(),
    );
    println!(
        "local epoch, head {}->{}->{}, {} samples, batch {}, median of {}: ce {:.1} ms, feddim {:.1} ms, ratio {:.2}",
        args.features,
        args.hidden,
        args.classes,
        args.samples,
        args.batch_size,
        args.repeats,
        t.ce_epoch_s * 1e3,
        t.feddim_epoch_s * 1e3,
        t.feddim_epoch_s / t.ce_epoch_s
    );
}

fn bench_aggregate(args: BenchAggregateArgs) -> anyhow::Result<()> {
    use fedge::bench_aggregate as b;
    let script = args.script.clone().unwrap_or_else(b::default_script);
    println!(
        "aggregation, median of {} runs; close = last update's arrival to the new model",
        args.repeats
    );
    println!(
        "{:>5} {:>9} {:>12} {:>12} {:>11} {:>11} {:>10} {:>10} {:>12} {:>10}",
        "N",
        "M",
        "fedavg ms",
        "fedomg ms",
        "omg cpu s",
        "omg wall s",
        "numpy s",
        "numpy cpu",
        "close/numpy",
        "cpu ratio"
    );
    let mut all = Vec::new();
    for &n in &args.n {
        for &m in &args.m {
            anyhow::ensure!(n >= 2 && m >= 1, "need N >= 2 and M >= 1");
            let mut r = b::measure_fedge(n, m, args.repeats);
            if !args.no_numpy {
                let (w, c) = b::measure_numpy(&args.python, &script, n, m, args.repeats)
                    .map_err(anyhow::Error::msg)?;
                (r.numpy_wall_s, r.numpy_cpu_s) = (Some(w), Some(c));
            }
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
                _ => "-".into(),
            };
            println!(
                "{:>5} {:>9} {:>12.2} {:>12.2} {:>11} {:>11.3} {:>10} {:>10} {:>12} {:>10}",
                n,
                m,
                r.fedavg_close_s * 1e3,
                r.fedomg_close_s * 1e3,
                fmt(r.fedomg_cpu_s),
                r.fedomg_total_s,
                fmt(r.numpy_wall_s),
                fmt(r.numpy_cpu_s),
                ratio(Some(r.fedomg_close_s), r.numpy_wall_s),
                ratio(r.fedomg_cpu_s, r.numpy_cpu_s),
            );
            all.push(r);
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&all)?)?;
    }
    Ok(())
}

fn bench_head(args: BenchHeadArgs) -> anyhow::Result<()> {
    let head = fedge_models::HeadConfig::new(args.features, args.classes).with_hidden(args.hidden);
    println!(
        "head {}->{}->{}, {} samples x {} epochs, batch {}, median of {} runs",
        args.features,
        args.hidden,
        args.classes,
        args.samples,
        args.epochs,
        args.batch_size,
        args.repeats
    );
    let results = fedge::bench_head::run(
        &head,
        args.samples,
        args.epochs,
        args.batch_size,
        args.repeats,
        &args.backends,
    );
    let mut results = results;
    results.push(fedge::bench_head::plain(
        &head,
        args.samples,
        args.epochs,
        args.batch_size as usize,
        args.repeats,
    ));
    let base = results.first().map(|r| r.samples_per_s).unwrap_or(1.0);
    println!(
        "{:>8}  {:>12}  {:>8}  {:>10}",
        "backend", "samples/s", "ratio", "final loss"
    );
    for r in &results {
        println!(
            "{:>8}  {:>12.0}  {:>8.2}  {:>10.4}",
            r.backend,
            r.samples_per_s,
            r.samples_per_s / base,
            r.final_loss
        );
    }
    if let Some(path) = &args.json {
        let report = serde_json::json!({
            "features": args.features, "hidden": args.hidden, "classes": args.classes,
            "samples": args.samples, "epochs": args.epochs, "batch_size": args.batch_size,
            "learning_rate": fedge_wire::TrainParams::default().learning_rate,
            "momentum": fedge_wire::TrainParams::default().momentum,
            "weight_decay": fedge_wire::TrainParams::default().weight_decay,
            "results": results,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

async fn bench_fleet(args: BenchFleetArgs) -> anyhow::Result<()> {
    use fedge::bench_fleet::{FleetOptions, run_fleet};
    let keys = match &args.keys {
        Some(path) => fedge_coordinator::store::keys::load(path)?,
        None => Default::default(),
    };
    let options = FleetOptions {
        broker: fedge_mqtt::BrokerConfig::parse_url(&args.broker).map_err(anyhow::Error::msg)?,
        federation: args.federation.clone(),
        devices: args.devices,
        rounds: args.rounds,
        timeout: std::time::Duration::from_secs(args.timeout_s),
        keys: keys.into_iter().collect(),
    };
    let report = run_fleet(&options).await?;
    println!("round  selected  reported  rejected  seconds  MB up");
    for r in &report.rounds {
        println!(
            "{:5}  {:8}  {:8}  {:8}  {:7.2}  {:5.1}",
            r.round,
            r.selected,
            r.reported,
            r.rejected,
            r.seconds,
            r.bytes_up as f64 / 1e6
        );
    }
    let reported: u64 = report.rounds.iter().map(|r| r.reported).sum();
    println!(
        "{} devices, {} updates sent, {} used by the coordinator, {:.1} s",
        report.devices, report.updates_sent, reported, report.seconds
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    anyhow::ensure!(
        report
            .rounds
            .iter()
            .all(|r| r.reported == r.selected && r.rejected == 0)
            && reported == report.updates_sent,
        "updates were lost or rejected"
    );
    Ok(())
}

fn bench_wire(args: BenchWireArgs) -> anyhow::Result<()> {
    use fedge::bench_wire::{Shape, measure};
    use fedge_wire::Codec;
    let shapes = [
        Shape {
            features: 512,
            hidden: 64,
            classes: 10,
        },
        Shape {
            features: 1280,
            hidden: 256,
            classes: 65,
        },
    ];
    println!(
        "{:<14} {:>6} {:<7} {:>11} {:>11} {:>6} {:>11}",
        "head F-H-K", "codec", "FedDIM", "update B", "raw B", "ratio", "task B/dev"
    );
    let mut rows = Vec::new();
    for shape in shapes {
        for feddim in [false, true] {
            for codec in [Codec::F32, Codec::F16, Codec::Int8] {
                let row = measure(shape, codec, feddim, args.selected, args.max_packet);
                println!(
                    "{:<14} {:>6} {:<7} {:>11} {:>11} {:>6.3} {:>11}",
                    format!("{}-{}-{}", shape.features, shape.hidden, shape.classes),
                    row.codec,
                    if feddim { "yes" } else { "no" },
                    row.update_bytes,
                    row.raw_bytes,
                    row.update_bytes as f64 / row.raw_bytes as f64,
                    row.task_bytes,
                );
                rows.push(row);
            }
        }
    }
    println!(
        "update B: sealed update frame, chunked at {} B, with MQTT PUBLISH headers; raw B: 4 · params (+ 4 · K²H for FedDIM's full insight); task: f32 parameters (+ Ī with FedDIM), {} tags",
        args.max_packet, args.selected
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)?;
    }
    Ok(())
}
