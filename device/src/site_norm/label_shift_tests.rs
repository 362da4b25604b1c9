//! The label-shift-aware estimator on synthetic Gaussian classes, with the Bayes head of the
//! pool (a linear discriminant on the pooled-standardised features, so its posteriors are
//! calibrated for the pool): prior estimates, the affine map, and the sites it leaves alone.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::label_shift::{MIN_FIT_ROWS, Outcome, PriorShift, prior_shift};
use super::{FeatureSet, FeatureSummary, summary_of};
use crate::random::standard_normal;
use fedge_models::HeadConfig;

pub(crate) const F: usize = 4;
pub(crate) const K: usize = 3;
/// The pool's class means; every class has unit variance per feature.
const MEANS: [[f32; F]; K] = [
    [0.0, 0.0, 0.0, 0.0],
    [4.0, 0.0, 2.0, -1.0],
    [0.0, 4.0, -2.0, 1.0],
];

/// `counts[k]` rows of class `k`, each `scale ⊙ z + shift` with `z ~ N(μ_k, I)`.
pub(crate) fn site(counts: [usize; K], scale: [f32; F], shift: [f32; F], seed: u64) -> FeatureSet {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut features, mut labels) = (Vec::new(), Vec::new());
    for (k, &n) in counts.iter().enumerate() {
        for _ in 0..n {
            for j in 0..F {
                let z = MEANS[k][j] + standard_normal(&mut rng);
                features.push(scale[j] * z + shift[j]);
            }
            labels.push(k as u32);
        }
    }
    // Interleaved, as a site's requests come.
    let mut order: Vec<usize> = (0..labels.len()).collect();
    rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
    FeatureSet {
        dim: F,
        features,
        labels,
    }
    .rows(&order)
}

pub(crate) const SAME: [f32; F] = [1.0; F];
pub(crate) const NONE: [f32; F] = [0.0; F];

pub(crate) fn pool() -> FeatureSummary {
    summary_of(&site([400, 400, 400], SAME, NONE, 1), K).unwrap()
}

/// The pool's Bayes classifier as a head: hidden units `x` and `−x` (so ReLU passes `x`
/// through), logits `Σ_j μ̂_kj x̂_j / ŵ_j − ½ Σ_j μ̂_kj² / ŵ_j + log π⁰_k` in the standardised
/// space the head is trained in.
pub(crate) fn bayes_head(pool: &FeatureSummary) -> (HeadConfig, Vec<f32>) {
    let stats = pool.balanced_stats().unwrap();
    let head = HeadConfig::new(F, K).with_hidden(2 * F);
    let h = 2 * F;
    let (means, within) = (pool.means.to_vec(), pool.within.to_vec());
    let total: f64 = pool.counts.iter().sum();
    let mut w1 = vec![0f32; F * h];
    let mut w = vec![0f32; h * K];
    let mut b = vec![0f32; K];
    for j in 0..F {
        w1[j * h + j] = 1.0;
        w1[j * h + F + j] = -1.0;
    }
    for k in 0..K {
        b[k] = (pool.counts[k] / total).ln() as f32;
        for j in 0..F {
            let s = stats.inv_std[j];
            let mu = (means[k * F + j] - stats.mean[j]) * s;
            let var = within[j] * s * s;
            w[j * K + k] = mu / var;
            w[(F + j) * K + k] = -mu / var;
            b[k] -= 0.5 * mu * mu / var;
        }
    }
    let params = [w1, vec![0.0; h], w, b].concat();
    assert_eq!(params.len(), head.num_params());
    (head, params)
}

fn fit(pool: &FeatureSummary, set: &FeatureSet) -> PriorShift {
    let (head, params) = bayes_head(pool);
    prior_shift(pool, &set.features, set.dim, &head, &params).unwrap()
}

/// The share of `set`'s rows the site predicts right with `estimate` (labels read only here).
fn accuracy(pool: &FeatureSummary, estimate: &PriorShift, set: &FeatureSet) -> f64 {
    let (head, params) = bayes_head(pool);
    let predicted = estimate
        .predict(&head, &params, &set.features, set.dim)
        .unwrap();
    let right = (predicted.iter().zip(&set.labels))
        .filter(|(p, y)| **p == **y as usize)
        .count();
    right as f64 / set.len() as f64
}

#[test]
fn a_skewed_sites_prior_is_found_and_a_balanced_sites_stays_near_uniform() {
    let pool = pool();
    let uniform = 1.0 / K as f64;
    for (seed, shift) in [(2, NONE), (3, [3.0, -2.0, 0.5, 1.0])] {
        // 80 % of one class, 128 rows, with and without a shift of the whole site.
        let skewed = fit(&pool, &site([103, 12, 13], SAME, shift, seed));
        assert!(skewed.accepted(), "{:?}", skewed.outcome);
        assert!((skewed.prior[0] - 0.8).abs() < 0.08, "{:?}", skewed.prior);
        let off = (skewed.prior.iter()).map(|p| (p - uniform).abs());
        assert!(off.fold(0.0, f64::max) > 0.35, "{:?}", skewed.prior);
        assert!(skewed.log_ratio[0] > 0.7, "{:?}", skewed.log_ratio);
        for p in &skewed.train_prior {
            assert!((p - uniform).abs() < 1e-9, "the pool is balanced");
        }
    }
    let balanced = fit(
        &pool,
        &site([100, 100, 100], SAME, [2.0, 0.0, 0.0, -1.0], 4),
    );
    assert!(balanced.accepted(), "{:?}", balanced.outcome);
    for p in &balanced.prior {
        assert!((p - uniform).abs() < 0.05, "{:?}", balanced.prior);
    }
}

