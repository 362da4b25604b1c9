//! `fedge bench labelling`: what the labels a site's labelling queue asks for are worth
//! (`fedge_device::labelling`, docs/algorithms.md §10), against as many labels picked at random,
//! measured on `digits-sensor` with the deployed round machines in the simulator.
//!
//! Per seed, the digits are dealt into two class-stratified halves. The first half is dealt
//! again into five training sites, each seen through its own sensor of `digits-sensor` (clean,
//! low contrast, noisy, washed out, dark and noisy: every sensor but the blurred one), each
//! device keeping 10 % of its rows for validation as `fedge eval` does. The second half is the
//! deployed site, seen through the blurred sensor: the first `stream` of its images (in the
//! deal's shuffled order) are the requests it serves, unlabelled; the rest are held out and
//! score the site.
//!
//! The five sites run a federation in the simulator (`fedge-sim`: the coordinator's round
//! machine, the devices' agent machines training with `fedge_device::run_round`, the
//! algorithm's settings as `fedge eval` gives them). When round `rounds` is released, the
//! deployed site scores its stream with that head, standardised with the statistics a device
//! serving that release would use (`feature_norm`'s estimator with the release's pooled
//! summary), and one of three arms happens:
//!
//! - none: the site labels nothing and stays out; the federation goes on;
//! - random: `budget` images of the stream drawn uniformly (seeded);
//! - queue: the stream offered, in order, to a [`Selector`] of `budget` places with the
//!   device's default random share, each image with the margin uncertainty of its
//!   probabilities and a draw from the same seeded generator; what it holds is labelled.
//!
//! A labelling arm's images get their true labels, are split 90/10 into training and
//! validation rows as a device splits its folder (`[data] val_fraction`), and the site connects
//! as a sixth training device. The federation goes on until `after` rounds have aggregated the
//! site's update (it joins at the first round that opens once it is online); the `none` arm
//! runs to the same round. The site is then scored on its held-out images with the final
//! release. Every arm of a seed replays the same first `rounds` rounds bit for bit (checked:
//! the release the site scores its stream with is the same in each), so the three differ only
//! by the labels. Differences are paired by seed, with a 95 % Student-t interval.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use fedge_coordinator::RoundConfig;
use fedge_coordinator::boot::Plan;
use fedge_device::labelling::{DEFAULT_RANDOM_SHARE, Selector};
use fedge_device::site_norm::{FeatureNorm, FeatureSummary, SiteNorm, standardised};
use fedge_device::train::DeviceData;
use fedge_device::{FeatureSet, accuracy};
use fedge_edge::data::load_digits;
use fedge_models::{Backbone, HeadConfig, ModelLayout};
use fedge_sim::{CoordinatorSpec, DeviceSpec, Observed, Sim};

use crate::eval::{Algorithm, VAL_FRACTION, interval, split_features};

mod site;

pub use site::SITE;
use site::{SeedData, seed_data, serve_choice, served, serving_stats};

/// The benchmark's settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LabellingOptions {
    /// Seeds: the deal of the digits, the head, the trainers and the draws.
    pub seeds: Vec<u64>,
    /// Labels the site can afford (the queue's places).
    pub budget: usize,
    /// Requests the deployed site serves before it labels (the rest of its images are scored).
    pub stream: usize,
    /// Rounds of the five sites before the site labels.
    pub rounds: u64,
    /// Rounds with the site's update after it joined.
    pub after: u64,
    /// Local epochs per round.
    pub local_epochs: u32,
    /// The head's projector width.
    pub hidden: usize,
}

impl Default for LabellingOptions {
    /// `fedge bench labelling`'s defaults: seeds 0–4, 50 labels, 600 requests, 20 rounds
    /// before and 10 with the site, 5 local epochs, a 64-wide head.
    fn default() -> Self {
        Self {
            seeds: (0..5).collect(),
            budget: 50,
            stream: 600,
            rounds: 20,
            after: 10,
            local_epochs: 5,
            hidden: 64,
        }
    }
}

