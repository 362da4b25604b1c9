//! `fedge bench drift`: the drift alarm (`fedge_device::drift`) on `digits-sensor`, measured as
//! a deployed site would live it.
//!
//! The digits are dealt into six parts. Five are the federation's sites, each seen through its
//! own sensor (`digits-sensor`); their features' class summary is the pooled one a release
//! carries. The sixth is the deployed site, seen through the clean sensor: half of its images
//! are the reference the site starts from, the other half is what it serves. Each request is
//! one image drawn at random (with replacement) from what it serves; its score is the
//! familiarity distance (`fedge_wire::Familiarity`), computed once per image since the backbone
//! is deterministic. Two measurements per seed:
//!
//! - false alarms: `requests` requests of the unchanged site, counted per 100,000;
//! - detection delay: `trials` times, a stretch of unchanged requests (0 to 2,000 of them, at
//!   random), then the site's sensor switches to another one of `digits-sensor` (the same
//!   images through it), and the requests until the alarm are counted (up to 10,000: missed).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fedge_device::drift::DriftDetector;
use fedge_edge::data::{ImageSet, load_digits};
use fedge_models::Backbone;

use crate::datasets::{SENSORS, Sensor};

/// Longest wait for an alarm after a switch before it counts as missed.
pub const MAX_DELAY: u64 = 10_000;

/// The benchmark's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftOptions {
    /// Requests of the unchanged site per seed, for false alarms.
    pub requests: u64,
    /// Sensor switches per seed and sensor, for the delay.
    pub trials: usize,
    /// Seeds (the deal of the digits into sites and the request draws).
    pub seeds: Vec<u64>,
}

/// False alarms on a stable stream, for one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Quiet {
    /// The seed.
    pub seed: u64,
    /// Requests served.
    pub requests: u64,
    /// Alarms raised.
    pub alarms: u64,
}

/// Detection after a switch to one sensor, over every seed's trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Caught {
    /// The sensor switched to.
    pub sensor: &'static str,
    /// Requests from the switch to the alarm, sorted, one per caught trial.
    pub delays: Vec<u64>,
    /// Trials whose alarm did not come within [`MAX_DELAY`].
    pub missed: usize,
    /// Alarms before the switch (false ones), over all trials.
    pub early: u64,
}

impl Caught {
    /// The `q`-quantile of the delays (nearest rank), if any was caught.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.delays.len();
        (n > 0).then(|| self.delays[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
    }
}

/// The familiarity distances a site's requests measure, over every seed: `(what, values)`
/// for the reference, what it serves through each sensor, and blank black and white frames.
pub type Distances = Vec<(String, Vec<f32>)>;

/// The benchmark's results.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftReport {
    /// The distances the detector watches, sorted within each row.
    pub distances: Distances,
    /// False alarms per seed.
    pub quiet: Vec<Quiet>,
    /// Detection per sensor switched to.
    pub caught: Vec<Caught>,
}

/// One seed's site: the familiarity distance of each image the site serves, clean and through
/// every other sensor, and of its reference images.
struct Site {
    reference: Vec<f32>,
    /// A blank black and a blank white frame.
    blank: [f32; 2],
    /// `served[s][i]`: image `i` of the served half through sensor `s` of [`SENSORS`].
    served: Vec<Vec<f32>>,
}

fn site(backbone: &Backbone, all: &ImageSet, seed: u64) -> anyhow::Result<Site> {
    let mut parts = all.partition(SENSORS.len(), seed);
    let deployed = parts.pop().expect("six parts");
    let f = backbone.card().feature_size;
    let classes = all.class_names.len();
    let features = |set: &ImageSet| -> anyhow::Result<Vec<f32>> {
        let shape = (set.channels, set.height, set.width);
        Ok(backbone.features_of(&set.images, shape, set.raw_max, 64)?)
    };
    // The federation: five sites, each through its own sensor.
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
        rows.extend(features(&sensor.apply(part, seed ^ (i as u64 + 1)))?);
        labels.extend_from_slice(&part.labels);
    }
    let pooled = fedge_wire::FeatureSummary::of_rows(f, classes, rows.chunks_exact(f), &labels)
        .ok_or_else(|| anyhow::anyhow!("no pooled summary"))?;
    let familiarity = pooled
        .familiarity()
        .ok_or_else(|| anyhow::anyhow!("no class with rows"))?;
    let distances = |set: &ImageSet| -> anyhow::Result<Vec<f32>> {
        Ok(features(set)?
            .chunks_exact(f)
            .map(|x| familiarity.distance(x).unwrap_or(f32::NAN))
            .collect())
    };
    let (reference, served) = deployed.split(0.5, seed);
    let view = |sensor: &Sensor, set: &ImageSet| sensor.apply(set, seed ^ 0xd21f);
    let mut blank = reference.subset(&[0, 0]);
    let len = blank.image_len();
    blank.images[len..].fill(blank.raw_max);
    blank.images[..len].fill(0.0);
    let blank = distances(&blank)?;
    Ok(Site {
        blank: [blank[0], blank[1]],
        reference: distances(&view(&SENSORS[0], &reference))?,
        served: (SENSORS.iter())
            .map(|s| distances(&view(s, &served)))
            .collect::<anyhow::Result<_>>()?,
    })
}

