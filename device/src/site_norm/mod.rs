//! Site feature normalisation on a site's feature sets (docs/algorithms.md §7; the statistics
//! and their formula are `fedge_wire::FeatureStats` and `fedge_wire::FeatureSummary`): a site
//! standardises the frozen backbone's features before the head, in the spirit of AdaBN and
//! FedBN, so that a shift that moves a site's features as a whole (another camera's contrast,
//! light, sensor noise) no longer reaches the head.
//!
//! Four estimators, one per [`FeatureNorm`]: none; `site`, the mean and variance of the site's
//! own rows (which moves with the site's class mix); `pooled`, the federation's class-balanced
//! statistics; `balanced` ([`balanced_stats`]), the site's offset and spread measured against
//! the pooled class means, shrunk towards the pooled statistics. [`SiteNorm`] picks one for a
//! set of rows, with labels (a training device) or with the model's (a serving site).
//!
//! Beside them, not yet a [`FeatureNorm`] (nothing of it travels): [`label_shift`], a site's
//! class prior and a per-feature affine map estimated together from unlabelled rows against
//! the pooled class-conditional statistics, with the head's output corrected by the prior
//! ratio, kept only where it explains the site's rows better than `pooled` ([`prior_shift`]).

use std::borrow::Cow;

use fedge_models::HeadConfig;

use crate::features::FeatureSet;

pub mod label_shift;
#[cfg(test)]
pub(crate) mod label_shift_tests;

pub use label_shift::{Outcome, PriorShift, prior_shift};

pub use fedge_wire::site_stats::EPSILON;
pub use fedge_wire::{FeatureNorm, FeatureStats, FeatureSummary};

/// Below this many rows a site's class means and spread are not used: `balanced` takes the
/// pooled statistics moved by the site's (shrunk) offset (one row has no variance; a handful
/// give a factor of hundreds).
pub const MIN_ROWS: usize = 16;
/// The pooled within-class variance's weight in rows, `n₀`, in `balanced`'s shrinkage
/// `n / (n + n₀)`.
pub const PRIOR_ROWS: f64 = 16.0;
/// `balanced`'s floor on a site's within-class variance, relative to the pooled one.
pub const VARIANCE_FLOOR: f64 = 0.25;
/// Below [`MIN_ROWS`], the pooled mean's weight in rows, `n₂`, against the site's offset.
pub const OFFSET_PRIOR_ROWS: f64 = 8.0;
/// The weight in rows of a class's pooled mean (moved with the site) in `balanced`'s estimate
/// of that class's mean at the site, `n₁`.
pub const CLASS_PRIOR_ROWS: f64 = 0.5;

/// The summary of a labelled set's rows over `classes` classes (`None` without rows).
pub fn summary_of(set: &FeatureSet, classes: usize) -> Option<FeatureSummary> {
    FeatureSummary::of_rows(
        set.dim,
        classes,
        set.features.chunks_exact(set.dim.max(1)),
        &set.labels,
    )
}

