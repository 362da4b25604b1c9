//! One benchmark run, in process (the simulator) or over MQTT; the loops over seeds, targets
//! and algorithms call it.

use std::sync::Arc;

use fedge_coordinator::RoundConfig;
use fedge_coordinator::boot::Plan;
use fedge_coordinator::config::PrivacySettings;
use fedge_coordinator::round::RelayConfig;
use fedge_device::site_norm::FeatureSummary;
use fedge_device::{FeatureSet, accuracy_with};
use fedge_models::Tail;
use fedge_models::{HeadConfig, ModelLayout};
use fedge_sim::{Action, CoordinatorSpec, DeviceSpec, NodeId, Observed, Sim, Upstream};
use fedge_wire::{FeatureNorm, Objective};

use super::choice::choice_accuracy;
use super::clients::{Client, clients, standardised_site};
use super::tta::{Tta, prior_em_accuracy, t3a_accuracy};
use super::{Algorithm, BenchOptions, DomainData, RunResult, Scenario, TargetSite, Transport};

/// How far ahead devices' absences are scheduled (virtual ms): past any run's end.
const AWAY_HORIZON_MS: u64 = 6 * 3600 * 1000;

/// The clients whose update the norm guard scaled down, over every run of this process (one
/// entry per scaling), for the one line `fedge eval` prints instead of a log line each.
static NORM_SCALED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The clients whose update the norm guard scaled down in this process's runs so far (one entry
/// per scaling).
pub fn norm_scaled() -> Vec<String> {
    NORM_SCALED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
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
    /// The backbone's tail when the head trains one (`--train-tail`).
    pub tail: Option<&'a Arc<Tail>>,
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

/// One run as a real federation over an embedded MQTT broker (the `fedge demo` machinery):
/// the same clients, seeds and selection rule as [`run_one`].
pub async fn run_one_mqtt(
    spec: &RunSpec<'_>,
    mut on_round: impl FnMut(u64),
) -> anyhow::Result<RunResult> {
    let (algorithm, domains, target, seed, head, options) = spec.parts();
    options.check(Transport::Mqtt)?;
    anyhow::ensure!(
        algorithm.tta == Tta::None,
        "{}: /tta runs in process only (drop --transport mqtt)",
        algorithm.name
    );
    let sources = clients(domains, target, options.scenario, seed)?;
    let (per_round, sites) = match options.scenario {
        Scenario::Lodo => (None, false),
        Scenario::Multi { sample, .. } => (Some(sample), false),
        Scenario::Sites { .. } => (None, true),
    };
    let data = crate::demo::DemoData {
        head: head.clone(),
        selection: sources.iter().map(|c| c.data.clone()).collect(),
        clients: sources
            .iter()
            .map(|c| crate::demo::DemoClient {
                id: c.name.clone(),
                train: Arc::clone(c.data.train()),
                val: Arc::clone(c.data.val()),
                views: c.data.views().cloned(),
                site: sites.then(|| c.site.clone()),
                privacy: algorithm.local_privacy_for(seed, &c.name),
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
        sites: match sites {
            true => crate::demo::sites::members(&data).len(),
            false => 0,
        },
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

/// One run in process: `algorithm` with `domains[target]` held out, in the deterministic
/// simulator (`fedge-sim`): the real round machine, the real device agents training with the
/// deployed round function, and with `--scenario sites` the real site aggregators in relay mode.
/// A rejected update is counted in the result, as the coordinator counts it.
pub fn run_one(spec: &RunSpec<'_>, mut on_round: impl FnMut(u64)) -> anyhow::Result<RunResult> {
    let (algorithm, domains, target, seed, head, options) = spec.parts();
    let tail = spec.tail.map(|t| &**t);
    anyhow::ensure!(
        tail.is_none()
            || (algorithm.base.feature_norm == FeatureNorm::None && algorithm.tta == Tta::None),
        "{}: with a trainable tail, features reach the head unstandardised (feature_norm = none) \
         and without test-time adaptation: site statistics after a moving tail are not built yet",
        algorithm.name
    );
    // Accuracy of a flat head, through the tail when there is one.
    let score = |params: &[f32], set: &FeatureSet| accuracy_with(head, params, tail, set);
    let pooled = |params: &[f32], sets: &[Arc<FeatureSet>]| {
        let total: usize = sets.iter().map(|s| s.len()).sum();
        let correct: f64 = (sets.iter())
            .map(|s| f64::from(score(params, s).unwrap_or(0.0)) * s.len() as f64)
            .sum();
        (correct / total.max(1) as f64) as f32
    };
    let sources = clients(domains, target, options.scenario, seed)?;
    let norm = algorithm.base.feature_norm;
    let held_out = TargetSite::new(&domains[target].held_out, head.classes, options.site, seed);
    let sites = matches!(options.scenario, Scenario::Sites { .. });
    anyhow::ensure!(
        !(sites && algorithm.objective == Objective::FedDim),
        "{}: {}",
        algorithm.name,
        fedge_coordinator::round::RelayError::FedDim
    );
    // The global round machine's participants: the devices, or with sites the sites.
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
    let classes = fedge_sim::class_names(head.classes);
    let federation = format!("bench-{seed}-{target}");
    let config = RoundConfig {
        federation: federation.clone(),
        classes: classes.clone(),
        head: Some(head.clone()),
        rounds: options.rounds,
        fraction,
        // At least `per_round` selected (the machine selects no fewer than `min_clients`): with
        // every client as the floor, `multi` trained all of them each round, whatever its sample.
        min_clients: per_round,
        // With a deadline, the quorum is half the sample: the round closes without its
        // stragglers.
        min_updates: match (central, options.pace.round_timeout_ms) {
            (Some(_), _) => 1,
            (None, Some(_)) => per_round.div_ceil(2),
            (None, None) => per_round,
        },
        privacy: central,
        round_timeout_ms: options.pace.round_timeout_ms.unwrap_or(u64::MAX / 4),
        train: train.clone(),
        seed,
        aggregation: options.pace.aggregation.clone(),
        ..RoundConfig::default()
    }
    .with_objective(algorithm.objective, head, 0.5);
    let layout = ModelLayout::new(head.clone(), algorithm.objective.carries_generator());
    let plan = Plan {
        round: config,
        strategy: algorithm.strategy.clone(),
        noise_seed: privacy.as_ref().and_then(|p| p.seed),
        initial: layout.init_flat(seed),
    };
    let mut sim = Sim::new(seed);
    let global = sim.add_coordinator(CoordinatorSpec {
        plan: plan.clone(),
        upstream: None,
    })?;
    // The participants come online in a seeded random order, so the first round's sample is as
    // random as the later ones (it opens once `per_round` are online, with those).
    let mut arrival = participants.clone();
    rand::seq::SliceRandom::shuffle(
        &mut arrival[..],
        &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed ^ 0x6f6e_6c69_6e65),
    );
    let mut added = Vec::new();
    for participant in &arrival {
        let (device_federation, devices): (String, Vec<&Client>) = if sites {
            // The site's aggregator, as `fedge-coordinator run` with `role = "site"` runs it.
            let members: Vec<&Client> = sources.iter().filter(|c| c.site == *participant).collect();
            // The site's name is its devices' federation, as in `fedge demo --sites`.
            let site_federation = participant.to_string();
            let round = RoundConfig {
                federation: site_federation.clone(),
                rounds: 0,
                fraction: 1.0,
                min_clients: members.len(),
                min_updates: members.len(),
                insight: None,
                privacy: None,
                relay: Some(RelayConfig {
                    site: participant.to_string(),
                    margin_ms: 0,
                }),
                ..plan.round.clone()
            };
            // A site aggregates its devices with FedAvg, as `fedge demo --sites` does.
            let site = Plan {
                round,
                strategy: Default::default(),
                noise_seed: None,
                initial: plan.initial.clone(),
            };
            sim.add_coordinator(CoordinatorSpec {
                plan: site,
                upstream: Some(Upstream {
                    federation: federation.clone(),
                    key: None,
                }),
            })?;
            (site_federation, members)
        } else {
            let one = sources.iter().filter(|c| c.name == *participant).collect();
            (federation.clone(), one)
        };
        for client in devices {
            let mut device = DeviceSpec::new(
                &client.name,
                &device_federation,
                head.clone(),
                client.data.clone(),
            );
            device.seed = seed;
            device.tail = spec.tail.cloned();
            device.privacy = algorithm.local_privacy_for(seed, &client.name);
            device.train_ms = options.pace.train_ms(seed, &client.name);
            let d = sim.add_device(device)?;
            added.push(d);
            for (leave, back) in options.pace.windows(seed, &client.name, AWAY_HORIZON_MS) {
                sim.schedule(leave, Action::Disconnect(NodeId::Device(d)));
                sim.schedule(back, Action::Connect(NodeId::Device(d)));
            }
        }
    }
    // The sources' validation rows as each device standardises them: once for `none` and
    // `site`, with each round's pooled summary for the pooling estimators.
    let val_sets = |pooled: Option<&FeatureSummary>| -> Vec<Arc<FeatureSet>> {
        (sources.iter())
            .map(|c| (c.data).scored_val(c.data.stats(norm, pooled, head.classes).as_ref()))
            .collect()
    };
    let fixed_val = (!norm.pools()).then(|| val_sets(None));
    let fixed_target = (!norm.pools()).then(|| standardised_site(&held_out, norm, None, head, &[]));
    let mut scores = Vec::new();
    let mut train_seconds = 0f64;
    let mut rejected = std::collections::BTreeMap::new();
    let mut final_params = plan.initial.clone();
    let mut times = Vec::new();
    let mut stopped = None;
    // Rejections since the last round ended: why a round that never ends is stuck.
    let mut this_round = std::collections::BTreeMap::new();
    loop {
        let moved = sim.run_until(u64::MAX / 2, |s| s.has_observed() || s.finished(global));
        for observed in sim.take_observed() {
            match observed {
                Observed::RoundEnded {
                    coordinator,
                    report,
                    params,
                } if coordinator == global && report.aggregated => {
                    NORM_SCALED
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend((report.norm_clipped.iter()).map(|c| c.client.clone()));
                    let params_head = layout.head_part(&params);
                    let pooled_summary =
                        (sim.coordinator(global)).and_then(|r| r.pooled()).cloned();
                    let val = match &fixed_val {
                        Some(sets) => pooled(params_head, sets),
                        None => pooled(params_head, &val_sets(pooled_summary.as_ref())),
                    };
                    let fresh;
                    let (calibration, scored) = match &fixed_target {
                        Some(site) => site,
                        None => {
                            let pooled = pooled_summary.as_ref();
                            fresh = standardised_site(&held_out, norm, pooled, head, params_head);
                            &fresh
                        }
                    };
                    let target_accuracy = match algorithm.tta {
                        Tta::None => score(params_head, scored)?,
                        Tta::T3a => t3a_accuracy(head, params_head, calibration, scored),
                        Tta::PriorEm => {
                            let pool = pooled_summary.as_ref();
                            match prior_em_accuracy(head, params_head, &held_out, pool, norm)? {
                                Some(accuracy) => accuracy,
                                None => score(params_head, scored)?,
                            }
                        }
                        Tta::Choose | Tta::ChooseLabelled => {
                            // The release a device receives for this round, when it is one.
                            let release = (sim.coordinator(global))
                                .and_then(|r| r.releases().serving().cloned())
                                .filter(|r| r.round == report.round);
                            let labelled = algorithm.tta == Tta::ChooseLabelled;
                            match release {
                                Some(r) => choice_accuracy(&r, &held_out, labelled, seed)?.0,
                                None => score(params_head, scored)?,
                            }
                        }
                    };
                    scores.push((report.round, val, target_accuracy, report.reported.len()));
                    this_round.clear();
                    times.push(sim.now_ms());
                    final_params = params;
                    on_round(report.round);
                }
                Observed::RoundEnded { .. } => this_round.clear(),
                Observed::Rejected { reason, .. } => {
                    *rejected.entry(reason.name().to_owned()).or_insert(0u64) += 1;
                    *this_round.entry(reason.name()).or_insert(0u64) += 1;
                }
                Observed::Refused { reason, .. } => anyhow::bail!("{}: {reason}", algorithm.name),
                Observed::Trained { seconds, .. } => train_seconds += f64::from(seconds),
                _ => {}
            }
        }
        if sim.finished(global) {
            break;
        }
        if !moved {
            // Nothing left to happen, and the federation has no deadline in process: when the
            // round cannot end because its devices declined it or their updates were rejected
            // (a diverging learning rate ends in a non-finite loss or in steps beyond the
            // coordinator's bounds), the run ends here with the rounds it had and the table says
            // so; a round stuck for no reason is a fault.
            let mut why = declined_reasons(&sim, &added);
            if !this_round.is_empty() {
                let counts: Vec<String> = (this_round.iter())
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect();
                why.push(format!("updates rejected ({})", counts.join(", ")));
            }
            anyhow::ensure!(
                !why.is_empty(),
                "the simulated federation stopped before its last round"
            );
            let last = scores.last().map_or(0, |s: &(u64, f32, f32, usize)| s.0);
            stopped = Some(format!("after round {last}: {}", why.join("; ")));
            break;
        }
    }
    let mut result =
        RunResult::select(algorithm, &domains[target].name, seed, scores, final_params);
    for (score, at_ms) in result.curve.iter_mut().zip(times) {
        score.at_ms = at_ms;
    }
    result.train_seconds_per_round = train_seconds / options.rounds.max(1) as f64;
    result.epsilon = (sim.coordinator(global))
        .and_then(|rounds| rounds.privacy_spent())
        .map(|p| p.epsilon);
    result.rejected = rejected;
    result.stopped = stopped;
    Ok(result)
}

/// The distinct reasons `devices` give for the last round they declined.
fn declined_reasons(sim: &Sim, devices: &[usize]) -> Vec<String> {
    let mut reasons: Vec<String> = (devices.iter())
        .filter_map(|d| sim.agent(*d).status().declined.as_ref())
        .map(|declined| declined.reason.clone())
        .collect();
    reasons.sort();
    reasons.dedup();
    reasons
}
