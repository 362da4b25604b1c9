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

/// The benchmark's results.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftReport {
    /// False alarms per seed.
    pub quiet: Vec<Quiet>,
    /// Detection per sensor switched to.
    pub caught: Vec<Caught>,
}

/// One seed's site: the familiarity distance of each image the site serves, clean and through
/// every other sensor, and of its reference images.
struct Site {
    reference: Vec<f32>,
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
    Ok(Site {
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
    for &seed in &options.seeds {
        let site = site(backbone, &all, seed)?;
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
    Ok(DriftReport { quiet, caught })
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
