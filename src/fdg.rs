//! `fedge bench`: federated domain generalisation, leave one domain out (ALGORITHMS.md §6).
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
//! Data sets: the built-in `digits` and `fashion-mnist` (IDX files); scenarios `lodo` and
//! `multi`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use fedge_coordinator::insight::InsightConfig;
use fedge_coordinator::strategy::StrategyConfig;
use fedge_coordinator::{Output, RoundConfig, Rounds};
use fedge_edge::data::{DIGITS_ANGLES, digits_domains, fashion_mnist_domains};
use fedge_edge::features::{self, Fnv64};
use fedge_edge::{FeatureSet, accuracy, train_head_with};

use crate::demo::pooled_accuracy;
use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};
use fedge_models::{Backbone, Backend, HeadConfig, training_device};
use fedge_wire::{
    ClassStats, ClientUpdate, LocalMetrics, Message, Objective, TensorF32, TrainParams,
};
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
}

/// Parses `objective`, `strategy` or `objective+strategy` (`fedavg`, `fedprox`, `fedavgm`,
/// `fedomg`, `feddim`, `feddim+fedomg`, `fedprox+fedavgm`, ...).
pub fn parse_algorithm(name: &str) -> anyhow::Result<Algorithm> {
    let objective_of = |s: &str| match s {
        "ce" => Some(Objective::CrossEntropy),
        "fedprox" => Some(Objective::FedProx),
        "feddim" => Some(Objective::FedDim),
        _ => None,
    };
    let is_strategy = |s: &str| matches!(s, "fedavg" | "fedavgm" | "fedomg");
    let (objective, strategy) = match name.split_once('+') {
        Some((o, s)) => (objective_of(o), s),
        None if is_strategy(name) => (Some(Objective::CrossEntropy), name),
        None => (objective_of(name), "fedavg"),
    };
    let objective = objective.with_context(|| {
        format!("unknown algorithm {name:?}: use an objective (ce, fedprox, feddim), a strategy (fedavg, fedavgm, fedomg) or objective+strategy")
    })?;
    anyhow::ensure!(
        is_strategy(strategy),
        "unknown strategy {strategy:?} in {name:?}; available: fedavg, fedavgm, fedomg"
    );
    let strategy = StrategyConfig {
        strategy: strategy.into(),
        ..StrategyConfig::default()
    };
    strategy.build().map_err(anyhow::Error::msg)?;
    Ok(Algorithm {
        name: name.into(),
        objective,
        strategy,
    })
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
}

/// Settings of a benchmark run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Which images.
    pub dataset: Dataset,
    /// How source domains become clients.
    pub scenario: Scenario,
    /// Rounds per run.
    pub rounds: u64,
    /// Seeds 0..seeds.
    pub seeds: u64,
    /// Local epochs per round.
    pub local_epochs: u32,
    /// Projector width.
    pub hidden: usize,
}

/// One domain's split for one seed: train and validation features.
pub struct DomainData {
    /// Domain name (`rot0` ... `rot75`), also the client id.
    pub name: String,
    /// 90 % of the domain, for training.
    pub train: Arc<FeatureSet>,
    /// 10 %, for model selection.
    pub val: Arc<FeatureSet>,
    /// The whole domain, scored when it is the target.
    pub all: Arc<FeatureSet>,
}

/// Which images make the domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dataset {
    /// The built-in UCI digits, six rotated domains.
    Digits,
    /// Fashion-MNIST from IDX files in `dir`, `limit` images in all (shrunk to 8×8 for the
    /// built-in backbone), six rotated domains.
    FashionMnist {
        /// Folder of the four IDX files.
        dir: std::path::PathBuf,
        /// Images drawn in all; `None` uses the 70,000.
        limit: Option<usize>,
    },
}

/// The built-in digits, six rotated domains, through the `digits-conv` backbone; returns the
/// domains, the feature size and the class count.
pub fn digits(seed: u64) -> anyhow::Result<(Vec<DomainData>, usize, usize)> {
    load(&Dataset::Digits, seed)
}

