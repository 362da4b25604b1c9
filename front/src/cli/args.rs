//! Argument groups that several commands share, written once and flattened into each command's
//! `Args` (`#[command(flatten)]`): the server strategy, the head's shape, the timing of a
//! training benchmark, the data set, the backbone and its feature cache, where results are
//! written, and how logs look. Each group turns itself into the library's settings; none of
//! them runs anything.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use fedge_coordinator::strategy::{RobustKind, SolverKind, StrategyConfig, StrategyKind};
use fedge_daemon::LogArgs;
use fedge_models::HeadConfig;

/// The server side: strategy, FedOMG's knobs, server momentum and the robust rewrite.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Server strategy")]
pub struct StrategyArgs {
    /// Server strategy.
    #[arg(long, value_enum, default_value_t = StrategyKind::Fedavg)]
    pub strategy: StrategyKind,
    /// FedOMG's kappa.
    #[arg(long, default_value_t = StrategyConfig::default().kappa)]
    pub kappa: f64,
    /// FedOMG's server learning rate, in FedAvg units.
    #[arg(long, default_value_t = StrategyConfig::default().global_lr)]
    pub global_lr: f64,
    /// FedOMG's solver: the authors' 20 SGD steps (reference) or converged.
    #[arg(long, value_enum, default_value_t = SolverKind::Reference)]
    pub solver: SolverKind,
    /// Server momentum around the strategy (0 = off; fedavgm defaults to 0.9).
    #[arg(long, default_value_t = StrategyConfig::default().server_momentum)]
    pub server_momentum: f32,
    /// Server learning rate of the momentum update.
    #[arg(long, default_value_t = StrategyConfig::default().server_learning_rate)]
    pub server_lr: f32,
    /// Robust rewrite of the deltas around the strategy.
    #[arg(long, value_enum, default_value_t = RobustKind::None)]
    pub robust: RobustKind,
    /// Norm bound of --robust clip; 0 clips to the round's median norm.
    #[arg(long, default_value_t = StrategyConfig::default().clip_norm)]
    pub clip_norm: f64,
    /// Fraction pulled in at each end of every coordinate by --robust trimmed-mean.
    #[arg(long, default_value_t = StrategyConfig::default().trim_fraction)]
    pub trim_fraction: f64,
}

impl StrategyArgs {
    /// The coordinator's strategy settings these flags describe.
    pub fn config(&self) -> StrategyConfig {
        StrategyConfig {
            strategy: self.strategy,
            kappa: self.kappa,
            global_lr: self.global_lr,
            solver: self.solver,
            server_momentum: self.server_momentum,
            server_learning_rate: self.server_lr,
            robust: self.robust,
            clip_norm: self.clip_norm,
            trim_fraction: self.trim_fraction,
        }
    }
}

/// The shape of a timed head: features F, projector width H, classes K.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Head shape")]
pub struct HeadShapeArgs {
    /// Backbone feature size F.
    #[arg(long, default_value_t = 512)]
    pub features: usize,
    /// Projector width H.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Classes K.
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
}

impl HeadShapeArgs {
    /// The head these flags describe.
    pub fn head(&self) -> HeadConfig {
        HeadConfig::new(self.features, self.classes).with_hidden(self.hidden)
    }
}