/// Runs the benchmark with `backbone` (the built-in `digits-conv` in `fedge bench drift`).
pub fn run(backbone: &Backbone, options: &DriftOptions) -> anyhow::Result<DriftReport> {
    let all = load_digits();
    let mut quiet = Vec::new();
    let mut caught: Vec<Caught> = (SENSORS[1..].iter())
        .map(|s| Caught {
            sensor: s.name,
            delays: Vec::new(),
            missed: 0,
            early: 0,
        })
        .collect();
    let mut distances: Distances = std::iter::once("reference (clean)".to_owned())
        .chain(SENSORS.iter().map(|s| format!("served, {}", s.name)))
        .chain([
            "blank black frame".to_owned(),
            "blank white frame".to_owned(),
        ])
        .map(|name| (name, Vec::new()))
        .collect();
    for &seed in &options.seeds {
        let site = site(backbone, &all, seed)?;
        let rows = std::iter::once(&site.reference).chain(&site.served);
        for ((_, values), seen) in distances.iter_mut().zip(rows) {
            values.extend_from_slice(seen);
        }
        let n = distances.len();
        distances[n - 2].1.push(site.blank[0]);
        distances[n - 1].1.push(site.blank[1]);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        let clean = &site.served[0];
        let mut detector = DriftDetector::new(site.reference.iter().copied())
            .ok_or_else(|| anyhow::anyhow!("too few reference images"))?;
        let draw = |rng: &mut StdRng, values: &[f32]| values[rng.random_range(0..values.len())];
        let alarms = (0..options.requests)
            .filter(|_| detector.observe(draw(&mut rng, clean)).alarm)
            .count() as u64;
        quiet.push(Quiet {
            seed,
            requests: options.requests,
            alarms,
        });
        for (to, result) in site.served[1..].iter().zip(caught.iter_mut()) {
            for _ in 0..options.trials {
                detector.reset();
                for _ in 0..rng.random_range(0..=2_000) {
                    if detector.observe(draw(&mut rng, clean)).alarm {
                        result.early += 1;
                    }
                }
                match (1..=MAX_DELAY).find(|_| detector.observe(draw(&mut rng, to)).alarm) {
                    Some(delay) => result.delays.push(delay),
                    None => result.missed += 1,
                }
            }
        }
    }
    for result in &mut caught {
        result.delays.sort_unstable();
    }
    for (_, values) in &mut distances {
        values.sort_by(f32::total_cmp);
    }
    Ok(DriftReport {
        distances,
        quiet,
        caught,
    })
}

/// Accuracy of a deployed site's stream through the blurred sensor, for one seed, under three
/// sets of statistics (all in [0, 1]).
#[derive(Debug, Clone, PartialEq)]
pub struct Adapted {
    /// The seed.
    pub seed: u64,
    /// The site before the switch: its clean stream with the statistics it had.
    pub clean: f32,
    /// After the switch, still with the statistics estimated on its clean images.
    pub stale: f32,
    /// After the switch, with the federation's pooled statistics.
    pub pooled: f32,
    /// After re-adapting on the first `window` requests after the switch (the rest scored).
    pub adapted: f32,
}