/// `dataset`'s six rotated domains through the `digits-conv` backbone, each split 90/10.
pub fn load(dataset: &Dataset, seed: u64) -> anyhow::Result<(Vec<DomainData>, usize, usize)> {
    let backbone = Backbone::from_bytes(
        digits_conv_card(),
        DIGITS_CONV_ONNX,
        Path::new("digits-conv.onnx"),
    )?;
    let id = Fnv64::of(DIGITS_CONV_ONNX);
    let mut out = Vec::new();
    let mut classes = 0;
    let domains = match dataset {
        Dataset::Digits => digits_domains(&DIGITS_ANGLES, seed),
        Dataset::FashionMnist { dir, limit } => {
            fashion_mnist_domains(dir, &DIGITS_ANGLES, seed, *limit, 8)?
        }
    };
    for (d, domain) in domains.into_iter().enumerate() {
        classes = domain.data.classes();
        let (train, val) = domain.data.split(0.1, seed ^ (d as u64 + 1));
        out.push(DomainData {
            name: domain.name,
            train: Arc::new(features::extract(&backbone, id, &train, None)?),
            val: Arc::new(features::extract(&backbone, id, &val, None)?),
            all: Arc::new(features::extract(&backbone, id, &domain.data, None)?),
        });
    }
    Ok((out, backbone.card().feature_size, classes))
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
    /// Global parameters after the last round.
    #[serde(skip)]
    pub final_params: Vec<f32>,
}

impl RunResult {
    /// The result of a run from its `(round, mean source-validation accuracy, target
    /// accuracy)` scores: the target accuracy at the best validation round (the earliest on a
    /// tie) and after the last round.
    fn select(
        algorithm: &Algorithm,
        target: &str,
        seed: u64,
        scores: impl IntoIterator<Item = (u64, f32, f32)>,
        final_params: Vec<f32>,
    ) -> Self {
        let mut best = (0u64, f32::NEG_INFINITY, 0f32);
        let mut last = 0f32;
        for (round, val, acc) in scores {
            if val > best.1 {
                best = (round, val, acc);
            }
            last = acc;
        }
        Self {
            algorithm: algorithm.name.clone(),
            target: target.to_owned(),
            seed,
            best_round: best.0,
            best_source_val: best.1,
            target_accuracy: best.2,
            final_target_accuracy: last,
            final_params,
        }
    }
}

/// Runs every algorithm with every target and seed; `progress` sees each finished run.
pub fn run_lodo(
    algorithms: &[Algorithm],
    options: &BenchOptions,
    mut progress: impl FnMut(&RunResult),
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for seed in 0..options.seeds.max(1) {
        let (domains, features, classes) = load(&options.dataset, seed)?;
        let head = HeadConfig::new(features, classes).with_hidden(options.hidden);
        for target in 0..domains.len() {
            for algorithm in algorithms {
                let r = run_one(algorithm, &domains, target, seed, &head, options)?;
                progress(&r);
                results.push(r);
            }
        }
    }
    Ok(results)
}

/// How a run's tasks and updates travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Frames handed to the round machine in process.
    InProcess,
    /// A real federation over an embedded MQTT broker: agents, driver, chunking.
    Mqtt,
}

/// Every algorithm with every target and seed over `transport`.
pub async fn run_all(
    algorithms: &[Algorithm],
    options: &BenchOptions,
    transport: Transport,
    mut progress: impl FnMut(&RunResult),
) -> anyhow::Result<Vec<RunResult>> {
    if transport == Transport::InProcess {
        return run_lodo(algorithms, options, progress);
    }
    let mut results = Vec::new();
    for seed in 0..options.seeds.max(1) {
        let (domains, features, classes) = load(&options.dataset, seed)?;
        let head = HeadConfig::new(features, classes).with_hidden(options.hidden);
        for target in 0..domains.len() {
            for algorithm in algorithms {
                let r = run_one_mqtt(algorithm, &domains, target, seed, &head, options).await?;
                progress(&r);
                results.push(r);
            }
        }
    }
    Ok(results)
}

