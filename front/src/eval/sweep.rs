//! The loops over seeds, held-out domains and algorithms, each case one run of `super::run`,
//! in process or over MQTT, with progress as rounds and runs end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use fedge_models::{HeadConfig, Tail};

use super::run::{RunSpec, run_one, run_one_mqtt};
use super::{Algorithm, BenchOptions, DomainData, Prepared, RunResult, Transport};

/// What a benchmark reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// A round of a run was aggregated.
    Round {
        /// Algorithm name.
        algorithm: &'a str,
        /// Held-out domain.
        target: &'a str,
        /// Seed.
        seed: u64,
        /// The round just aggregated.
        round: u64,
    },
    /// A run finished.
    Run(&'a RunResult),
}

/// One run to make: a seed, a held-out domain, an algorithm, and the seed's splits.
struct Case<'a> {
    seed: u64,
    target: usize,
    algorithm: &'a Algorithm,
    domains: Arc<Vec<DomainData>>,
}

impl Case<'_> {
    fn spec<'s>(
        &'s self,
        head: &'s HeadConfig,
        tail: Option<&'s Arc<Tail>>,
        options: &'s BenchOptions,
    ) -> RunSpec<'s> {
        RunSpec {
            algorithm: self.algorithm,
            domains: &self.domains,
            target: self.target,
            seed: self.seed,
            head,
            tail,
            options,
        }
    }

    /// The run, for an error: algorithm, held-out domain, seed.
    fn what(&self) -> String {
        format!(
            "{} with {} held out, seed {}",
            self.algorithm.name, self.domains[self.target].name, self.seed
        )
    }

    fn round(&self, round: u64) -> Progress<'_> {
        Progress::Round {
            algorithm: &self.algorithm.name,
            target: &self.domains[self.target].name,
            seed: self.seed,
            round,
        }
    }
}

/// Every (seed, target, algorithm) in report order; each seed's splits are made once.
fn cases<'a>(
    prepared: &'a Prepared,
    algorithms: &'a [Algorithm],
    seeds: &'a [u64],
) -> impl Iterator<Item = Case<'a>> + 'a {
    seeds.iter().copied().flat_map(move |seed| {
        let domains = Arc::new(prepared.split(seed));
        (0..domains.len()).flat_map(move |target| {
            let domains = Arc::clone(&domains);
            algorithms.iter().map(move |algorithm| Case {
                seed,
                target,
                algorithm,
                domains: Arc::clone(&domains),
            })
        })
    })
}

/// Runs every algorithm with every target and seed in process; `progress` sees every round and
/// every finished run.
pub fn run_lodo(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    progress: impl FnMut(Progress),
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    let never = AtomicBool::new(false);
    in_process(
        prepared,
        algorithms,
        options,
        &never,
        &mut results,
        progress,
    )?;
    Ok(results)
}

/// Every algorithm with every target and seed over `transport`.
pub async fn run_all(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    transport: Transport,
    progress: impl FnMut(Progress),
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    let never = AtomicBool::new(false);
    run_into(
        prepared,
        algorithms,
        options,
        transport,
        &never,
        &mut results,
        progress,
    )
    .await?;
    Ok(results)
}

/// Every algorithm with every target and seed over `transport`, each finished run pushed onto
/// `results` as it ends, so that a caller keeps them when a run fails or when `stop` is set
/// (checked before each run). An error names the algorithm, the held-out domain and the seed.
pub async fn run_into(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    transport: Transport,
    stop: &AtomicBool,
    results: &mut Vec<RunResult>,
    mut progress: impl FnMut(Progress),
) -> anyhow::Result<()> {
    if transport == Transport::InProcess {
        return in_process(prepared, algorithms, options, stop, results, progress);
    }
    anyhow::ensure!(
        prepared.tail.is_none(),
        "a trainable tail runs in the simulator only for now (leave out --transport mqtt)"
    );
    let head = head_of(prepared, options);
    for case in cases(prepared, algorithms, &options.seeds) {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let on_round = |round| progress(case.round(round));
        let r = (run_one_mqtt(&case.spec(&head, None, options), on_round).await)
            .with_context(|| case.what())?;
        progress(Progress::Run(&r));
        results.push(r);
    }
    Ok(())
}

/// [`run_into`] in process, in the simulator.
fn in_process(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    stop: &AtomicBool,
    results: &mut Vec<RunResult>,
    mut progress: impl FnMut(Progress),
) -> anyhow::Result<()> {
    let head = head_of(prepared, options);
    for case in cases(prepared, algorithms, &options.seeds) {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let on_round = |round| progress(case.round(round));
        let tail = prepared.tail.as_ref();
        let r = run_one(&case.spec(&head, tail, options), on_round).with_context(|| case.what())?;
        progress(Progress::Run(&r));
        results.push(r);
    }
    Ok(())
}

fn head_of(prepared: &Prepared, options: &BenchOptions) -> HeadConfig {
    match &prepared.tail {
        Some(tail) => HeadConfig::new(tail.config.features(), prepared.classes)
            .with_hidden(options.hidden)
            .with_tail(tail.config),
        None => {
            HeadConfig::new(prepared.feature_size, prepared.classes).with_hidden(options.hidden)
        }
    }
}
