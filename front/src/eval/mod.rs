//! `fedge eval`: federated domain generalisation, leave one domain out (docs/algorithms.md §6).
//!
//! For every target domain, one client per source domain trains (90 % train, 10 % validation),
//! and the target is never seen. The simulation drives the coordinator's own round machine
//! ([`fedge_coordinator::Rounds`]) in process: tasks and updates are the same encoded frames the
//! MQTT driver would move, clients run the edge trainer, so the numbers are those of a
//! deployment minus the network. After every round the new global head is scored on each
//! client's validation split and on the target; the reported target accuracy is the one at the
//! round with the best sample-weighted mean source-validation accuracy (never chosen on the
//! target).
//!
//! Data sets: the built-in `digits`, `fashion-mnist` (IDX files) and `imagefolder:PATH`, through
//! the built-in backbone or any ONNX backbone with a model card (EfficientNet-Lite0: see
//! `models/tools/`); scenarios `lodo` and `multi`.
//!
//! - `data`: domains, the feature cache, the per-seed splits.
//! - `run`: one run in process or over MQTT; clients of a round train in parallel.
//! - `report`: the summary over seeds, the Markdown table, the JSON report, the plots' data.

mod choice;
mod clients;
mod data;
mod masks;
mod pace;
mod paired;
mod report;
mod run;
mod site;
mod sweep;
mod tta;
mod tune;

pub use choice::served_counts;
pub use clients::partition;
pub use data::{
    DOMAIN_SEED, Dataset, DomainData, Prepared, PreparedDomain, VAL_FRACTION, digits,
    load_backbone, prepare, prepare_with, rows, split_features,
};
pub use masks::{BRIGHT_BOX_THRESHOLD, MaskSource};
pub use pace::{NOMINAL_TRAIN_MS, Pace, Window, absences, slowdown};
pub use paired::{Paired, interval, paired, paired_against, paired_by, paired_markdown};
pub use report::{
    PrivacyRow, ReportMeta, Summary, SummaryRow, curves, markdown, mean_std, plot_bars,
    privacy_markdown, privacy_rows, report_json, summarise, tradeoff_lines,
};
pub use run::{RunSpec, norm_scaled, run_one, run_one_mqtt};
pub use site::{Calibration, LabelShift, SiteOptions, TargetSite};
pub use sweep::{Progress, run_all, run_into, run_lodo};
pub use tta::{T3A_FILTER, Tta, t3a_accuracy};
pub use tune::{Choice, Selection, choose, grid, select, tuning_json};

use std::sync::atomic::{AtomicUsize, Ordering};

use clap::ValueEnum;
use fedge_coordinator::config::{PrivacySettings, Role};
use fedge_coordinator::strategy::{StrategyConfig, StrategyKind};
use fedge_device::Fnv64;
use fedge_device::local_dp::LocalPrivacy;
use fedge_wire::{Codec, Objective, TrainParams};
use serde::Serialize;

/// A client objective with a server strategy, named like `feddim+fedomg`.
#[derive(Debug, Clone, PartialEq)]
pub struct Algorithm {
    /// The name as given.
    pub name: String,
    /// Client objective.
    pub objective: Objective,
    /// Server strategy.
    pub strategy: StrategyConfig,
    /// FedProx's `μ`.
    pub prox_mu: f32,
    /// FedDIM's `λ`.
    pub insight_lambda: f32,
    /// FedDDL's `λ`, the weight of the contrastive regulariser.
    pub contrastive_weight: f32,
    /// Local epochs named in the algorithm (`/local_epochs=1`: FedDIM's paper regime beside
    /// others at `--local-epochs 5`); `None` runs `--local-epochs`.
    pub local_epochs: Option<u32>,
    /// Stable-FedADG's `λ0`; `λ1 = 1 − λ0`.
    pub adversarial_weight: f32,
    /// How the clients pack their updates (`name@f32`, `@f16`, `@int8`; the wire default).
    pub codec: Codec,
    /// The wire defaults with the name's `/key=value` settings (`TrainParams` fields as in
    /// TOML), from which every round's parameters start.
    pub base: TrainParams,
    /// Central DP-FedAvg (`--dp-noise`, `--dp-clip`): the coordinator's `[privacy]`, its
    /// noise seeded from each run's seed.
    pub privacy: Option<PrivacySettings>,
    /// Local DP on every device (`/local_noise_multiplier=σ/local_clip_norm=C`, the profile's
    /// `[privacy]` keys): each update clipped and noised by the agent before it leaves, the
    /// noise seeded from the run's seed and the device's id.
    pub local_privacy: Option<LocalPrivacy>,
    /// A test-time adaptation of the held-out site's classifier (`/tta=t3a`), applied when it
    /// is scored (in process only).
    pub tta: Tta,
}