/// One run as a real federation over an embedded MQTT broker (the `fedge demo` machinery):
/// the same clients, seeds and selection rule as [`run_one`].
pub async fn run_one_mqtt(
    algorithm: &Algorithm,
    domains: &[DomainData],
    target: usize,
    seed: u64,
    head: &HeadConfig,
    options: &BenchOptions,
) -> anyhow::Result<RunResult> {
    let sources = clients(domains, target, options.scenario, seed);
    let per_round = match options.scenario {
        Scenario::Lodo => None,
        Scenario::Multi { sample, .. } => Some(sample),
    };
    let data = crate::demo::DemoData {
        head: head.clone(),
        selection: sources.iter().map(|c| Arc::clone(&c.val)).collect(),
        clients: sources
            .iter()
            .map(|c| (c.name.clone(), Arc::clone(&c.train), Arc::clone(&c.val)))
            .collect(),
        target: Arc::clone(&domains[target].all),
    };
    let demo_options = crate::demo::DemoOptions {
        rounds: options.rounds,
        clients: sources.len(),
        per_round,
        strategy: algorithm.strategy.clone(),
        train: TrainParams {
            objective: algorithm.objective,
            local_epochs: options.local_epochs,
            ..TrainParams::default()
        },
        seed,
        hidden: head.hidden,
        federation: format!("bench-{seed}-{target}"),
        round_timeout_s: 600.0,
        ..crate::demo::DemoOptions::default()
    };
    let result = crate::demo::run(&demo_options, &data, |_| {}).await?;
    let scores = result
        .rounds
        .iter()
        .filter_map(|row| Some((row.round, row.selection_accuracy?, row.target_accuracy?)));
    Ok(RunResult::select(
        algorithm,
        &domains[target].name,
        seed,
        scores,
        result.final_params,
    ))
}

/// One run in process: `algorithm` with `domains[target]` held out.
pub fn run_one(
    algorithm: &Algorithm,
    domains: &[DomainData],
    target: usize,
    seed: u64,
    head: &HeadConfig,
    options: &BenchOptions,
) -> anyhow::Result<RunResult> {
    let sources = clients(domains, target, options.scenario, seed);
    let (fraction, per_round) = match options.scenario {
        Scenario::Lodo => (1.0, sources.len()),
        Scenario::Multi { sample, .. } => {
            let sample = sample.clamp(1, sources.len());
            (sample as f32 / sources.len() as f32, sample)
        }
    };
    let train = TrainParams {
        objective: algorithm.objective,
        local_epochs: options.local_epochs,
        ..TrainParams::default()
    };
    let config = RoundConfig {
        rounds: options.rounds,
        fraction,
        min_clients: sources.len(),
        min_updates: per_round,
        round_timeout_ms: u64::MAX / 4,
        train,
        seed,
        insight: (algorithm.objective == Objective::FedDim).then_some(InsightConfig {
            hidden: head.hidden,
            classes: head.classes,
            momentum: 0.5,
        }),
        ..RoundConfig::default()
    };
    let strategy = algorithm.strategy.build().map_err(anyhow::Error::msg)?;
    let mut machine = Rounds::new(config, strategy, head.init_flat(seed));
    for source in &sources {
        machine.handle_client_status(&source.name, true, 0);
    }
    machine.start(0);
    let device = training_device(Backend::default());
    let val_sets: Vec<Arc<FeatureSet>> = sources.iter().map(|c| Arc::clone(&c.val)).collect();
    let mut scores = Vec::new();
    let mut now = 0u64;
    loop {
        let mut task = None;
        let mut finished = false;
        while let Some(output) = machine.poll_output() {
            match output {
                Output::PublishTask { frame, .. } => task = Some(frame),
                Output::RoundEnded(report) if report.aggregated => {
                    let params = machine.params();
                    let val = pooled_accuracy(head, params, &val_sets);
                    let target_accuracy = accuracy(head, params, &domains[target].all)?;
                    scores.push((report.round, val, target_accuracy));
                }
                Output::Rejected {
                    client,
                    reason,
                    detail,
                } => {
                    anyhow::bail!(
                        "{client}'s update was rejected ({}): {detail}",
                        reason.name()
                    )
                }
                Output::Finished => finished = true,
                _ => {}
            }
        }
        if finished {
            break;
        }
        let frame = task.context("the round machine stopped without a task")?;
        let Ok(Message::RoundTask(task)) = fedge_wire::decode(&frame) else {
            anyhow::bail!("undecodable round task");
        };
        let global = task.params.to_vec();
        let insight = task.insight.as_ref().map(TensorF32::to_vec);
        for source in sources.iter().filter(|s| task.selected.contains(&s.name)) {
            let client_seed = seed ^ task.round.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let out = train_head_with(
                head,
                &global,
                &source.train,
                &task.train,
                insight.as_deref(),
                client_seed,
                &device,
            )?;
            let update = ClientUpdate {
                round: task.round,
                client_id: source.name.clone(),
                seq: task.round,
                num_samples: source.train.len() as u32,
                delta: TensorF32::from_slice(&out.delta),
                metrics: LocalMetrics {
                    train_loss: out.last_epoch_loss,
                    ..LocalMetrics::default()
                },
                class_stats: out.class_stats.map(|(counts, means)| ClassStats {
                    counts,
                    means: TensorF32::from_slice(&means),
                }),
            };
            now += 1;
            machine.handle_packet(
                &source.name,
                &fedge_wire::encode(&Message::ClientUpdate(update)),
                now,
            );
        }
    }
    Ok(RunResult::select(
        algorithm,
        &domains[target].name,
        seed,
        scores,
        machine.params().to_vec(),
    ))
}