/// One labelling arm of one seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Labelled {
    /// The site's accuracy on its held-out images after the rounds (in [0, 1]).
    pub accuracy: f32,
    /// Rows the site added (training and validation).
    pub rows: usize,
    /// Mean margin uncertainty of the picked images under the release they were picked with.
    pub mean_uncertainty: f32,
    /// Picked images that release got wrong.
    pub wrong: usize,
    /// Classes among the picked images.
    pub classes: usize,
    /// Rounds that aggregated the site's update.
    pub rounds_with_site: u64,
    /// Of those, rounds whose norm guard scaled the site's update down (`max_norm_ratio`).
    pub norm_scaled: u64,
    /// The site's accuracy with what the device's per-site choice serves it
    /// (`fedge_device::site_choice`): the final release, its label-free adaptation or its
    /// correction from the site's labels, whichever is better beyond noise on them.
    pub served: f32,
    /// What serves: the release, `prior-em` or the correction.
    pub variant: fedge_wire::SiteVariant,
}

/// One seed's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// Requests served, images scored.
    pub stream: usize,
    /// Held-out images the site is scored on.
    pub test: usize,
    /// The site's accuracy with the release it labelled from (round `rounds`).
    pub before: f32,
    /// After the same rounds as the labelling arms, without labels.
    pub none: f32,
    /// The same, with label-free adaptation to the site (`balanced`'s statistics estimated
    /// from the unlabelled stream against the final release's pooled summary).
    pub label_free: f32,
    /// The last round of every arm.
    pub final_round: u64,
    /// `budget` images at random.
    pub random: Labelled,
    /// The queue's `budget` images.
    pub queue: Labelled,
}

/// A paired difference over seeds, in points.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Difference {
    /// Mean over seeds.
    pub mean: f64,
    /// The 95 % Student-t interval.
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// Seeds above zero.
    pub wins: usize,
    /// Seeds.
    pub seeds: usize,
}

impl Difference {
    /// The paired difference `f(seed)` (in [0, 1]) in points; `None` without seeds.
    fn of(seeds: &[SeedResult], f: impl Fn(&SeedResult) -> f32) -> Option<Self> {
        let diffs: Vec<f64> = seeds.iter().map(|s| f64::from(f(s)) * 100.0).collect();
        let (mean, half) = interval(&diffs)?;
        Some(Self {
            mean,
            low: mean - half,
            high: mean + half,
            wins: diffs.iter().filter(|d| **d > 0.0).count(),
            seeds: diffs.len(),
        })
    }
}

/// The benchmark's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LabellingReport {
    /// The settings.
    pub options: LabellingOptions,
    /// The algorithm's name.
    pub algorithm: String,
    /// Per seed.
    pub seeds: Vec<SeedResult>,
    /// Queue − random.
    pub queue_vs_random: Option<Difference>,
    /// Random − none.
    pub random_vs_none: Option<Difference>,
    /// Queue − none.
    pub queue_vs_none: Option<Difference>,
    /// What the per-site choice serves after the queue's labels − none.
    pub served_vs_none: Option<Difference>,
    /// What the per-site choice serves after the queue's labels − the queue's labels in the
    /// federation only.
    pub served_vs_queue: Option<Difference>,
    /// What the per-site choice serves after the queue's labels − label-free adaptation
    /// without labels.
    pub served_vs_label_free: Option<Difference>,
    /// What the per-site choice serves: after the queue's labels − after random ones.
    pub served_queue_vs_random: Option<Difference>,
}

/// A round aggregated, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    /// The seed.
    pub seed: u64,
    /// `none`, `random` or `queue`.
    pub arm: &'static str,
    /// The round.
    pub round: u64,
}

/// Which labels the site gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    None,
    Random,
    Queue,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::None => "none",
            Arm::Random => "random",
            Arm::Queue => "queue",
        }
    }
}

/// The stream's images `arm` labels, given each one's uncertainty.
fn pick(arm: Arm, scores: &[(f32, bool)], budget: usize, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1abe_1000);
    match arm {
        Arm::None => Vec::new(),
        Arm::Random => {
            let n = budget.min(scores.len());
            let mut picked = rand::seq::index::sample(&mut rng, scores.len(), n).into_vec();
            picked.sort_unstable();
            picked
        }
        Arm::Queue => {
            let mut selector = Selector::new(budget, DEFAULT_RANDOM_SHARE);
            for (id, (u, _)) in scores.iter().enumerate() {
                selector.offer(id as u64, *u, rng.random());
            }
            let mut picked: Vec<usize> = selector.held().iter().map(|h| h.id as usize).collect();
            picked.sort_unstable();
            picked
        }
    }
}