#[test]
fn the_affine_map_recovers_a_known_shift_and_scale_whatever_the_class_mix() {
    let pool = pool();
    let scale = [1.5, 0.7, 1.0, 2.0];
    let shift = [3.0, -2.0, 0.5, 1.0];
    for (counts, seed) in [([200, 200, 200], 5), ([480, 60, 60], 6)] {
        let calibration = site(counts, scale, shift, seed);
        let estimate = fit(&pool, &calibration);
        assert!(estimate.accepted(), "{:?}", estimate.outcome);
        for j in 0..F {
            let (a, b) = (estimate.scale[j], estimate.shift[j]);
            assert!(
                (a / f64::from(scale[j]) - 1.0).abs() < 0.1,
                "{counts:?} feature {j}: scale {a} for {}",
                scale[j]
            );
            assert!(
                (b - f64::from(shift[j])).abs() < 0.35,
                "{counts:?} feature {j}: shift {b} for {}",
                shift[j]
            );
        }
        // Scored on other rows of the same site: the fit classifies them as the pool's head
        // classifies the pool; the pooled statistics leave the site moved and stretched.
        let scored = site(counts, scale, shift, seed + 100);
        let pooled = prior_shift(&pool, &[], F, &bayes_head(&pool).0, &bayes_head(&pool).1);
        let (fitted, plain) = (
            accuracy(&pool, &estimate, &scored),
            accuracy(&pool, &pooled.unwrap(), &scored),
        );
        assert!(fitted > 0.93, "{counts:?}: {fitted}");
        assert!(fitted > plain + 0.2, "{counts:?}: {fitted} against {plain}");
    }
}

#[test]
fn a_site_with_no_rows_three_rows_or_one_class_falls_back_safely() {
    let pool = pool();
    let reference = pool.balanced_stats().unwrap();
    let few = [
        FeatureSet::default(),
        site([3, 0, 0], SAME, NONE, 7),
        site([1, 1, 1], SAME, [5.0; F], 8),
        site([MIN_FIT_ROWS - 1, 0, 0], SAME, NONE, 9),
    ];
    for set in &few {
        let estimate = fit(&pool, set);
        let rows = set.features.len() / F;
        assert_eq!(estimate.outcome, Outcome::TooFewRows(rows));
        assert_eq!(estimate.stats, reference, "pooled as it is");
        assert!(estimate.log_ratio.iter().all(|r| *r == 0.0));
        assert_eq!(estimate.prior, estimate.train_prior);
    }
    // One class only, enough rows: whatever is decided, nothing panics, every value is finite
    // and a kept fit puts that class first.
    for (class, seed) in [(0, 10), (1, 11), (2, 12)] {
        let mut counts = [0; K];
        counts[class] = 64;
        let estimate = fit(&pool, &site(counts, SAME, NONE, seed));
        let values = (estimate.stats.mean.iter()).chain(&estimate.stats.inv_std);
        assert!(values.chain(&estimate.log_ratio).all(|v| v.is_finite()));
        if estimate.accepted() {
            assert!(estimate.prior[class] > 0.8, "{:?}", estimate.prior);
        } else {
            assert_eq!(estimate.stats, reference);
        }
    }
}

#[test]
fn a_site_that_looks_like_the_pool_keeps_the_pooled_statistics() {
    // The pool's own distribution: the map and prior have nothing to explain, so on rows the
    // fit did not see it does no better than the pooled model.
    let pool = pool();
    let estimate = fit(&pool, &site([22, 21, 21], SAME, NONE, 13));
    assert!(
        matches!(estimate.outcome, Outcome::NoBetter { .. }),
        "{:?}",
        estimate.outcome
    );
    assert_eq!(estimate.stats, pool.balanced_stats().unwrap());
}

#[test]
fn a_pool_that_disagrees_with_the_head_or_does_not_hold_together_gives_nothing() {
    let pool = pool();
    let set = site([40, 40, 40], SAME, NONE, 14);
    let (head, params) = bayes_head(&pool);
    let wider = HeadConfig::new(F + 1, K).with_hidden(2);
    let wider_params = wider.init_flat(1);
    assert_eq!(
        prior_shift(&pool, &set.features, F, &wider, &wider_params),
        None
    );
    assert_eq!(
        prior_shift(&pool, &set.features, F, &head, &params[1..]),
        None
    );
    let mut means = pool.means.to_vec();
    means[2] = f32::NAN;
    let broken = FeatureSummary {
        means: fedge_wire::TensorF32::new(vec![K as u32, F as u32], &means).unwrap(),
        ..pool.clone()
    };
    assert_eq!(prior_shift(&broken, &set.features, F, &head, &params), None);
}