impl Algorithm {
    /// This algorithm under central DP-FedAvg with noise multiplier `noise`, clip norm `clip`
    /// and `delta`, named `<name> σ=<noise>`; refused with the reason where central DP cannot
    /// run (FedOMG, robust rules, FedDIM and FedDDL's class statistics).
    pub fn with_central_dp(&self, noise: f64, clip: f64, delta: f64) -> anyhow::Result<Self> {
        // Each run reseeds it from its own seed (`run.rs`): a benchmark repeats.
        let privacy = PrivacySettings::simulated(noise, clip, delta);
        let fail = |e: String| anyhow::anyhow!("{} under --dp-noise: {e}", self.name);
        // Unnamed, the feature normalisation is central DP's default (`default_under`).
        let mut base = self.base.clone();
        if !self.name.contains("feature_norm=") {
            base.feature_norm = fedge_wire::FeatureNorm::default_under(true);
        }
        let this = Self {
            base,
            ..self.clone()
        };
        privacy
            .check(&this.train_params(1), Role::Global, 0.0)
            .map_err(|e| fail(e.to_string()))?;
        let noise_source = || privacy.noise();
        (this
            .strategy
            .build_with(privacy.central().map(|dp| (dp, noise_source()))))
        .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            name: format!("{} σ={noise}", self.name),
            privacy: Some(privacy),
            ..this
        })
    }

    /// The `[privacy]` of device `client` in a run of `seed`, with local DP.
    pub fn local_privacy_for(&self, seed: u64, client: &str) -> Option<LocalPrivacy> {
        let privacy = self.local_privacy.as_ref()?;
        let mixed = seed ^ 0x10ca_1d90_0000_0001 ^ Fnv64::of(client.as_bytes());
        Some(LocalPrivacy {
            seed: Some(mixed),
            ..privacy.clone()
        })
    }

    /// The round tasks' training parameters: the wire defaults with this algorithm's
    /// objective and hyper-parameters, and `local_epochs` unless the algorithm names its own.
    pub fn train_params(&self, local_epochs: u32) -> TrainParams {
        TrainParams {
            objective: self.objective,
            local_epochs: self.local_epochs.unwrap_or(local_epochs),
            prox_mu: self.prox_mu,
            insight_lambda: self.insight_lambda,
            contrastive_weight: self.contrastive_weight,
            adversarial_weight: self.adversarial_weight,
            stable_weight: 1.0 - self.adversarial_weight,
            update_codec: self.codec,
            ..self.base.clone()
        }
    }
}