/// What one arm's run gives.
struct ArmRun {
    before: f32,
    /// The release the site scored its stream with.
    deployed_params: Vec<f32>,
    after: f32,
    /// `after`, with the site's statistics adapted to its unlabelled stream (`balanced`).
    label_free: f32,
    final_round: u64,
    picked: Option<Labelled>,
}

/// One arm of one seed: the federation, the site labelling at round `rounds` (or not), the
/// rounds after; `stop` is the `none` arm's last round.
fn run_arm(
    data: &SeedData,
    algorithm: &Algorithm,
    options: &LabellingOptions,
    (seed, arm, stop): (u64, Arm, u64),
    progress: &mut dyn FnMut(Tick),
) -> anyhow::Result<ArmRun> {
    let classes = data.classes;
    let head = HeadConfig::new(data.stream.dim, classes).with_hidden(options.hidden);
    let norm = algorithm.base.feature_norm;
    let federation = format!("labelling-{seed}");
    let sites = data.sites.len();
    let config = RoundConfig {
        federation: federation.clone(),
        classes: fedge_sim::class_names(classes),
        head: Some(head.clone()),
        // Room for the round the site waits for; the run stops before the last.
        rounds: options.rounds + options.after + 4,
        fraction: 1.0,
        min_clients: sites,
        min_updates: sites,
        round_timeout_ms: u64::MAX / 4,
        train: algorithm.train_params(options.local_epochs),
        seed,
        ..RoundConfig::default()
    }
    .with_objective(algorithm.objective, &head, 0.5);
    let layout = ModelLayout::new(head.clone(), algorithm.objective.carries_generator());
    let plan = Plan {
        round: config,
        strategy: algorithm.strategy.clone(),
        noise_seed: None,
        initial: layout.init_flat(seed),
    };
    let mut sim = Sim::new(seed);
    let global = sim.add_coordinator(CoordinatorSpec {
        plan,
        upstream: None,
    })?;
    let device = |name: &str, data: DeviceData| {
        let mut spec = DeviceSpec::new(name, &federation, head.clone(), data);
        spec.seed = seed;
        spec.privacy = algorithm.local_privacy_for(seed, name);
        spec
    };
    for (name, rows) in &data.sites {
        sim.add_device(device(name, rows.clone()))?;
    }
    let empty = FeatureSet {
        dim: data.stream.dim,
        features: Vec::new(),
        labels: Vec::new(),
    };
    let mut labelled = empty.clone();
    // Every row the site labelled (training and validation), and its held-back share: what
    // the device's per-site choice reads and judges on.
    let mut answered = empty.clone();
    let mut held_back = empty.clone();
    let mut deployed: Option<(f32, Vec<f32>, Option<Labelled>)> = None;
    let mut with_site = 0u64;
    let mut norm_scaled = 0u64;
    let score = |params: &[f32], pooled: Option<&FeatureSummary>, train: &FeatureSet| {
        let stats = serving_stats(norm, pooled, train, &data.stream, &head, params);
        accuracy(&head, params, &standardised(stats.as_ref(), &data.test))
    };
    loop {
        let moved = sim.run_until(u64::MAX / 2, |s| s.has_observed() || s.finished(global));
        for observed in sim.take_observed() {
            let (report, params) = match observed {
                Observed::RoundEnded {
                    coordinator,
                    report,
                    params,
                } if coordinator == global && report.aggregated => (report, params),
                Observed::Refused { reason, .. } => anyhow::bail!("{reason}"),
                _ => continue,
            };
            let params = layout.head_part(&params).to_vec();
            let pooled = (sim.coordinator(global)).and_then(|r| r.pooled()).cloned();
            progress(Tick {
                seed,
                arm: arm.name(),
                round: report.round,
            });
            if report.reported.iter().any(|c| c == SITE) {
                with_site += 1;
            }
            norm_scaled += report
                .norm_clipped
                .iter()
                .filter(|c| c.client == SITE)
                .count() as u64;
            if report.round == options.rounds {
                let before = score(&params, pooled.as_ref(), &empty)?;
                let stats =
                    serving_stats(norm, pooled.as_ref(), &empty, &data.stream, &head, &params);
                let seen = standardised(stats.as_ref(), &data.stream);
                let scores = served(&head, &params, &seen)?;
                let chosen = pick(arm, &scores, options.budget, seed);
                let mut summary = None;
                if !chosen.is_empty() {
                    // The true labels, split as the device splits its folder.
                    let picked = data.stream.rows(&chosen);
                    let (train, val) = split_features(&picked, VAL_FRACTION, seed ^ 0x5173);
                    let mut seen_classes = picked.labels.clone();
                    seen_classes.sort_unstable();
                    seen_classes.dedup();
                    summary = Some(Labelled {
                        accuracy: f32::NAN,
                        rows: train.len() + val.len(),
                        mean_uncertainty: chosen.iter().map(|&i| scores[i].0).sum::<f32>()
                            / chosen.len() as f32,
                        wrong: chosen.iter().filter(|&&i| !scores[i].1).count(),
                        classes: seen_classes.len(),
                        rounds_with_site: 0,
                        norm_scaled: 0,
                        served: f32::NAN,
                        variant: fedge_wire::SiteVariant::Release,
                    });
                    labelled = train.clone();
                    held_back = val.clone();
                    answered = picked;
                    let rows = DeviceData::new(Arc::new(train), Arc::new(val), None);
                    sim.add_device(device(SITE, rows))?;
                }
                deployed = Some((before, params.clone(), summary));
            }
            let done = match arm {
                Arm::None => report.round >= stop,
                _ => with_site >= options.after,
            };
            if let Some((before, deployed_params, picked)) = deployed.take_if(|_| done) {
                let after = score(&params, pooled.as_ref(), &labelled)?;
                // What the device serves of the final release: its per-site choice, from the
                // rows it labelled (none in the `none` arm: the release as it is).
                let release = (sim.coordinator(global))
                    .and_then(|r| r.releases().serving().cloned())
                    .filter(|r| r.round == report.round)
                    .ok_or_else(|| anyhow::anyhow!("round {} was not released", report.round))?;
                let rows = (&labelled, &answered, &held_back);
                let (served, variant) = serve_choice(data, &release, rows, seed)?;
                let adapted = SiteNorm {
                    norm: FeatureNorm::Balanced,
                    pooled: pooled.as_ref(),
                };
                let stats = adapted.unlabelled(&data.stream, &head, &params);
                let label_free =
                    accuracy(&head, &params, &standardised(stats.as_ref(), &data.test))?;
                return Ok(ArmRun {
                    before,
                    deployed_params,
                    after,
                    label_free,
                    final_round: report.round,
                    picked: picked.map(|p| Labelled {
                        accuracy: after,
                        rounds_with_site: with_site,
                        norm_scaled,
                        served,
                        variant,
                        ..p
                    }),
                });
            }
        }
        anyhow::ensure!(
            moved && !sim.finished(global),
            "the simulated federation stopped before the site's last round ({} arm, seed {seed})",
            arm.name()
        );
    }
}

