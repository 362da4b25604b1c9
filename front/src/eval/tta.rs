//! Test-time adaptations of the held-out site's classifier, from its unlabelled calibration
//! rows (the device's per-site choice, `choose`, is in `super::choice`): `prior-em`, fedge's label-shift-aware estimator (`fedge_device::site_norm::label_shift`,
//! docs/algorithms.md §7), and a baseline from the field, T3A (Iwasawa &
//! Matsuo, "Test-Time Classifier Adjustment Module for Model-Agnostic Domain Generalization",
//! NeurIPS 2021), which replaces the head's last linear layer with class prototypes built from
//! the site's own unlabelled rows.
//!
//! Each class starts with its classifier weight vector as its one support. Every unlabelled
//! row of the site's calibration split is passed through the head's projector,
//! `z = ReLU(W1ᵀx + b1)`, labelled with the head's prediction `ŷ` and added, normalised, to
//! `ŷ`'s supports with the entropy of its prediction; each class keeps its [`T3A_FILTER`]
//! supports of lowest entropy. A scored row is then classified by `argmax_k z · ĉ_k`, with
//! `ĉ_k` the normalised sum of class `k`'s supports. The paper adjusts the prototypes online
//! as test rows arrive; here the supports come from the calibration rows only and the scored
//! rows are classified with them, as a site that calibrated on some images and then serves
//! others would. It uses unlabelled target data, like site normalisation.

use std::sync::atomic::{AtomicU64, Ordering};

use fedge_device::FeatureSet;
use fedge_device::site_norm::{FeatureNorm, FeatureSummary, Outcome, prior_shift};
use fedge_models::HeadConfig;
use fedge_models::head::{Forward, argmax};

use super::TargetSite;

/// Supports kept per class (the paper's `M`; it reports 1 to 100 and "all").
pub const T3A_FILTER: usize = 20;

/// A test-time adaptation of the held-out site's classifier (`/tta=NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tta {
    /// The head as trained.
    #[default]
    None,
    /// T3A's prototype classifier.
    T3a,
    /// The site's class prior and an affine map of its features, estimated together against
    /// the pooled class-conditional statistics, the head's output corrected by the prior
    /// ratio; `pooled` where the fit does not explain the calibration rows better.
    PriorEm,
    /// The device's per-site choice, the calibration rows unlabelled (`super::choice`).
    Choose,
    /// The device's per-site choice with the calibration rows' labels read.
    ChooseLabelled,
}

impl Tta {
    /// Every adaptation, in the order the error lists them.
    pub const ALL: [Tta; 5] = [
        Tta::None,
        Tta::T3a,
        Tta::PriorEm,
        Tta::Choose,
        Tta::ChooseLabelled,
    ];

    /// The spelling after `/tta=`.
    pub fn name(self) -> &'static str {
        match self {
            Tta::None => "none",
            Tta::T3a => "t3a",
            Tta::PriorEm => "prior-em",
            Tta::Choose => "choose",
            Tta::ChooseLabelled => "choose-labelled",
        }
    }
}

impl Tta {
    /// How often `prior-em` kept its fit in this process so far, and why not otherwise: kept,
    /// too few calibration rows, no better than `pooled` on rows the fit did not see, not
    /// finite (one count per scoring: every aggregated round of every run).
    pub fn prior_em_counts() -> [u64; 4] {
        PRIOR_EM_COUNTS.get()
    }
}

impl std::str::FromStr for Tta {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tta::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Tta::ALL.iter().map(|t| t.name()).collect();
            anyhow::anyhow!("tta: {s:?} is not one of {}", names.join(", "))
        })
    }
}

/// How often `prior-em` kept its fit, and why not otherwise, over a process's scorings (every
/// aggregated round of every run), for the summary `fedge eval` prints.
#[derive(Debug, Default)]
struct PriorEmCounts {
    accepted: AtomicU64,
    too_few_rows: AtomicU64,
    no_better: AtomicU64,
    not_finite: AtomicU64,
}

/// The process's [`PriorEmCounts`].
static PRIOR_EM_COUNTS: PriorEmCounts = PriorEmCounts {
    accepted: AtomicU64::new(0),
    too_few_rows: AtomicU64::new(0),
    no_better: AtomicU64::new(0),
    not_finite: AtomicU64::new(0),
};

