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
//! First version: the built-in `digits` data set and the `lodo` scenario.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use fedge_coordinator::insight::InsightConfig;
use fedge_coordinator::strategy::StrategyConfig;
use fedge_coordinator::{Output, RoundConfig, Rounds};
use fedge_edge::data::{DIGITS_ANGLES, digits_domains};
use fedge_edge::features::{self, Fnv64};
use fedge_edge::{FeatureSet, accuracy, train_head_with};
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

/// Settings of a benchmark run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
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

/// The built-in digits, six rotated domains, through the `digits-conv` backbone; returns the
/// domains, the feature size and the class count.
pub fn digits(seed: u64) -> anyhow::Result<(Vec<DomainData>, usize, usize)> {
    let backbone = Backbone::from_bytes(
        digits_conv_card(),
        DIGITS_CONV_ONNX,
        Path::new("digits-conv.onnx"),
    )?;
    let id = Fnv64::of(DIGITS_CONV_ONNX);
    let mut out = Vec::new();
    let mut classes = 0;
    for (d, domain) in digits_domains(&DIGITS_ANGLES, seed).into_iter().enumerate() {
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

/// Runs every algorithm with every target and seed; `progress` sees each finished run.
pub fn run_lodo(
    algorithms: &[Algorithm],
    options: &BenchOptions,
    mut progress: impl FnMut(&RunResult),
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for seed in 0..options.seeds.max(1) {
        let (domains, features, classes) = digits(seed)?;
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

/// One run in process: `algorithm` with `domains[target]` held out.
pub fn run_one(
    algorithm: &Algorithm,
    domains: &[DomainData],
    target: usize,
    seed: u64,
    head: &HeadConfig,
    options: &BenchOptions,
) -> anyhow::Result<RunResult> {
    let sources: Vec<&DomainData> = domains
        .iter()
        .enumerate()
        .filter(|(d, _)| *d != target)
        .map(|(_, d)| d)
        .collect();
    let train = TrainParams {
        objective: algorithm.objective,
        local_epochs: options.local_epochs,
        ..TrainParams::default()
    };
    let config = RoundConfig {
        rounds: options.rounds,
        min_clients: sources.len(),
        min_updates: sources.len(),
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
    let val_total: usize = sources.iter().map(|s| s.val.len()).sum();
    let mut best = (0u64, f32::NEG_INFINITY, 0f32);
    let mut last_target = 0f32;
    let mut now = 0u64;
    loop {
        let mut task = None;
        let mut finished = false;
        while let Some(output) = machine.poll_output() {
            match output {
                Output::PublishTask { frame, .. } => task = Some(frame),
                Output::RoundEnded(report) if report.aggregated => {
                    let params = machine.params();
                    let mut val = 0f64;
                    for s in &sources {
                        val += accuracy(head, params, &s.val)? as f64 * s.val.len() as f64;
                    }
                    let val = (val / val_total.max(1) as f64) as f32;
                    last_target = accuracy(head, params, &domains[target].all)?;
                    if val > best.1 {
                        best = (report.round, val, last_target);
                    }
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
    Ok(RunResult {
        algorithm: algorithm.name.clone(),
        target: domains[target].name.clone(),
        seed,
        best_round: best.0,
        best_source_val: best.1,
        target_accuracy: best.2,
        final_target_accuracy: last_target,
        final_params: machine.params().to_vec(),
    })
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

/// The results as a Markdown table: rows are algorithms, columns target domains and the
/// average, cells `mean ± std` over seeds of the target accuracy (percent).
pub fn markdown(results: &[RunResult]) -> String {
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
    let mut out = format!("| algorithm | {} | average |\n|---|", targets.join(" | "));
    out.push_str(&"---|".repeat(targets.len() + 1));
    out.push('\n');
    for a in &algorithms {
        out.push_str(&format!("| {a} |"));
        let mut per_seed_avg: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
        for t in &targets {
            let accs: Vec<f32> = results
                .iter()
                .filter(|r| r.algorithm == *a && r.target == *t)
                .map(|r| {
                    per_seed_avg
                        .entry(r.seed)
                        .or_default()
                        .push(r.target_accuracy);
                    r.target_accuracy * 100.0
                })
                .collect();
            let (m, s) = mean_std(&accs);
            out.push_str(&format!(" {m:.1} ± {s:.1} |"));
        }
        let avgs: Vec<f32> = per_seed_avg
            .values()
            .map(|v| v.iter().sum::<f32>() / v.len() as f32 * 100.0)
            .collect();
        let (m, s) = mean_std(&avgs);
        out.push_str(&format!(" **{m:.1} ± {s:.1}** |\n"));
    }
    out
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
    fn mean_and_std_of_seeds() {
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_std(&[1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 2f32.sqrt()).abs() < 1e-6);
    }
}