/// `balanced`: a site's statistics from its rows `set` (labels: their classes, known or
/// predicted) against the federation's `pooled` summary, estimated for the class-balanced
/// mixture whatever the site's own class mix. Per feature, over the `n` rows whose class the
/// pool has:
///
/// - the site's offset from the pooled class means, `δ = (1/n) Σ_i (x_i − μ_{y_i})`;
/// - each class's mean at the site, `ĉ_k = (n_k c_k + n₁ (μ_k + δ)) / (n_k + n₁)`: its own rows'
///   mean `c_k` shrunk towards the pooled class mean moved by the offset (`n₁` =
///   [`CLASS_PRIOR_ROWS`]; a class the site has not seen is `μ_k + δ`);
/// - mean `m = (1/K') Σ_k ĉ_k` and between-class variance `(1/K') Σ_k (ĉ_k − m)²` over the
///   pool's `K'` classes;
/// - within-class variance `s = (1/n) Σ_i (x_i − c_{y_i})²` shrunk towards the pooled one `w`
///   with `λ = n / (n + n₀)` ([`PRIOR_ROWS`]), floored at [`VARIANCE_FLOOR`] · `w`.
///
/// A site that sees mostly one class therefore keeps the other classes where the pool has them
/// (moved with the site), while a site whose contrast or light changes every class moves all
/// of its class means and spreads. Below [`MIN_ROWS`] rows: the pooled statistics with their
/// mean moved by `n / (n + n₂) · δ` ([`OFFSET_PRIOR_ROWS`]); without a row, as they are.
/// `None` when the pool has no class, or does not hold together ([`holds_together`]).
pub fn balanced_stats(pooled: &FeatureSummary, set: &FeatureSet) -> Option<FeatureStats> {
    if !holds_together(pooled) {
        return None;
    }
    let pooled_stats = pooled.balanced_stats()?;
    let (k, f) = (pooled.classes(), pooled.features());
    let within = pooled.within.to_vec();
    let class_means = pooled.means.to_vec();
    let known = |y: u32| pooled.counts.get(y as usize).is_some_and(|n| *n > 0.0);
    let rows: Vec<(&[f32], usize)> = (set.features.chunks_exact(set.dim.max(1)))
        .zip(&set.labels)
        .filter(|(x, y)| known(**y) && x.len() == f)
        .map(|(x, &y)| (x, y as usize))
        .collect();
    if rows.is_empty() {
        return Some(pooled_stats);
    }
    let n = rows.len() as f64;
    // Per class: rows and the sum of their features; the offset from the pooled class means.
    let mut counts = vec![0f64; k];
    let mut sums = vec![0f64; k * f];
    let mut offset = vec![0f64; f];
    for &(x, y) in &rows {
        counts[y] += 1.0;
        let mu = &class_means[y * f..][..f];
        let sum = &mut sums[y * f..][..f];
        for (((s, o), &v), &m) in sum.iter_mut().zip(&mut offset).zip(x).zip(mu) {
            *s += f64::from(v);
            *o += (f64::from(v) - f64::from(m)) / n;
        }
    }
    if rows.len() < MIN_ROWS {
        // Too few rows for class means or a spread: the pooled statistics moved by the
        // site's offset from the pooled class means, shrunk by `n / (n + n₂)`.
        let lambda = n / (n + OFFSET_PRIOR_ROWS);
        let (mean, between) = pooled.balanced_moments()?;
        let mean = mean.iter().zip(&offset).map(|(m, d)| m + lambda * d);
        let variance = within.iter().zip(&between).map(|(&w, b)| f64::from(w) + b);
        return Some(FeatureStats::from_moments(mean, variance));
    }
    // The site's own class means `c_k`, and its within-class variance about them.
    let own: Vec<f64> = (sums.chunks_exact(f))
        .zip(&counts)
        .flat_map(|(row, &c)| row.iter().map(move |s| s / c.max(1.0)))
        .collect();
    let mut spread = vec![0f64; f];
    for &(x, y) in &rows {
        for ((a, &v), c) in spread.iter_mut().zip(x).zip(&own[y * f..][..f]) {
            *a += (f64::from(v) - c).powi(2) / n;
        }
    }
    // `ĉ_k` for every class the pool has.
    let present: Vec<usize> = (0..k).filter(|&c| known(c as u32)).collect();
    let estimate: Vec<Vec<f64>> = (present.iter())
        .map(|&c| {
            let (nk, n1) = (counts[c], CLASS_PRIOR_ROWS);
            (own[c * f..][..f].iter())
                .zip(&class_means[c * f..][..f])
                .zip(&offset)
                .map(|((o, &m), d)| (nk * o + n1 * (f64::from(m) + d)) / (nk + n1))
                .collect()
        })
        .collect();
    let kk = present.len() as f64;
    let mean: Vec<f64> = (0..f)
        .map(|j| estimate.iter().map(|c| c[j]).sum::<f64>() / kk)
        .collect();
    let lambda = n / (n + PRIOR_ROWS);
    let variance = (0..f).map(|j| {
        let between = estimate
            .iter()
            .map(|c| (c[j] - mean[j]).powi(2))
            .sum::<f64>()
            / kk;
        let w = f64::from(within[j]);
        (lambda * spread[j] + (1.0 - lambda) * w).max(VARIANCE_FLOOR * w) + between
    });
    Some(FeatureStats::from_moments(
        mean.clone().into_iter(),
        variance,
    ))
}