/// A client of a run: its id and its splits.
struct Client {
    name: String,
    train: Arc<FeatureSet>,
    val: Arc<FeatureSet>,
}

/// The clients of a run holding out `domains[target]`.
fn clients(domains: &[DomainData], target: usize, scenario: Scenario, seed: u64) -> Vec<Client> {
    let sources = domains.iter().enumerate().filter(|(d, _)| *d != target);
    match scenario {
        Scenario::Lodo => sources
            .map(|(_, d)| Client {
                name: d.name.clone(),
                train: Arc::clone(&d.train),
                val: Arc::clone(&d.val),
            })
            .collect(),
        Scenario::Multi {
            clients_per_domain, ..
        } => {
            let parts = clients_per_domain.max(1);
            sources
                .flat_map(|(i, d)| {
                    let salt = seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    let train = partition(&d.train, parts, salt);
                    let val = partition(&d.val, parts, salt ^ 1);
                    train
                        .into_iter()
                        .zip(val)
                        .enumerate()
                        .map(move |(c, (t, v))| Client {
                            name: format!("{}-{c:02}", d.name),
                            train: Arc::new(t),
                            val: Arc::new(v),
                        })
                })
                .filter(|c| !c.train.is_empty())
                .collect()
        }
    }
}

/// Splits `set` into `parts` disjoint parts at random (seeded), sizes within one.
pub fn partition(set: &FeatureSet, parts: usize, seed: u64) -> Vec<FeatureSet> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..set.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let mut out = vec![
        FeatureSet {
            dim: set.dim,
            ..FeatureSet::default()
        };
        parts.max(1)
    ];
    let n = out.len();
    for (k, &i) in order.iter().enumerate() {
        let part = &mut out[k % n];
        part.features
            .extend_from_slice(&set.features[i * set.dim..(i + 1) * set.dim]);
        part.labels.push(set.labels[i]);
    }
    out
}