/// Re-adaptation on `digits-sensor`: a head trained on the five federation sites' features
/// (one central training on their pooled statistics, standing in for the federation's rounds),
/// a clean deployed site whose statistics come from its own images (`balanced`, labelled by the
/// head), then its sensor switches to `blurred`: the stream is scored with the stale
/// statistics, with the pooled ones, and with statistics re-estimated from the first `window`
/// requests after the switch (unlabelled, `balanced`), as the device does on an alarm.
pub fn adaptation(
    backbone: &Backbone,
    seeds: &[u64],
    window: usize,
) -> anyhow::Result<Vec<Adapted>> {
    use fedge_device::site_norm::{SiteNorm, standardise};
    use fedge_device::{FeatureSet, TrainJob, train_head};
    use fedge_models::{HeadConfig, head::predict_flat, training_device};
    use fedge_wire::{FeatureNorm, TrainParams};

    let all = load_digits();
    let f = backbone.card().feature_size;
    let classes = all.class_names.len();
    let features = |set: &ImageSet| -> anyhow::Result<FeatureSet> {
        let shape = (set.channels, set.height, set.width);
        Ok(FeatureSet {
            dim: f,
            features: backbone.features_of(&set.images, shape, set.raw_max, 64)?,
            labels: set.labels.clone(),
        })
    };
    let blurred = SENSORS
        .iter()
        .find(|s| s.name == "blurred")
        .expect("a blurred sensor");
    let mut out = Vec::new();
    for &seed in seeds {
        let mut parts = all.partition(SENSORS.len(), seed);
        let deployed = parts.pop().expect("six parts");
        let mut federation = FeatureSet {
            dim: f,
            features: Vec::new(),
            labels: Vec::new(),
        };
        for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
            let seen = features(&sensor.apply(part, seed ^ (i as u64 + 1)))?;
            federation.features.extend(seen.features);
            federation.labels.extend(seen.labels);
        }
        let pooled = fedge_device::site_norm::summary_of(&federation, classes)
            .ok_or_else(|| anyhow::anyhow!("no pooled summary"))?;
        let pooled_stats = pooled
            .balanced_stats()
            .ok_or_else(|| anyhow::anyhow!("no pooled statistics"))?;
        let head = HeadConfig::new(f, classes).with_hidden(64);
        let init = head.init_flat(seed);
        let params = TrainParams {
            local_epochs: 30,
            feature_norm: FeatureNorm::Pooled,
            ..TrainParams::default()
        };
        let device = training_device(fedge_models::Backend::default());
        let job = TrainJob {
            stats: Some(&pooled_stats),
            seed,
            ..TrainJob::new(&head, &init, &federation, &params, &device)
        };
        let trained = train_head(&job)?.params;
        let norm = SiteNorm {
            norm: FeatureNorm::Balanced,
            pooled: Some(&pooled),
        };
        let accuracy =
            |stats: &fedge_wire::FeatureStats, set: &FeatureSet| -> anyhow::Result<f32> {
                let predicted = predict_flat(&head, &trained, &standardise(stats, set).features)?;
                let right = (predicted.iter().zip(&set.labels))
                    .filter(|(p, y)| **p == **y as usize)
                    .count();
                Ok(right as f32 / set.labels.len().max(1) as f32)
            };
        let (reference, served) = deployed.split(0.5, seed);
        let view = |sensor: &Sensor, set: &ImageSet| sensor.apply(set, seed ^ 0xd21f);
        let own = features(&view(&SENSORS[0], &reference))?;
        let clean_stream = features(&view(&SENSORS[0], &served))?;
        let blurred_stream = features(&view(blurred, &served))?;
        let unlabelled = |set: &FeatureSet| norm.unlabelled(set, &head, &trained);
        let site = unlabelled(&own).ok_or_else(|| anyhow::anyhow!("no site statistics"))?;
        // The first `window` requests after the switch re-estimate; the rest are scored.
        let window = window.min(blurred_stream.labels.len() / 2);
        let first = FeatureSet {
            dim: f,
            features: blurred_stream.features[..window * f].to_vec(),
            labels: vec![0; window],
        };
        let rest = FeatureSet {
            dim: f,
            features: blurred_stream.features[window * f..].to_vec(),
            labels: blurred_stream.labels[window..].to_vec(),
        };
        let adapted = unlabelled(&first).ok_or_else(|| anyhow::anyhow!("no new statistics"))?;
        out.push(Adapted {
            seed,
            clean: accuracy(&site, &clean_stream)?,
            stale: accuracy(&site, &rest)?,
            pooled: accuracy(&pooled_stats, &rest)?,
            adapted: accuracy(&adapted, &rest)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blurred_sensor_is_caught_soon_and_an_unchanged_site_stays_quiet() {
        let (backbone, _) = crate::eval::load_backbone(None).unwrap();
        let options = DriftOptions {
            requests: 100_000,
            trials: 20,
            seeds: vec![1],
        };
        let report = run(&backbone, &options).unwrap();
        assert!(report.quiet[0].alarms <= 2, "{:?}", report.quiet);
        let blurred = report
            .caught
            .iter()
            .find(|c| c.sensor == "blurred")
            .unwrap();
        assert_eq!((blurred.missed, blurred.delays.len()), (0, 20));
        assert!(blurred.quantile(1.0).unwrap() <= 300, "{blurred:?}");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let caught = Caught {
            sensor: "blurred",
            delays: vec![1, 2, 3, 4, 100],
            missed: 0,
            early: 0,
        };
        assert_eq!(caught.quantile(0.5), Some(3));
        assert_eq!(caught.quantile(0.95), Some(100));
        assert_eq!(caught.quantile(0.0), Some(1));
    }
}