/// Whether a pooled summary's sizes agree with each other (`K × F` class means, `F`
/// variances) and every value is finite, so that the estimators here can read it. Whoever
/// holds the head checks it against the head as well (the trainer, a release's verification).
pub fn holds_together(pooled: &FeatureSummary) -> bool {
    pooled.check(pooled.classes(), pooled.features()).is_ok()
}

/// How one site's rows are standardised under a federation's [`FeatureNorm`], given what the
/// site holds: the pooled summary of the task or release, and for rows without labels the
/// head that labels them.
#[derive(Clone, Copy)]
pub struct SiteNorm<'a> {
    /// The estimator.
    pub norm: FeatureNorm,
    /// The federation's pooled summary, when the task or release carries one.
    pub pooled: Option<&'a FeatureSummary>,
}

impl SiteNorm<'_> {
    /// The statistics of labelled rows `set` (a training device's), with `classes` classes;
    /// `None` for `none` or without rows. Without a pooled summary yet (a federation's first
    /// round), `pooled` and `balanced` use the class-balanced statistics of the rows themselves;
    /// with one that does not hold together ([`holds_together`]), there are none.
    pub fn labelled(&self, set: &FeatureSet, classes: usize) -> Option<FeatureStats> {
        match (self.norm, self.pooled) {
            (FeatureNorm::None, _) => None,
            (FeatureNorm::Site, _) => stats_of(&[set]),
            (_, Some(pooled)) if !holds_together(pooled) => None,
            (FeatureNorm::Pooled, Some(pooled)) => pooled.balanced_stats(),
            (FeatureNorm::Balanced, Some(pooled)) => balanced_stats(pooled, set),
            (FeatureNorm::Pooled | FeatureNorm::Balanced, None) => {
                summary_of(set, classes)?.balanced_stats()
            }
        }
    }

    /// The statistics of unlabelled rows `set` (a serving or evaluation-only site's): for
    /// `balanced`, the rows are labelled by `head` (flat parameters `params`) on the pooled
    /// statistics, then once more on the estimate. A site without rows gets the pooled
    /// statistics; without a pooled summary, `pooled` and `balanced` use the site's own (`site`);
    /// with one that does not hold together ([`holds_together`]), there are none.
    pub fn unlabelled(
        &self,
        set: &FeatureSet,
        head: &HeadConfig,
        params: &[f32],
    ) -> Option<FeatureStats> {
        let pooled = match (self.norm, self.pooled) {
            (FeatureNorm::None, _) => return None,
            (FeatureNorm::Site, _) | (_, None) => return stats_of(&[set]),
            (_, Some(pooled)) if !holds_together(pooled) => return None,
            (_, Some(pooled)) => pooled,
        };
        let mut stats = pooled.balanced_stats()?;
        if self.norm == FeatureNorm::Pooled || set.is_empty() {
            return Some(stats);
        }
        for _ in 0..2 {
            let predicted =
                fedge_models::head::predict_flat(head, params, &standardise(&stats, set).features)
                    .ok()?;
            let labelled = FeatureSet {
                labels: predicted.iter().map(|&k| k as u32).collect(),
                ..set.clone()
            };
            stats = balanced_stats(pooled, &labelled)?;
        }
        Some(stats)
    }
}