/// Parses `objective`, `strategy` or `objective+strategy` (`fedavg`, `fedprox`, `fedavgm`,
/// `fedomg`, `feddim`, `feddim+fedomg`, `fedddl+fedomg`, `stable-fedadg+fedavgm`, ...), each
/// part spelled as on the command line (an unknown part's error lists the valid names),
/// optionally followed by `@codec` and by `/key=value` settings of `[train]`, of the strategy
/// (`kappa`, `global_lr`, `server_momentum`, ...), e.g. `fedavg/feature_norm=site`,
/// `stable-fedadg/stable_schedule=epochs/adversarial_lr_ratio=50` or `fedomg/kappa=0.9`; and
/// `/tta=t3a`, the held-out site scored with T3A's prototypes (`tta`).
pub fn parse_algorithm(full_name: &str) -> anyhow::Result<Algorithm> {
    let mut parts = full_name.split('/');
    let head = parts.next().unwrap_or_default();
    let mut train = TrainParams::default();
    let mut strategy_settings = Vec::new();
    let mut local = (None, None);
    let mut tta = Tta::None;
    let mut named_epochs = false;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{full_name:?}: {e}");
    for setting in parts {
        let (key, value) = setting
            .split_once('=')
            .ok_or_else(|| fail(anyhow::anyhow!("{setting:?}: write a setting as key=value")))?;
        named_epochs |= key.trim() == "local_epochs";
        let number = || {
            (value.trim().parse::<f64>())
                .map_err(|_| fail(anyhow::anyhow!("{key}: {value:?} is not a number")))
        };
        if key.trim() == "tta" {
            tta = value.trim().parse().map_err(fail)?;
        } else if key.trim() == "local_noise_multiplier" {
            local.0 = Some(number()?);
        } else if key.trim() == "local_clip_norm" {
            local.1 = Some(number()?);
        } else if let Some(changed) = with_setting(&train, key, value).map_err(fail)? {
            changed.check().map_err(|e| fail(e.into()))?;
            train = changed;
        } else if with_setting(&StrategyConfig::default(), key, value)
            .map_err(fail)?
            .is_some()
        {
            strategy_settings.push((key, value));
        } else {
            return Err(fail(anyhow::anyhow!(
                "{key:?} is neither a [train] nor a [strategy] setting"
            )));
        }
    }
    let (name, codec) = match head.split_once('@') {
        Some((name, codec)) => (
            name,
            codec
                .parse::<Codec>()
                .map_err(|e| anyhow::anyhow!("{full_name:?}: {e}"))?,
        ),
        None => (head, train.update_codec),
    };
    let (objective, strategy) = match name.split_once('+') {
        Some((o, s)) => (
            o.parse::<Objective>()
                .map_err(|e| anyhow::anyhow!("{name:?}: {e}"))?,
            s,
        ),
        None if name.parse::<StrategyKind>().is_ok() => (Objective::CrossEntropy, name),
        None => (
            name.parse::<Objective>().map_err(|_| {
                anyhow::anyhow!(
                    "unknown algorithm {name:?}: use an objective ({}), a strategy ({}) or objective+strategy",
                    Objective::ALL.map(Objective::name).join(", "),
                    StrategyKind::value_variants()
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
            "fedavg",
        ),
    };
    let mut strategy = StrategyConfig {
        strategy: strategy
            .parse()
            .map_err(|e| anyhow::anyhow!("{name:?}: {e}"))?,
        ..StrategyConfig::default()
    };
    for (key, value) in strategy_settings {
        strategy = with_setting(&strategy, key, value)
            .map_err(fail)?
            .unwrap_or(strategy);
    }
    strategy.build().map_err(|e| fail(anyhow::anyhow!("{e}")))?;
    let local_privacy = match local {
        (None, None) => None,
        (Some(local_noise_multiplier), Some(local_clip_norm)) => {
            let privacy = LocalPrivacy {
                local_noise_multiplier,
                local_clip_norm,
                delta: 1e-5,
                seed: None,
            };
            privacy.check().map_err(|e| fail(e.into()))?;
            if fedge_device::local_dp::refusal(objective, 1).is_some() {
                return Err(fail(anyhow::anyhow!(
                    "{objective} sends per-class statistics beside the delta, which local DP \
                     does not noise: devices would refuse every round; choose another objective"
                )));
            }
            Some(privacy)
        }
        _ => {
            return Err(fail(anyhow::anyhow!(
                "local DP needs both local_noise_multiplier and local_clip_norm"
            )));
        }
    };
    Ok(Algorithm {
        name: full_name.into(),
        objective,
        strategy,
        prox_mu: train.prox_mu,
        insight_lambda: train.insight_lambda,
        contrastive_weight: train.contrastive_weight,
        local_epochs: named_epochs.then_some(train.local_epochs),
        adversarial_weight: train.adversarial_weight,
        codec,
        base: train,
        privacy: None,
        local_privacy,
        tta,
    })
}

/// `config` with its field `key` set to `value`, read as a line of TOML would be (a value that
/// is not TOML is read as a string: `stable_schedule=epochs`); `None` when `config` has no such
/// field.
fn with_setting<T>(config: &T, key: &str, value: &str) -> anyhow::Result<Option<T>>
where
    T: Serialize + serde::de::DeserializeOwned,
{
    let mut table = toml::Table::try_from(config)?;
    if !table.contains_key(key.trim()) {
        return Ok(None);
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    table.insert(key.trim().to_string(), value);
    let config = table
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("{key}: {}", e.message()))?;
    Ok(Some(config))
}

/// How source domains become clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// One client per source domain, all train every round.
    Lodo,
    /// Each source domain split at random into `clients_per_domain` clients; `sample` of all
    /// clients train each round (the FedDIM paper's M = 50, C = 10 setting).
    Multi {
        /// Clients per source domain.
        clients_per_domain: usize,
        /// Clients selected per round.
        sample: usize,
    },
    /// Each source domain a site of `devices` devices (split at random as in `Multi`): every
    /// device of a site trains, the site merges its devices' updates by sample count
    /// (the site aggregator's relay mode) and the global strategy aggregates the sites.
    Sites {
        /// Devices per site.
        devices: usize,
    },
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scenario::Lodo => write!(f, "lodo (one client per source domain)"),
            Scenario::Multi {
                clients_per_domain,
                sample,
            } => write!(
                f,
                "multi ({clients_per_domain} clients per source domain, {sample} per round)"
            ),
            Scenario::Sites { devices } => write!(
                f,
                "sites (each source domain a site of {devices} devices, merged at the site)"
            ),
        }
    }
}

