//! One benchmark run, in process or over MQTT, and the loops over seeds, targets and
//! algorithms.

use std::sync::Arc;

use anyhow::Context;
use std::sync::Mutex;
use std::time::Instant;

use fedge_coordinator::InsightConfig;
use fedge_coordinator::PrototypeConfig;
use fedge_coordinator::config::PrivacySettings;
use fedge_coordinator::{Output, RoundConfig, Rounds};
use fedge_edge::agent::class_stats;
use fedge_edge::site_norm::{FeatureNorm, FeatureStats, site_stats, standardise, stats_of};
use fedge_edge::{DdlViews, FeatureSet, LocalState, RoundInputs, TrainJob, accuracy, train_local};
use fedge_models::{Backend, HeadConfig, ModelLayout, training_device};
use fedge_wire::{ClientUpdate, LocalMetrics, Message, Objective, TensorF32};

use super::{
    Algorithm, BenchOptions, DomainData, Prepared, RunResult, Scenario, Transport, in_parallel,
};
use crate::demo::pooled_accuracy;

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

/// What one run needs: the algorithm, the seed's splits with the held-out domain, the seed,
/// the head and the benchmark's options.
#[derive(Clone, Copy)]
pub struct RunSpec<'a> {
    /// The algorithm to run.
    pub algorithm: &'a Algorithm,
    /// Every domain's splits for this seed.
    pub domains: &'a [DomainData],
    /// The held-out domain's index.
    pub target: usize,
    /// Seed of the initial head, sampling and local shuffling.
    pub seed: u64,
    /// The head's sizes.
    pub head: &'a HeadConfig,
    /// Rounds, local epochs, scenario.
    pub options: &'a BenchOptions,
}

impl<'a> RunSpec<'a> {
    /// The fields as a tuple, for a run's body.
    fn parts(
        &self,
    ) -> (
        &'a Algorithm,
        &'a [DomainData],
        usize,
        u64,
        &'a HeadConfig,
        &'a BenchOptions,
    ) {
        (
            self.algorithm,
            self.domains,
            self.target,
            self.seed,
            self.head,
            self.options,
        )
    }
}