/// How a training benchmark is timed: the data, the epochs and how often.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Timing")]
pub struct TimingArgs {
    /// Training samples.
    #[arg(long, default_value_t = 4096)]
    pub samples: usize,
    /// Epochs per timed run.
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    /// Batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,
    /// Timed runs of each kind (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// Which images make the domains.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Data set")]
pub struct DatasetArgs {
    /// `digits` (built in, six rotated domains), `fashion-mnist` (IDX files, see --data-dir; six
    /// rotated domains), `digits-bg` / `fashion-mnist-bg` (objects on backgrounds that follow
    /// the class differently at each site), `digits-sensor` / `fashion-mnist-sensor` (six
    /// sensors: contrast, noise, blur, light), `digits:A,B,...` (the digits rotated by the angles given) or `imagefolder:PATH`
    /// (PATH/<domain>/<class>/*.png|jpg, e.g. PACS).
    #[arg(long, default_value = "digits", value_parser = dataset_name)]
    pub dataset: String,
    /// Folder of the Fashion-MNIST IDX files (default: where Debian's dataset-fashion-mnist
    /// puts them).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Fashion-MNIST images drawn in all (0 = all 70,000).
    #[arg(long, default_value_t = 12_000)]
    pub limit: usize,
}

impl DatasetArgs {
    /// The data set these flags name.
    pub fn dataset(&self) -> anyhow::Result<fedge::eval::Dataset> {
        fedge::eval::Dataset::parse(&self.dataset, self.data_dir.as_deref(), self.limit)
    }
}

/// Checks a `--dataset` value when the command line is read, so that a misspelt name fails
/// at once with the list of valid ones (the name itself is kept: reports print it as given).
fn dataset_name(spec: &str) -> anyhow::Result<String> {
    fedge::eval::Dataset::parse(spec, None, 0)?;
    Ok(spec.to_owned())
}

/// The backbone that turns images into features, and where its features are cached.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Backbone")]
pub struct FeatureArgs {
    /// Backbone: a model card (`.toml`) or an `.onnx` file with its card beside it, e.g. the
    /// EfficientNet-Lite0 that models/tools/fetch-efficientnet-lite0.sh converts. Default: the
    /// built-in `digits-conv`.
    #[arg(long, value_name = "PATH.onnx")]
    pub backbone: Option<PathBuf>,
    /// Where backbone features are cached, keyed by backbone and images (default
    /// ~/.cache/fedge/features).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Compute features again instead of reading or writing the cache.
    #[arg(long)]
    pub no_cache: bool,
}

impl FeatureArgs {
    /// The cache folder to use: none with --no-cache, else --cache-dir, else the user's cache.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        match (&self.cache_dir, self.no_cache) {
            (_, true) => None,
            (Some(dir), false) => Some(dir.clone()),
            (None, false) => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("fedge/features")),
        }
    }
}

/// Where a command also writes its results as JSON.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Output")]
pub struct JsonArgs {
    /// Also write the results as JSON here.
    #[arg(long, value_name = "PATH.json")]
    pub json: Option<PathBuf>,
}

impl JsonArgs {
    /// Writes `value` as pretty JSON to --json, when given.
    pub fn write(&self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        match &self.json {
            Some(path) => write_file(path, serde_json::to_string_pretty(value)?),
            None => Ok(()),
        }
    }
}

/// Writes `contents` to `path` and says so on standard error, naming the file when it cannot.
pub fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The log filter when `RUST_LOG` is not set: warnings, the embedded broker's logs off.
pub const DEFAULT_LOG_FILTER: &str = "warn,rumqttd=off";

/// Installs the global subscriber for a front-end command: `RUST_LOG` when set, else
/// [`DEFAULT_LOG_FILTER`], on standard error, since standard output carries the command's
/// tables and JSON.
pub fn init_logs(log: &LogArgs) {
    use std::io::IsTerminal;
    let colour = fedge_daemon::colour(std::io::stderr().is_terminal());
    fedge_daemon::init_logs_to(log.log_format, DEFAULT_LOG_FILTER, std::io::stderr, colour);
}

/// Parses a Burn CPU backend by the name [`fedge_models::Backend::name`] gives it (`ndarray`,
/// `flex`), listing this build's backends in `--help` and in errors.
pub fn backend_parser() -> impl clap::builder::TypedValueParser<Value = fedge_models::Backend> {
    use clap::builder::TypedValueParser;
    let names = fedge_models::Backend::ALL.iter().map(|b| b.name());
    clap::builder::PossibleValuesParser::new(names).try_map(|s| s.parse::<fedge_models::Backend>())
}