/// Settings of a benchmark run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// How source domains become clients.
    pub scenario: Scenario,
    /// Rounds per run.
    pub rounds: u64,
    /// The seeds, in order (each redraws the domains' images, the heads and the sampling).
    pub seeds: Vec<u64>,
    /// Local epochs per round.
    pub local_epochs: u32,
    /// Projector width.
    pub hidden: usize,
    /// The held-out site's class mix and the rows its statistics see.
    pub site: SiteOptions,
    /// The devices' pace and how the coordinator aggregates (in process only).
    pub pace: Pace,
}

impl BenchOptions {
    /// Whether these options can run over `transport`: over MQTT the held-out site is an
    /// evaluation-only device, which computes its statistics over the rows it scores.
    pub fn check(&self, transport: Transport) -> anyhow::Result<()> {
        anyhow::ensure!(
            transport == Transport::InProcess || self.site == SiteOptions::transductive(),
            "--transport mqtt scores the held-out site as an evaluation-only device, which \
             computes its statistics over the rows it scores: run it with --calibration all and \
             without --label-shift (the simulator, the default transport, measures both)"
        );
        Ok(())
    }
}

/// How a run's tasks and updates travel (`--transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Transport {
    /// Frames handed to the round machine in process.
    #[default]
    #[value(name = "in-process", alias = "inprocess")]
    InProcess,
    /// A real federation over an embedded MQTT broker: agents, driver, chunking (slower, same
    /// numbers).
    Mqtt,
}