/// Runs the benchmark with `backbone` (the built-in `digits-conv` in `fedge bench labelling`)
/// and `algorithm` (`fedavg` by default); `progress` hears every aggregated round.
pub fn run(
    backbone: &Backbone,
    algorithm: &Algorithm,
    options: &LabellingOptions,
    mut progress: impl FnMut(Tick),
) -> anyhow::Result<LabellingReport> {
    anyhow::ensure!(options.budget >= 1, "a budget of at least one label");
    anyhow::ensure!(
        options.rounds >= 1,
        "at least one round before the site labels"
    );
    anyhow::ensure!(
        options.after >= 1,
        "at least one round after the site labels"
    );
    anyhow::ensure!(
        options.budget <= options.stream,
        "a budget of {} labels from a stream of {} requests",
        options.budget,
        options.stream
    );
    let all = load_digits();
    let mut seeds = Vec::new();
    for &seed in &options.seeds {
        let data = seed_data(backbone, &all, seed, options.stream)?;
        let mut arm =
            |arm, stop| run_arm(&data, algorithm, options, (seed, arm, stop), &mut progress);
        let queue = arm(Arm::Queue, 0)?;
        let random = arm(Arm::Random, 0)?;
        anyhow::ensure!(
            queue.final_round == random.final_round,
            "seed {seed}: the site's rounds ended at {} with the queue and {} at random",
            queue.final_round,
            random.final_round
        );
        let none = arm(Arm::None, queue.final_round)?;
        for other in [&random, &none] {
            anyhow::ensure!(
                other.deployed_params == queue.deployed_params && other.before == queue.before,
                "seed {seed}: the arms' first {} rounds differ; the simulation is not \
                 reproducible",
                options.rounds
            );
        }
        let labelled = |run: ArmRun| run.picked.ok_or_else(|| anyhow::anyhow!("no labels"));
        seeds.push(SeedResult {
            seed,
            stream: data.stream.len(),
            test: data.test.len(),
            before: queue.before,
            none: none.after,
            label_free: none.label_free,
            final_round: queue.final_round,
            random: labelled(random)?,
            queue: labelled(queue)?,
        });
    }
    Ok(LabellingReport {
        options: options.clone(),
        algorithm: algorithm.name.clone(),
        queue_vs_random: Difference::of(&seeds, |s| s.queue.accuracy - s.random.accuracy),
        random_vs_none: Difference::of(&seeds, |s| s.random.accuracy - s.none),
        queue_vs_none: Difference::of(&seeds, |s| s.queue.accuracy - s.none),
        served_vs_none: Difference::of(&seeds, |s| s.queue.served - s.none),
        served_vs_queue: Difference::of(&seeds, |s| s.queue.served - s.queue.accuracy),
        served_queue_vs_random: Difference::of(&seeds, |s| s.queue.served - s.random.served),
        served_vs_label_free: Difference::of(&seeds, |s| s.queue.served - s.label_free),
        seeds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short federation: the queue's picks are more uncertain than the random ones (it does
    /// not pick at random), both arms add `budget` labelled rows, and the site trained with them.
    #[test]
    fn the_queue_picks_uncertain_images_and_both_arms_add_the_budget() {
        let (backbone, _) = crate::eval::load_backbone(None).unwrap();
        let algorithm = crate::eval::parse_algorithm("fedavg").unwrap();
        let options = LabellingOptions {
            seeds: vec![3],
            budget: 50,
            stream: 400,
            rounds: 3,
            after: 1,
            local_epochs: 5,
            hidden: 64,
        };
        let mut ticks = 0;
        let report = run(&backbone, &algorithm, &options, |_| ticks += 1).unwrap();
        let seed = &report.seeds[0];
        assert_eq!((seed.random.rows, seed.queue.rows), (50, 50), "{seed:?}");
        assert!(
            seed.queue.mean_uncertainty > seed.random.mean_uncertainty + 0.05,
            "{seed:?}"
        );
        assert!(seed.queue.wrong >= seed.random.wrong, "{seed:?}");
        assert_eq!(
            (seed.queue.rounds_with_site, seed.random.rounds_with_site),
            (1, 1)
        );
        assert!(seed.final_round > options.rounds);
        assert_eq!(ticks as u64, 3 * seed.final_round);
        assert!(report.queue_vs_random.is_some());
        // What the site is served: the release (as the device standardises it, with the pool
        // its head trained with: within a few images of `accuracy`, scored with the pool folded
        // after the round), its label-free adaptation or its correction from the labels.
        for arm in [&seed.queue, &seed.random] {
            assert!((0.0..=1.0).contains(&arm.served), "{seed:?}");
            if arm.variant == fedge_wire::SiteVariant::Release {
                assert!((arm.served - arm.accuracy).abs() < 0.03, "{seed:?}");
            }
        }
        assert!(report.served_vs_none.is_some() && report.served_vs_queue.is_some());
    }

    #[test]
    fn the_queue_keeps_its_share_of_random_places_and_the_random_arm_its_budget() {
        // Uncertainties 0, 1/500, … in a shuffled order: image `i` has rank `order[i]`.
        let mut order: Vec<usize> = (0..500).collect();
        rand::seq::SliceRandom::shuffle(&mut order[..], &mut StdRng::seed_from_u64(4));
        let scores: Vec<(f32, bool)> = order.iter().map(|&r| (r as f32 / 500.0, true)).collect();
        let queue = pick(Arm::Queue, &scores, 50, 1);
        assert_eq!(queue.len(), 50);
        // The 40 most uncertain, and 10 from the rest.
        assert_eq!(queue.iter().filter(|&&i| order[i] >= 460).count(), 40);
        let random = pick(Arm::Random, &scores, 50, 1);
        assert_eq!(random.len(), 50);
        assert!(random.windows(2).all(|w| w[0] < w[1]));
        assert!(pick(Arm::None, &scores, 50, 1).is_empty());
    }
}