/// The statistics a site standardises with to use `release`, from its training rows `train`
/// (labelled) or, without any, its unlabelled rows `val` (labelled by the release's head):
/// `site_stats` for `site`; for `pooled` and `balanced` [`SiteNorm`] with the release's
/// pooled summary, which a site without rows uses as it is. `None` for `none`, or when there
/// is nothing to take statistics from (then the release cannot serve here).
pub fn release_stats(
    release: &fedge_wire::ModelRelease,
    train: &FeatureSet,
    val: &FeatureSet,
) -> Option<FeatureStats> {
    let norm = SiteNorm {
        norm: release.feature_norm,
        pooled: release.pooled.as_ref(),
    };
    match release.feature_norm {
        FeatureNorm::None => None,
        FeatureNorm::Site => site_stats(train, val),
        _ if !train.is_empty() => norm.labelled(train, release.head.classes),
        _ => norm.unlabelled(val, &release.head, &release.params.to_vec()),
    }
}

/// `set` standardised with `stats` when there are any, else as it is.
pub fn standardised<'a>(stats: Option<&FeatureStats>, set: &'a FeatureSet) -> Cow<'a, FeatureSet> {
    match stats {
        Some(stats) => Cow::Owned(standardise(stats, set)),
        None => Cow::Borrowed(set),
    }
}

/// The statistics of every row of `sets` (labels unused), or `None` without rows or when the
/// sets disagree on the feature size.
pub fn stats_of(sets: &[&FeatureSet]) -> Option<FeatureStats> {
    let dim = sets.first()?.dim;
    if sets.iter().any(|s| s.dim != dim) {
        return None;
    }
    FeatureStats::of_rows(
        dim,
        sets.iter()
            .flat_map(|s| s.features.chunks_exact(dim.max(1))),
    )
}

/// A site's statistics: over its training rows when it has any, so that its validation rows
/// are standardised as any new image will be (statistics that had seen the scored rows would
/// flatter the score); an evaluation-only site has only validation rows and uses them. `None`
/// without any row.
pub fn site_stats(train: &FeatureSet, val: &FeatureSet) -> Option<FeatureStats> {
    match train.is_empty() {
        false => stats_of(&[train]),
        true => stats_of(&[val]),
    }
}