/// The scores of the global head after one round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoundScore {
    /// Round.
    pub round: u64,
    /// Sample-weighted mean accuracy on the source clients' validation splits.
    pub source_val: f32,
    /// Accuracy on the held-out domain.
    pub target_accuracy: f32,
    /// Participants whose updates the round aggregated (clients, or sites with `sites`).
    pub clients: usize,
    /// Virtual milliseconds from the start when the round aggregated (in process; 0 over MQTT).
    #[serde(skip_serializing_if = "is_zero")]
    pub at_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One federated run: an algorithm, a held-out target, a seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Algorithm name.
    pub algorithm: String,
    /// Held-out domain.
    pub target: String,
    /// Seed.
    pub seed: u64,
    /// Round with the best mean source-validation accuracy.
    pub best_round: u64,
    /// That accuracy.
    pub best_source_val: f32,
    /// Target accuracy at `best_round`.
    pub target_accuracy: f32,
    /// Target accuracy after the last round.
    pub final_target_accuracy: f32,
    /// Every aggregated round's scores.
    pub curve: Vec<RoundScore>,
    /// Seconds of local training per round, summed over the round's clients (NaN over MQTT,
    /// where the devices time themselves); serialised as null when unknown.
    pub train_seconds_per_round: f64,
    /// Global parameters after the last round.
    #[serde(skip)]
    pub final_params: Vec<f32>,
    /// Under central DP: ε spent over the run's rounds, at the run's δ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// What the coordinators rejected during the run, by reason (in process only).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rejected: std::collections::BTreeMap<String, u64>,
    /// Why the run ended before its last round (its devices declined a round: a loss that
    /// went non-finite), with the round it reached; its scores are those of the rounds it had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl RunResult {
    /// The result of a run from its `(round, mean source-validation accuracy, target
    /// accuracy, participants aggregated)` scores: the target accuracy at the best validation round (the earliest on a
    /// tie) and after the last round.
    fn select(
        algorithm: &Algorithm,
        target: &str,
        seed: u64,
        scores: impl IntoIterator<Item = (u64, f32, f32, usize)>,
        final_params: Vec<f32>,
    ) -> Self {
        let mut best = (0u64, f32::NEG_INFINITY, 0f32);
        let mut last = 0f32;
        let mut curve = Vec::new();
        for (round, val, acc, clients) in scores {
            if val > best.1 {
                best = (round, val, acc);
            }
            last = acc;
            curve.push(RoundScore {
                round,
                source_val: val,
                target_accuracy: acc,
                clients,
                at_ms: 0,
            });
        }
        Self {
            algorithm: algorithm.name.clone(),
            target: target.to_owned(),
            seed,
            best_round: best.0,
            best_source_val: best.1,
            target_accuracy: best.2,
            final_target_accuracy: last,
            curve,
            train_seconds_per_round: f64::NAN,
            final_params,
            epsilon: None,
            rejected: Default::default(),
            stopped: None,
        }
    }
}

