//! The canary's look at the head (`fedge_wire::head_check`), the third table of `fedge bench
//! drift`: does a canary stage of three devices roll back a candidate whose classes are
//! scrambled, and let an honest one through?
//!
//! Per seed: the digits dealt into six parts as in the drift table; a head trained centrally
//! on the five federation sites' features (pooled statistics) for a few epochs is the release
//! every device serves (`before`); the same head trained on for many more epochs is the honest
//! candidate (a larger step than one round's, so a harder case for the rule); that candidate
//! with its classifier's columns (and biases) rotated by one class is the scrambled one. The
//! three canaries are the deployed part's images through three sensors (clean, blurred, low
//! contrast): each request one of them, drawn at random, answered by both releases. After each
//! request to every canary, the stage fails when a strict majority of the canaries object; it
//! passes after `requests` requests each.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fedge_device::FeatureSet;
use fedge_edge::data::{ImageSet, load_digits};
use fedge_models::head::argmax;
use fedge_models::{Backbone, HeadConfig};
use fedge_wire::HeadCheck;

use crate::datasets::SENSORS;

/// Epochs of the release every device serves.
pub const BEFORE_EPOCHS: u32 = 3;
/// Epochs of the honest candidate (from scratch, the same seed).
pub const CANDIDATE_EPOCHS: u32 = 30;
/// The canaries' sensors.
pub const CANARY_SENSORS: [&str; 3] = ["clean", "blurred", "lowcontrast"];

/// One candidate's canary stages over every seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Stages {
    /// `honest` or `rotated`.
    pub candidate: &'static str,
    /// Stages run.
    pub trials: usize,
    /// Stages rolled back, with the requests each canary had answered then.
    pub rolled_back: Vec<u64>,
    /// The share of confident answers changed, per canary and stage, at its end.
    pub changed: Vec<f64>,
}

/// Runs `trials` stages per seed and candidate, each up to `requests` per canary.
pub fn run(
    backbone: &Backbone,
    seeds: &[u64],
    trials: usize,
    requests: u64,
) -> anyhow::Result<Vec<Stages>> {
    let all = load_digits();
    let mut out = vec![
        Stages {
            candidate: "honest",
            trials: 0,
            rolled_back: Vec::new(),
            changed: Vec::new(),
        },
        Stages {
            candidate: "rotated",
            trials: 0,
            rolled_back: Vec::new(),
            changed: Vec::new(),
        },
    ];
    for &seed in seeds {
        let deployment = Deployment::new(backbone, &all, seed)?;
        let rotated = rotate(&deployment.head, &deployment.candidate);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xca9a);
        for (stages, candidate) in out.iter_mut().zip([&deployment.candidate, &rotated]) {
            for _ in 0..trials {
                stages.trials += 1;
                let mut checks = vec![HeadCheck::new("candidate", "before"); 3];
                let mut failed = None;
                for n in 1..=requests {
                    for (check, canary) in checks.iter_mut().zip(&deployment.canaries) {
                        let i = rng.random_range(0..canary.len());
                        let x = &canary.features[i * canary.dim..(i + 1) * canary.dim];
                        let (before, p) = answer(&deployment.head, &deployment.before, x);
                        let (now, _) = answer(&deployment.head, candidate, x);
                        check.count(before, p, now);
                    }
                    if 2 * checks.iter().filter(|c| c.objects()).count() > checks.len() {
                        failed = Some(n);
                        break;
                    }
                }
                stages.rolled_back.extend(failed);
                stages
                    .changed
                    .extend(checks.iter().map(HeadCheck::changed_share));
            }
        }
    }
    for stages in &mut out {
        stages.rolled_back.sort_unstable();
        stages.changed.sort_by(f64::total_cmp);
    }
    Ok(out)
}

/// One seed's releases and canaries (features standardised with the pooled statistics).
struct Deployment {
    head: HeadConfig,
    before: Vec<f32>,
    candidate: Vec<f32>,
    canaries: Vec<FeatureSet>,
}

impl Deployment {
    fn new(backbone: &Backbone, all: &ImageSet, seed: u64) -> anyhow::Result<Self> {
        use fedge_device::site_norm::standardise;
        use fedge_device::{TrainJob, train_head};
        use fedge_models::training_device;
        use fedge_wire::{FeatureNorm, TrainParams};

        let f = backbone.card().feature_size;
        let classes = all.class_names.len();
        let super::site::Federation {
            rows: federation,
            stats,
            deployed,
            ..
        } = super::site::federation(backbone, all, seed)?;
        let head = HeadConfig::new(f, classes).with_hidden(64);
        let init = head.init_flat(seed);
        let device = training_device(fedge_models::Backend::default());
        let trained = |epochs: u32| -> anyhow::Result<Vec<f32>> {
            let params = TrainParams {
                local_epochs: epochs,
                feature_norm: FeatureNorm::Pooled,
                ..TrainParams::default()
            };
            let job = TrainJob {
                stats: Some(&stats),
                seed,
                ..TrainJob::new(&head, &init, &federation, &params, &device)
            };
            Ok(train_head(&job)?.params)
        };
        let canaries = (CANARY_SENSORS.iter())
            .map(|name| {
                let sensor = (SENSORS.iter())
                    .find(|s| s.name == *name)
                    .expect("a sensor of digits-sensor");
                let seen =
                    super::site::features_of(backbone, &sensor.apply(&deployed, seed ^ 0xd21f))?;
                Ok(standardise(&stats, &seen))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            before: trained(BEFORE_EPOCHS)?,
            candidate: trained(CANDIDATE_EPOCHS)?,
            head,
            canaries,
        })
    }
}

/// The class and its probability `params` answer for `x`.
fn answer(head: &HeadConfig, params: &[f32], x: &[f32]) -> (usize, f32) {
    let tensors = head.split(params).expect("a head of this layout");
    let logits = fedge_models::Forward::new(head)
        .logits(&tensors, x)
        .to_vec();
    let index = argmax(&logits);
    let max = logits[index];
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    (index, 1.0 / sum)
}

/// `params` with its classifier's columns and biases rotated by one class: what answered
/// class `k` now answers class `k + 1`.
pub fn rotate(head: &HeadConfig, params: &[f32]) -> Vec<f32> {
    let k = head.classes;
    let mut out = params.to_vec();
    let tensors = head.split(params).expect("a head of this layout");
    let (w, b) = (tensors.w, tensors.b);
    let w_at = params.len() - b.len() - w.len();
    for (row, rotated) in (w.chunks_exact(k)).zip(out[w_at..w_at + w.len()].chunks_exact_mut(k)) {
        for c in 0..k {
            rotated[(c + 1) % k] = row[c];
        }
    }
    let b_at = params.len() - k;
    for c in 0..k {
        out[b_at + (c + 1) % k] = b[c];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotated_head_answers_the_next_class() {
        let head = HeadConfig::new(4, 3).with_hidden(5);
        let params = head.init_flat(3);
        let rotated = rotate(&head, &params);
        for x in [[1.0, 0.0, 2.0, -1.0], [0.3, 0.1, -0.5, 2.0]] {
            let (was, p) = answer(&head, &params, &x);
            let (now, q) = answer(&head, &rotated, &x);
            assert_eq!(now, (was + 1) % 3);
            assert!((p - q).abs() < 1e-6);
        }
    }
}