/// `set` standardised with `stats`.
pub fn standardise(stats: &FeatureStats, set: &FeatureSet) -> FeatureSet {
    let mut out = set.clone();
    stats.apply_in_place(&mut out.features);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_standardised_with_its_own_statistics_has_zero_mean_and_unit_variance() {
        // Feature 0: 1, 3, 5 (mean 3, variance 8/3); feature 1 constant 7.
        let set = FeatureSet {
            dim: 2,
            features: vec![1.0, 7.0, 3.0, 7.0, 5.0, 7.0],
            labels: vec![0, 1, 0],
        };
        let stats = stats_of(&[&set]).unwrap();
        assert_eq!(stats.mean, [3.0, 7.0]);
        let expected = 1.0 / (8.0f32 / 3.0 + EPSILON).sqrt();
        assert!((stats.inv_std[0] - expected).abs() < 1e-6);
        let out = standardise(&stats, &set);
        assert_eq!(out.labels, set.labels);
        let f0: Vec<f32> = out.features.chunks(2).map(|r| r[0]).collect();
        assert!((f0.iter().sum::<f32>()).abs() < 1e-6);
        let var: f32 = f0.iter().map(|v| v * v).sum::<f32>() / 3.0;
        assert!((var - 1.0).abs() < 1e-4, "{var}");
        assert!(out.features.chunks(2).all(|r| r[1] == 0.0), "constant → 0");
        // A shift and a scale of a whole site vanish: the same rows, brighter and stronger.
        let shifted = FeatureSet {
            features: set.features.iter().map(|v| 2.0 * v + 10.0).collect(),
            ..set.clone()
        };
        let again = standardise(&stats_of(&[&shifted]).unwrap(), &shifted);
        for (a, b) in again.features.iter().zip(&out.features) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
        // Statistics over two sets are those of their rows together.
        let (first, second) = (set.rows(&[0]), set.rows(&[1, 2]));
        assert_eq!(stats_of(&[&first, &second]), Some(stats));
        assert_eq!(stats_of(&[&set.rows(&[])]), None);
        assert_eq!("site".parse::<FeatureNorm>(), Ok(FeatureNorm::Site));
        assert!(
            "batch"
                .parse::<FeatureNorm>()
                .unwrap_err()
                .to_string()
                .contains("site")
        );
    }

    /// `n` rows per class of three classes centred on (0, 0), (10, 0) and (0, 10), spread ±1,
    /// moved by `shift`.
    fn rows(per_class: [usize; 3], shift: [f32; 2]) -> FeatureSet {
        let centres = [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]];
        let (mut features, mut labels) = (Vec::new(), Vec::new());
        for (k, (&n, c)) in per_class.iter().zip(&centres).enumerate() {
            for i in 0..n {
                let wiggle = if i % 2 == 0 { 1.0 } else { -1.0 };
                features.extend([c[0] + wiggle + shift[0], c[1] - wiggle + shift[1]]);
                labels.push(k as u32);
            }
        }
        FeatureSet {
            dim: 2,
            features,
            labels,
        }
    }

    #[test]
    fn balanced_statistics_follow_a_site_shift_but_not_its_class_mix() {
        let pooled = summary_of(&rows([40, 40, 40], [0.0, 0.0]), 3).unwrap();
        let reference = pooled.balanced_stats().unwrap();
        assert!((reference.mean[0] - 10.0 / 3.0).abs() < 1e-4);
        // A site moved by (3, −2) that sees class 0 in 90 % of its 80 rows.
        let site = rows([72, 4, 4], [3.0, -2.0]);
        let balanced = balanced_stats(&pooled, &site).unwrap();
        for (j, shift) in [3.0, -2.0].into_iter().enumerate() {
            let expected = reference.mean[j] + shift;
            assert!((balanced.mean[j] - expected).abs() < 1e-3, "{balanced:?}");
        }
        // The site's own mean is pulled to class 0 by its class mix: off by several units.
        let own = stats_of(&[&site]).unwrap();
        assert!((own.mean[0] - balanced.mean[0]).abs() > 2.0, "{own:?}");
        // The scale stays the pool's: the site's within-class spread is the pool's.
        for (a, b) in balanced.inv_std.iter().zip(&reference.inv_std) {
            assert!((a / b - 1.0).abs() < 0.01, "{a} vs {b}");
        }
        // A site whose contrast halves: every class mean and spread halves. The estimate
        // follows: its mean halves, its within-class variance is a quarter (shrunk towards the
        // pool's), and each class mean moves from the pool's by 20 / (20 + n₁) of the way.
        let mut faint = rows([20, 20, 20], [0.0, 0.0]);
        faint.features.iter_mut().for_each(|v| *v *= 0.5);
        let halved = balanced_stats(&pooled, &faint).unwrap();
        let lambda = 60.0 / (60.0 + PRIOR_ROWS);
        for j in 0..2 {
            assert!(
                (halved.mean[j] - reference.mean[j] / 2.0).abs() < 0.2,
                "{halved:?}"
            );
            let ratio = f64::from(reference.inv_std[j] / halved.inv_std[j]);
            let between = 1.0 / f64::from(reference.inv_std[j]).powi(2) - 1.0;
            let g = (20.0 * 0.5 + CLASS_PRIOR_ROWS) / (20.0 + CLASS_PRIOR_ROWS);
            let expected = ((lambda * 0.25 + 1.0 - lambda) + g * g * between) / (1.0 + between);
            assert!(expected < 0.5, "the spread shrinks: {expected}");
            assert!(
                (ratio.powi(2) - expected).abs() < 0.05,
                "{ratio} {expected}"
            );
        }
        // Three rows: the pooled spread, the mean moved by 3/(3 + n₂) of the rows' offset
        // (their wiggles +1, −1, +1 leave (1/3, −1/3) of it); `pooled` ignores the site.
        let few = balanced_stats(&pooled, &rows([3, 0, 0], [3.0, -2.0])).unwrap();
        let lambda = 3.0 / (3.0 + OFFSET_PRIOR_ROWS as f32);
        for (j, offset) in [3.0 + 1.0 / 3.0, -2.0 - 1.0 / 3.0].into_iter().enumerate() {
            let expected = reference.mean[j] + lambda * offset;
            assert!((few.mean[j] - expected).abs() < 1e-4, "{few:?}");
            assert!((few.inv_std[j] / reference.inv_std[j] - 1.0).abs() < 1e-5);
        }
        assert_eq!(
            balanced_stats(&pooled, &rows([0, 0, 0], [3.0, -2.0])),
            Some(reference.clone())
        );
        let norm = SiteNorm {
            norm: FeatureNorm::Pooled,
            pooled: Some(&pooled),
        };
        assert_eq!(norm.labelled(&site, 3), Some(reference.clone()));
        // Without a pooled summary yet, the class-balanced statistics of the rows themselves.
        let first = SiteNorm {
            norm: FeatureNorm::Balanced,
            pooled: None,
        };
        let own_balanced = summary_of(&site, 3).unwrap().balanced_stats();
        assert_eq!(first.labelled(&site, 3), own_balanced);
    }

    #[test]
    fn a_pooled_summary_that_does_not_hold_together_gives_no_statistics_and_no_panic() {
        let pooled = summary_of(&rows([40, 40, 40], [0.0, 0.0]), 3).unwrap();
        // Three classes of two features hold six means: five, or a NaN among them.
        let short = FeatureSummary {
            means: fedge_wire::TensorF32::from_slice(&[1.0; 5]),
            ..pooled.clone()
        };
        let mut means = pooled.means.to_vec();
        means[3] = f32::NAN;
        let nan = FeatureSummary {
            means: fedge_wire::TensorF32::new(vec![3, 2], &means).unwrap(),
            ..pooled.clone()
        };
        let site = rows([72, 4, 4], [3.0, -2.0]);
        let few = rows([3, 0, 0], [3.0, -2.0]);
        let head = HeadConfig::new(2, 3).with_hidden(2);
        let params = head.init_flat(1);
        for bad in [&short, &nan] {
            assert_eq!(balanced_stats(bad, &site), None);
            assert_eq!(balanced_stats(bad, &few), None);
            for norm in [FeatureNorm::Pooled, FeatureNorm::Balanced] {
                let norm = SiteNorm {
                    norm,
                    pooled: Some(bad),
                };
                assert_eq!(norm.labelled(&site, 3), None);
                assert_eq!(norm.unlabelled(&site, &head, &params), None);
            }
        }
    }

    #[test]
    fn an_unlabelled_site_is_labelled_by_the_head_and_a_site_without_rows_gets_the_pool() {
        let pooled = summary_of(&rows([40, 40, 40], [0.0, 0.0]), 3).unwrap();
        let reference = pooled.balanced_stats().unwrap();
        // A head that reads the class off the standardised features: hidden units are the
        // two features and their negations (ReLU), logits pick the quadrant.
        let head = HeadConfig::new(2, 3).with_hidden(2);
        // Layout: w1 [F, H], b1 [H], w [H, K], b [K].
        let params = [
            1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0,
        ];
        assert_eq!(params.len(), head.num_params());
        let site = rows([72, 4, 4], [3.0, -2.0]);
        let unlabelled = FeatureSet {
            labels: vec![0; site.len()],
            ..site.clone()
        };
        let norm = SiteNorm {
            norm: FeatureNorm::Balanced,
            pooled: Some(&pooled),
        };
        let stats = norm.unlabelled(&unlabelled, &head, &params).unwrap();
        assert_eq!(
            Some(stats),
            balanced_stats(&pooled, &site),
            "labelled right by the head"
        );
        let empty = FeatureSet::default();
        assert_eq!(norm.unlabelled(&empty, &head, &params), Some(reference));
    }
}