/// `work` on every item, on as many threads as there are cores (at most one per item); the
/// results in item order. The first error wins.
pub(crate) fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    work: impl Fn(&T) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(&work).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<anyhow::Result<R>>> = (0..items.len()).map(|_| None).collect();
    let done: Vec<Vec<(usize, anyhow::Result<R>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, work(item)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for (i, r) in done.into_iter().flatten() {
        slots[i] = Some(r);
    }
    slots
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a training thread panicked"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_parse_into_objective_and_strategy() {
        let a = parse_algorithm("feddim+fedomg").unwrap();
        assert_eq!(
            (a.objective, a.strategy.strategy.name()),
            (Objective::FedDim, "fedomg")
        );
        let b = parse_algorithm("fedprox").unwrap();
        assert_eq!(
            (b.objective, b.strategy.strategy.name()),
            (Objective::FedProx, "fedavg")
        );
        let c = parse_algorithm("fedavgm").unwrap();
        assert_eq!(
            (c.objective, c.strategy.strategy.name()),
            (Objective::CrossEntropy, "fedavgm")
        );
        assert_eq!(c.codec, Codec::F16);
        let d = parse_algorithm("fedavg@int8").unwrap();
        assert_eq!((d.name.as_str(), d.codec), ("fedavg@int8", Codec::Int8));
        assert_eq!(d.train_params(1).update_codec, Codec::Int8);
        assert!(
            parse_algorithm("fedavg@bf16")
                .unwrap_err()
                .to_string()
                .contains("f32, f16, int8")
        );
        assert!(
            parse_algorithm("fedfoo")
                .unwrap_err()
                .to_string()
                .contains("unknown algorithm")
        );
        let unknown_objective = parse_algorithm("fedfoo+fedomg").unwrap_err().to_string();
        assert!(
            unknown_objective.contains("cross-entropy, fedprox, feddim, stable-fedadg, fedddl"),
            "{unknown_objective}"
        );
        let unknown = parse_algorithm("fedfoo").unwrap_err().to_string();
        assert!(unknown.contains("fedavg, fedavgm, fedomg"), "{unknown}");
        assert_eq!(
            parse_algorithm("ce+fedomg").unwrap().objective,
            parse_algorithm("cross-entropy+fedomg").unwrap().objective
        );
        assert!(
            parse_algorithm("feddim+median")
                .unwrap_err()
                .to_string()
                .contains("median")
        );
    }

    #[test]
    fn settings_after_a_slash_change_the_training_parameters() {
        let a = parse_algorithm("stable-fedadg@f32/stable_schedule=epochs/adversarial_lr_ratio=50")
            .unwrap();
        let p = a.train_params(2);
        assert_eq!(p.stable_schedule, fedge_wire::StableSchedule::Epochs);
        assert_eq!(p.adversarial_lr_ratio, 50.0);
        assert_eq!((p.objective, p.local_epochs), (Objective::StableFedAdg, 2));
        // Epochs named in the algorithm win over the run's (the default value included).
        let one = parse_algorithm("feddim/local_epochs=1").unwrap();
        assert_eq!(one.train_params(5).local_epochs, 1);
        assert_eq!(
            parse_algorithm("fedavg/local_epochs=3")
                .unwrap()
                .train_params(5)
                .local_epochs,
            3
        );
        assert_eq!(p.update_codec, Codec::F32);
        let bad = |name: &str| parse_algorithm(name).unwrap_err().to_string();
        assert!(
            bad("fedavg/nonsense=1").contains("nonsense"),
            "{}",
            bad("fedavg/nonsense=1")
        );
        assert!(bad("fedavg/stable_schedule=weekly").contains("weekly"));
        assert!(bad("fedavg/adversarial_lr_ratio=-1").contains("adversarial_lr_ratio"));
        assert!(bad("fedavg/learning_rate").contains("key=value"));
        assert_eq!(
            parse_algorithm("fedavg/feature_norm=site")
                .unwrap()
                .train_params(1)
                .feature_norm,
            fedge_wire::FeatureNorm::Site
        );
        assert!(bad("fedavg/feature_norm=batch").contains("batch"));
    }

    #[test]
    fn selection_takes_the_target_accuracy_of_the_best_validation_round() {
        let a = parse_algorithm("fedavg").unwrap();
        let r = RunResult::select(
            &a,
            "rot75",
            2,
            [
                (1, 0.5, 0.3, 5),
                (2, 0.8, 0.4, 5),
                (3, 0.8, 0.9, 5),
                (4, 0.7, 0.6, 5),
            ],
            vec![],
        );
        assert_eq!(
            (r.best_round, r.best_source_val, r.target_accuracy),
            (2, 0.8, 0.4)
        );
        assert_eq!(r.final_target_accuracy, 0.6);
        assert_eq!(r.curve.len(), 4);
        assert_eq!(r.curve[2].target_accuracy, 0.9);
    }
}