impl PriorEmCounts {
    fn count(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Accepted { .. } => &self.accepted,
            Outcome::TooFewRows(_) => &self.too_few_rows,
            Outcome::NoBetter { .. } => &self.no_better,
            Outcome::NotFinite => &self.not_finite,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Kept, too few rows, no better than `pooled`, not finite.
    fn get(&self) -> [u64; 4] {
        [
            &self.accepted,
            &self.too_few_rows,
            &self.no_better,
            &self.not_finite,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

/// `prior-em`'s accuracy on `site`'s scored rows: the estimator fitted on its calibration rows
/// (their labels never read) against the round's `pooled` summary, for a head trained under
/// `pooled` statistics. `None` when there is no pool to fit against (a federation's first
/// rounds, or a pool that does not hold together): the site then serves as its
/// normalisation does without adaptation, which the caller scores.
pub fn prior_em_accuracy(
    head: &HeadConfig,
    params: &[f32],
    site: &TargetSite,
    pooled: Option<&FeatureSummary>,
    norm: FeatureNorm,
) -> anyhow::Result<Option<f32>> {
    anyhow::ensure!(
        norm == FeatureNorm::Pooled,
        "/tta=prior-em adapts a head trained under feature_norm = pooled (the default), not {}",
        norm.name()
    );
    let calibration = &site.calibration;
    let Some(pooled) = pooled else {
        return Ok(None);
    };
    let Some(fit) = prior_shift(pooled, &calibration.features, calibration.dim, head, params)
    else {
        return Ok(None);
    };
    PRIOR_EM_COUNTS.count(&fit.outcome);
    let scored = &site.scored;
    let predicted = (fit.predict(head, params, &scored.features, scored.dim))
        .ok_or_else(|| anyhow::anyhow!("the head's parameters do not fit its sizes"))?;
    if scored.is_empty() {
        return Ok(Some(0.0));
    }
    let right = (predicted.iter().zip(&scored.labels))
        .filter(|(p, y)| **p == **y as usize)
        .count();
    Ok(Some(right as f32 / scored.len() as f32))
}

/// The classifier's logits `z·W + b` of a projector output `z` (T3A's warm-up supports).
fn linear(w: &[f32], b: &[f32], z: &[f32], k: usize) -> Vec<f32> {
    let mut logits = b.to_vec();
    for (zj, row) in z.iter().zip(w.chunks_exact(k)) {
        for (l, wjk) in logits.iter_mut().zip(row) {
            *l += zj * wjk;
        }
    }
    logits
}

fn entropy(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter()
        .map(|e| e / sum)
        .filter(|p| *p > 0.0)
        .map(|p| -p * p.ln())
        .sum()
}

fn normalised(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter().map(|x| x / norm).collect()
}

/// T3A's accuracy on `scored` with prototypes from the unlabelled rows `support` (both as the
/// head takes them, standardised if the federation standardises).
pub fn t3a_accuracy(
    head: &HeadConfig,
    params: &[f32],
    support: &FeatureSet,
    scored: &FeatureSet,
) -> f32 {
    let (h, k) = (head.hidden, head.classes);
    let t = head.split(params).expect("the head's parameters");
    // Class k's warm-up support: its weight column, with the entropy the classifier gives it.
    let mut supports: Vec<Vec<(f32, Vec<f32>)>> = (0..k)
        .map(|c| {
            let column: Vec<f32> = (0..h).map(|j| t.w[j * k + c]).collect();
            let ent = entropy(&linear(t.w, t.b, &column, k));
            vec![(ent, normalised(&column))]
        })
        .collect();
    let mut pass = Forward::new(head);
    let mut forward = |x: &[f32]| {
        let logits = pass.logits(&t, x).to_vec();
        (pass.projected().collect::<Vec<f32>>(), logits)
    };
    for x in support.features.chunks_exact(support.dim.max(1)) {
        let (z, logits) = forward(x);
        supports[argmax(&logits)].push((entropy(&logits), normalised(&z)));
    }
    let prototypes: Vec<Vec<f32>> = (supports.iter_mut())
        .map(|s| {
            s.sort_by(|a, b| a.0.total_cmp(&b.0));
            s.truncate(T3A_FILTER);
            let mut sum = vec![0f32; h];
            for (_, z) in s.iter() {
                sum.iter_mut().zip(z).for_each(|(a, v)| *a += v);
            }
            normalised(&sum)
        })
        .collect();
    if scored.is_empty() {
        return 0.0;
    }
    let right = (scored.features.chunks_exact(scored.dim.max(1)))
        .zip(&scored.labels)
        .filter(|(x, y)| {
            let (z, _) = forward(x);
            let scores: Vec<f32> = (prototypes.iter())
                .map(|p| p.iter().zip(&z).map(|(a, b)| a * b).sum())
                .collect();
            argmax(&scores) == **y as usize
        })
        .count();
    right as f32 / scored.len() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prototypes_from_the_site_correct_a_head_whose_last_layer_is_off() {
        // Two features, the identity projector, and a last layer that calls everything class 0
        // unless feature 1 is very large; the site's rows are class 0 along feature 0 and class
        // 1 along feature 1.
        let head = HeadConfig::new(2, 2).with_hidden(2);
        let params = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.02, 0.0, 0.0];
        let rows = |n: usize| FeatureSet {
            dim: 2,
            features: (0..n)
                .flat_map(|i| if i % 2 == 0 { [1.0, 0.1] } else { [0.1, 3.0] })
                .collect(),
            labels: (0..n).map(|i| (i % 2) as u32).collect(),
        };
        let plain = fedge_device::accuracy(&head, &params, &rows(10)).unwrap();
        assert_eq!(plain, 0.5, "the head calls everything class 0");
        // The head labels the site's class-1 rows 0, so they join class 0's supports and pull
        // its prototype half-way to feature 1; class 1 keeps its warm-up support (its weight
        // column, along feature 1), which is now nearer to them.
        let adapted = t3a_accuracy(&head, &params, &rows(8), &rows(10));
        assert_eq!(adapted, 1.0);
        assert_eq!("t3a".parse::<Tta>().unwrap(), Tta::T3a);
        assert_eq!("prior-em".parse::<Tta>().unwrap(), Tta::PriorEm);
        for tta in Tta::ALL {
            assert_eq!(tta.name().parse::<Tta>().unwrap(), tta);
        }
        let unknown = "tent".parse::<Tta>().unwrap_err().to_string();
        assert!(unknown.contains("prior-em"), "{unknown}");
    }
}