impl Case<'_> {
    fn spec<'s>(&'s self, head: &'s HeadConfig, options: &'s BenchOptions) -> RunSpec<'s> {
        RunSpec {
            algorithm: self.algorithm,
            domains: &self.domains,
            target: self.target,
            seed: self.seed,
            head,
            options,
        }
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
    seeds: u64,
) -> impl Iterator<Item = Case<'a>> + 'a {
    (0..seeds.max(1)).flat_map(move |seed| {
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
    mut progress: impl FnMut(Progress),
) -> anyhow::Result<Vec<RunResult>> {
    let head = head_of(prepared, options);
    let mut results = Vec::new();
    for case in cases(prepared, algorithms, options.seeds) {
        let r = run_one(&case.spec(&head, options), |round| {
            progress(case.round(round))
        })?;
        progress(Progress::Run(&r));
        results.push(r);
    }
    Ok(results)
}

/// Every algorithm with every target and seed over `transport`.
pub async fn run_all(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    transport: Transport,
    mut progress: impl FnMut(Progress),
) -> anyhow::Result<Vec<RunResult>> {
    if transport == Transport::InProcess {
        return run_lodo(prepared, algorithms, options, progress);
    }
    let head = head_of(prepared, options);
    let mut results = Vec::new();
    for case in cases(prepared, algorithms, options.seeds) {
        let on_round = |round| progress(case.round(round));
        let r = run_one_mqtt(&case.spec(&head, options), on_round).await?;
        progress(Progress::Run(&r));
        results.push(r);
    }
    Ok(results)
}

fn head_of(prepared: &Prepared, options: &BenchOptions) -> HeadConfig {
    HeadConfig::new(prepared.feature_size, prepared.classes).with_hidden(options.hidden)
}

/// One run as a real federation over an embedded MQTT broker (the `fedge demo` machinery):
/// the same clients, seeds and selection rule as [`run_one`].
pub async fn run_one_mqtt(
    spec: &RunSpec<'_>,
    mut on_round: impl FnMut(u64),
) -> anyhow::Result<RunResult> {
    let (algorithm, domains, target, seed, head, options) = spec.parts();
    let sources = clients(domains, target, options.scenario, seed)?;
    let norm = algorithm.base.feature_norm;
    let sources = site_normalised(sources, norm);
    let per_round = match options.scenario {
        Scenario::Lodo => None,
        Scenario::Multi { sample, .. } => Some(sample),
        Scenario::Sites { .. } => {
            anyhow::bail!("--scenario sites runs in process only; leave out --transport mqtt")
        }
    };
    let data = crate::demo::DemoData {
        head: head.clone(),
        selection: sources.iter().map(|c| Arc::clone(&c.scored_val)).collect(),
        clients: sources
            .iter()
            .map(|c| crate::demo::DemoClient {
                id: c.name.clone(),
                train: Arc::clone(&c.train),
                val: Arc::clone(&c.val),
                views: c.views.clone(),
                site: None,
            })
            .collect(),
        // The unseen site's agent scores the releases and standardises its own features.
        target: Arc::clone(&domains[target].held_out),
        target_name: domains[target].name.clone(),
    };
    let demo_options = crate::demo::DemoOptions {
        rounds: options.rounds,
        clients: sources.len(),
        per_round,
        strategy: algorithm.strategy.clone(),
        train: algorithm.train_params(options.local_epochs),
        seed,
        hidden: head.hidden,
        federation: format!("bench-{seed}-{target}"),
        round_timeout_s: 600.0,
        privacy: algorithm.privacy.as_ref().map(|p| p.for_run(seed)),
        ..crate::demo::DemoOptions::default()
    };
    let result = crate::demo::run(&demo_options, &data, |row| on_round(row.round)).await?;
    let scores = result.rounds.iter().filter_map(|row| {
        let (val, target) = (row.selection_accuracy?, row.target_accuracy?);
        Some((row.round, val, target, row.clients))
    });
    let mut result = RunResult::select(
        algorithm,
        &domains[target].name,
        seed,
        scores,
        result.final_params,
    );
    // Over MQTT the devices time themselves; the in-process runs report training cost.
    result.train_seconds_per_round = f64::NAN;
    Ok(result)
}

/// One run in process: `algorithm` with `domains[target]` held out.
pub fn run_one(spec: &RunSpec<'_>, mut on_round: impl FnMut(u64)) -> anyhow::Result<RunResult> {
    let (algorithm, domains, target, seed, head, options) = spec.parts();
    let sources = clients(domains, target, options.scenario, seed)?;
    let norm = algorithm.base.feature_norm;
    let sources = site_normalised(sources, norm);
    let held_out = held_out(&domains[target], norm);
    let sites = matches!(options.scenario, Scenario::Sites { .. });
    anyhow::ensure!(
        !(sites && algorithm.objective == Objective::FedDim),
        "{}: {}",
        algorithm.name,
        fedge_coordinator::site::MergeError::FedDim
    );
    // The round machine's participants: the devices, or with sites the sites.
    let mut participants: Vec<&str> = (sources.iter())
        .map(|c| {
            if sites {
                c.site.as_str()
            } else {
                c.name.as_str()
            }
        })
        .collect();
    // A site's devices are consecutive.
    participants.dedup();
    let (fraction, per_round) = match options.scenario {
        Scenario::Lodo | Scenario::Sites { .. } => (1.0, participants.len()),
        Scenario::Multi { sample, .. } => {
            let sample = sample.clamp(1, sources.len());
            (sample as f32 / sources.len() as f32, sample)
        }
    };
    let train = algorithm.train_params(options.local_epochs);
    // Central DP: noise seeded from the run's seed; each device selected with probability
    // `fraction` (Poisson), so a round takes whoever was drawn.
    let privacy = algorithm.privacy.as_ref().map(|p| p.for_run(seed));
    let central = privacy.as_ref().and_then(PrivacySettings::central);
    let config = RoundConfig {
        rounds: options.rounds,
        fraction,
        // At least `per_round` selected (the machine selects no fewer than `min_clients`): with
        // every client as the floor, `multi` trained all of them each round, whatever its sample.
        min_clients: per_round,
        min_updates: if central.is_some() { 1 } else { per_round },
        privacy: central,
        round_timeout_ms: u64::MAX / 4,
        train: train.clone(),
        seed,
        insight: (algorithm.objective == Objective::FedDim).then_some(InsightConfig {
            hidden: head.hidden,
            classes: head.classes,
            momentum: 0.5,
        }),
        prototypes: (algorithm.objective == Objective::FedDdl).then_some(PrototypeConfig {
            hidden: head.hidden,
            classes: head.classes,
        }),
        ..RoundConfig::default()
    };
    let noise = privacy.as_ref().map(PrivacySettings::noise);
    let strategy =
        (algorithm.strategy.build_with(central.zip(noise))).map_err(anyhow::Error::msg)?;
    let layout = ModelLayout::new(head.clone(), algorithm.objective.carries_generator());
    let mut machine = Rounds::new(config, strategy, layout.init_flat(seed));
    // What each device keeps between rounds (Stable-FedADG's discriminator and memory).
    let states: Vec<Mutex<LocalState>> = sources.iter().map(|_| Mutex::default()).collect();
    let mut train_seconds = 0f64;
    // The first round opens once `per_round` clients are online, with those: they come online
    // in a seeded random order, so the first round's sample is as random as the later ones.
    let mut arrival = participants.clone();
    rand::seq::SliceRandom::shuffle(
        &mut arrival[..],
        &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed ^ 0x6f6e_6c69_6e65),
    );
    for participant in &arrival {
        machine.handle_client_status(participant, true, 0);
    }
    machine.start(0);
    let val_sets: Vec<Arc<FeatureSet>> =
        sources.iter().map(|c| Arc::clone(&c.scored_val)).collect();
    let mut scores = Vec::new();
    let mut now = 0u64;
    loop {
        let mut task = None;
        let mut finished = false;
        while let Some(output) = machine.poll_output() {
            match output {
                Output::PublishTask { frame, .. } => task = Some(frame),
                Output::RoundEnded(report) if report.aggregated => {
                    let params = layout.head_part(machine.params());
                    let val = pooled_accuracy(head, params, &val_sets);
                    let target_accuracy = accuracy(head, params, &held_out)?;
                    scores.push((report.round, val, target_accuracy, report.reported.len()));
                    on_round(report.round);
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
        let prototypes = task.prototypes.as_ref().map(TensorF32::to_vec);
        // A selected site trains all of its devices.
        let selected: Vec<(&Client, &Mutex<LocalState>)> = sources
            .iter()
            .zip(&states)
            .filter(|(s, _)| {
                task.selected
                    .contains(if sites { &s.site } else { &s.name })
            })
            .collect();
        let frames = in_parallel(&selected, |(source, state)| {
            let inputs = RoundInputs {
                insight: insight.as_deref(),
                prototypes: prototypes.as_deref(),
                views: source.views.as_deref(),
            };
            let mut state = state
                .lock()
                .map_err(|_| anyhow::anyhow!("a client state is poisoned"))?;
            let start = Instant::now();
            let out = train_local(
                &TrainJob::new(
                    head,
                    &global,
                    &source.train,
                    &task.train,
                    &training_device(Backend::default()),
                )
                .with_inputs(inputs)
                .with_stats(source.stats.as_deref())
                .with_seed(fedge_edge::train::round_seed(
                    seed,
                    task.round,
                    &source.name,
                )),
                &mut state,
            )?;
            let seconds = start.elapsed().as_secs_f64();
            let update = ClientUpdate {
                run: task.run,
                round: task.round,
                client_id: source.name.clone(),
                seq: task.round,
                num_samples: source.train.len() as u32,
                delta: TensorF32::from_slice_with(&out.delta, task.train.update_codec),
                metrics: LocalMetrics {
                    train_loss: out.last_epoch_loss,
                    ..LocalMetrics::default()
                },
                class_stats: out
                    .class_stats
                    .map(|s| class_stats(s, task.train.update_codec)),
                prototypes: out
                    .prototypes
                    .map(|s| class_stats(s, task.train.update_codec)),
            };
            Ok((update, seconds))
        })?;
        // Handed over in client order, whichever thread finished first; with sites, each
        // site's devices merged first, in device order.
        let mut updates: Vec<(String, Vec<ClientUpdate>)> = Vec::new();
        for ((source, _), (update, seconds)) in selected.iter().zip(frames) {
            train_seconds += seconds;
            let sender = if sites { &source.site } else { &source.name };
            match updates.last_mut() {
                Some((last, group)) if sites && last == sender => group.push(update),
                _ => updates.push((sender.clone(), vec![update])),
            }
        }
        for (sender, group) in updates {
            let update = match group.as_slice() {
                [one] if !sites => one.clone(),
                _ => fedge_coordinator::site::merge(&sender, &group, train.update_codec)?,
            };
            now += 1;
            let frame = fedge_wire::encode(&Message::ClientUpdate(update));
            machine.handle_packet(&sender, &frame, now);
        }
    }
    let mut result = RunResult::select(
        algorithm,
        &domains[target].name,
        seed,
        scores,
        machine.params().to_vec(),
    );
    result.train_seconds_per_round = train_seconds / options.rounds.max(1) as f64;
    result.epsilon = machine.privacy_spent().map(|p| p.epsilon);
    Ok(result)
}

/// A client of a run: its id, its site (the source domain), its splits and FedDDL's views of
/// its training split.
struct Client {
    name: String,
    site: String,
    train: Arc<FeatureSet>,
    val: Arc<FeatureSet>,
    views: Option<Arc<DdlViews>>,
    /// With site normalisation, the statistics of its training and validation rows.
    stats: Option<Arc<FeatureStats>>,
    /// What the global head is scored on: `val`, standardised with `stats` when there are.
    scored_val: Arc<FeatureSet>,
}

/// The clients of a run holding out `domains[target]`, each with FedDDL's views of its own
/// training rows when the domains carry a view source.
fn clients(
    domains: &[DomainData],
    target: usize,
    scenario: Scenario,
    seed: u64,
) -> anyhow::Result<Vec<Client>> {
    let sources = domains.iter().enumerate().filter(|(d, _)| *d != target);
    let views =
        |d: &DomainData, rows: &[usize]| d.views.as_ref().map(|v| v.views(rows)).transpose();
    let mut out = Vec::new();
    match scenario {
        Scenario::Lodo => {
            for (_, d) in sources {
                let all: Vec<usize> = (0..d.train.len()).collect();
                out.push(Client {
                    name: d.name.clone(),
                    site: d.name.clone(),
                    train: Arc::clone(&d.train),
                    val: Arc::clone(&d.val),
                    views: views(d, &all)?,
                    stats: None,
                    scored_val: Arc::clone(&d.val),
                });
            }
        }
        Scenario::Multi {
            clients_per_domain: parts,
            ..
        }
        | Scenario::Sites { devices: parts } => {
            let parts = parts.max(1);
            for (i, d) in sources {
                let salt = seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let train = partition_indices(d.train.len(), parts, salt);
                let val = partition(&d.val, parts, salt ^ 1);
                for (c, (t, v)) in train.into_iter().zip(val).enumerate() {
                    if t.is_empty() {
                        continue;
                    }
                    let val = Arc::new(v);
                    out.push(Client {
                        name: format!("{}-{c:02}", d.name),
                        site: d.name.clone(),
                        train: Arc::new(d.train.rows(&t)),
                        scored_val: Arc::clone(&val),
                        val,
                        views: views(d, &t)?,
                        stats: None,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// With site normalisation, every client's statistics (over its training and validation rows,
/// as a device computes them) for its trainer, and its validation rows standardised for
/// scoring; the trainer standardises the training rows and views itself.
fn site_normalised(clients: Vec<Client>, norm: FeatureNorm) -> Vec<Client> {
    if norm == FeatureNorm::None {
        return clients;
    }
    clients
        .into_iter()
        .map(|c| {
            let Some(stats) = site_stats(&c.train, &c.val) else {
                return c;
            };
            Client {
                scored_val: Arc::new(standardise(&stats, &c.val)),
                stats: Some(Arc::new(stats)),
                ..c
            }
        })
        .collect()
}

/// What the held-out site is scored on: with site normalisation, standardised with its own
/// statistics (computed from its images alone, no label).
fn held_out(domain: &DomainData, norm: FeatureNorm) -> Arc<FeatureSet> {
    match (norm, stats_of(&[&domain.held_out])) {
        (FeatureNorm::Site, Some(stats)) => Arc::new(standardise(&stats, &domain.held_out)),
        _ => Arc::clone(&domain.held_out),
    }
}

/// Splits `set` into `parts` disjoint parts at random (seeded), sizes within one.
pub fn partition(set: &FeatureSet, parts: usize, seed: u64) -> Vec<FeatureSet> {
    partition_indices(set.len(), parts, seed)
        .iter()
        .map(|mine| set.rows(mine))
        .collect()
}

/// The rows of each part of [`partition`].
fn partition_indices(n: usize, parts: usize, seed: u64) -> Vec<Vec<usize>> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let parts = parts.max(1);
    (0..parts)
        .map(|p| order.iter().skip(p).step_by(parts).copied().collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