/// Mean and sample standard deviation.
pub fn mean_std(values: &[f32]) -> (f32, f32) {
    let n = values.len().max(1) as f32;
    let mean = values.iter().sum::<f32>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Per algorithm (in order of appearance): per target domain the mean and std over seeds of
/// the target accuracy, and the mean and std over seeds of the per-seed average; in percent.
pub struct Summary {
    /// Target domains, in order of appearance.
    pub targets: Vec<String>,
    /// One row per algorithm.
    pub rows: Vec<SummaryRow>,
}

/// One algorithm's line of a [`Summary`].
pub struct SummaryRow {
    /// Algorithm name.
    pub algorithm: String,
    /// Per target domain: mean and std over seeds (percent).
    pub cells: Vec<(f32, f32)>,
    /// Mean and std over seeds of the per-seed average (percent).
    pub average: (f32, f32),
}

/// Summarises runs over seeds.
pub fn summarise(results: &[RunResult]) -> Summary {
    let mut algorithms: Vec<&str> = Vec::new();
    let mut targets: Vec<&str> = Vec::new();
    for r in results {
        if !algorithms.contains(&r.algorithm.as_str()) {
            algorithms.push(&r.algorithm);
        }
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let rows = algorithms
        .iter()
        .map(|a| {
            let mut per_seed: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
            let cells = targets
                .iter()
                .map(|t| {
                    let accs: Vec<f32> = results
                        .iter()
                        .filter(|r| r.algorithm == *a && r.target == *t)
                        .map(|r| {
                            per_seed.entry(r.seed).or_default().push(r.target_accuracy);
                            r.target_accuracy * 100.0
                        })
                        .collect();
                    mean_std(&accs)
                })
                .collect();
            let averages: Vec<f32> = per_seed
                .values()
                .map(|v| v.iter().sum::<f32>() / v.len() as f32 * 100.0)
                .collect();
            SummaryRow {
                algorithm: a.to_string(),
                cells,
                average: mean_std(&averages),
            }
        })
        .collect();
    Summary {
        targets: targets.iter().map(|t| t.to_string()).collect(),
        rows,
    }
}

/// The results as a Markdown table: rows are algorithms, columns target domains and the
/// average, cells `mean ± std` over seeds of the target accuracy (percent).
pub fn markdown(results: &[RunResult]) -> String {
    let summary = summarise(results);
    let mut out = format!(
        "| algorithm | {} | average |\n|---|",
        summary.targets.join(" | ")
    );
    out.push_str(&"---|".repeat(summary.targets.len() + 1));
    out.push('\n');
    for row in &summary.rows {
        let (a, (m, s)) = (&row.algorithm, row.average);
        out.push_str(&format!("| {a} |"));
        for (cm, cs) in &row.cells {
            out.push_str(&format!(" {cm:.1} ± {cs:.1} |"));
        }
        out.push_str(&format!(" **{m:.1} ± {s:.1}** |\n"));
    }
    out
}

/// The bars of `fedge bench --plot`.
pub fn plot_bars(results: &[RunResult]) -> Vec<crate::plot::Bar> {
    summarise(results)
        .rows
        .into_iter()
        .map(|row| crate::plot::Bar {
            label: row.algorithm,
            mean: row.average.0,
            std: row.average.1,
            domains: row.cells.iter().map(|(m, _)| *m).collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_parse_into_objective_and_strategy() {
        let a = parse_algorithm("feddim+fedomg").unwrap();
        assert_eq!(
            (a.objective, a.strategy.strategy.as_str()),
            (Objective::FedDim, "fedomg")
        );
        let b = parse_algorithm("fedprox").unwrap();
        assert_eq!(
            (b.objective, b.strategy.strategy.as_str()),
            (Objective::FedProx, "fedavg")
        );
        let c = parse_algorithm("fedavgm").unwrap();
        assert_eq!(
            (c.objective, c.strategy.strategy.as_str()),
            (Objective::CrossEntropy, "fedavgm")
        );
        assert!(
            parse_algorithm("fedfoo")
                .unwrap_err()
                .to_string()
                .contains("unknown algorithm")
        );
        assert!(
            parse_algorithm("feddim+median")
                .unwrap_err()
                .to_string()
                .contains("median")
        );
    }

    #[test]
    fn partitions_are_disjoint_complete_and_reproducible() {
        let set = FeatureSet {
            dim: 2,
            features: (0..20).map(|v| v as f32).collect(),
            labels: (0..10).collect(),
        };
        let parts = partition(&set, 3, 7);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [4, 3, 3]);
        let mut labels: Vec<u32> = parts.iter().flat_map(|p| p.labels.clone()).collect();
        labels.sort();
        assert_eq!(labels, (0..10).collect::<Vec<_>>(), "disjoint and complete");
        for p in &parts {
            for (row, y) in p.features.chunks(2).zip(&p.labels) {
                assert_eq!(
                    row,
                    &[*y as f32 * 2.0, *y as f32 * 2.0 + 1.0],
                    "rows stay whole"
                );
            }
        }
        assert_eq!(partition(&set, 3, 7), parts);
        assert_ne!(partition(&set, 3, 8), parts);
    }

    #[test]
    fn selection_takes_the_target_accuracy_of_the_best_validation_round() {
        let a = parse_algorithm("fedavg").unwrap();
        let r = RunResult::select(
            &a,
            "rot75",
            2,
            [(1, 0.5, 0.3), (2, 0.8, 0.4), (3, 0.8, 0.9), (4, 0.7, 0.6)],
            vec![],
        );
        assert_eq!(
            (r.best_round, r.best_source_val, r.target_accuracy),
            (2, 0.8, 0.4)
        );
        assert_eq!(r.final_target_accuracy, 0.6);
    }

    #[test]
    fn mean_and_std_of_seeds() {
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_std(&[1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 2f32.sqrt()).abs() < 1e-6);
    }
}
