//! A site's feature statistics (docs/algorithms.md §7): what a site standardises its backbone
//! features with before the head when the federation runs `feature_norm = "site"`, and what an
//! exported model carries as its input-side layer (`fedge-edge site-stats` writes them as JSON,
//! `fedge-coordinator export --site-stats` reads them).
//!
//! `x̂_j = (x_j − μ_j) / √(σ_j² + ε)` per feature `j`, with `μ` and `σ²` the mean and the
//! population variance over the site's rows and `ε` = [`EPSILON`] (BatchNorm's), which keeps a
//! feature that is constant at the site (a ReLU that never fires there) at 0 rather than
//! dividing by zero.

use serde::{Deserialize, Serialize};

use crate::TensorF32;

/// Added to every variance before its square root.
pub const EPSILON: f32 = 1e-5;

/// A site's per-feature mean and inverse standard deviation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureStats {
    /// `μ`, one per feature.
    pub mean: Vec<f32>,
    /// `1/√(σ² + ε)`, one per feature.
    pub inv_std: Vec<f32>,
}

impl FeatureStats {
    /// The statistics of `rows` (each `dim` values), or `None` without a row, with `dim = 0` or
    /// a row of another length.
    pub fn of_rows<'a>(dim: usize, rows: impl Iterator<Item = &'a [f32]> + Clone) -> Option<Self> {
        if dim == 0 {
            return None;
        }
        // Two passes in f64: the mean, then the variance about it.
        let (mut sum, mut count) = (vec![0f64; dim], 0usize);
        for row in rows.clone() {
            if row.len() != dim {
                return None;
            }
            count += 1;
            for (a, &v) in sum.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
        if count == 0 {
            return None;
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / count as f64).collect();
        let mut squares = vec![0f64; dim];
        for row in rows {
            for ((a, &v), m) in squares.iter_mut().zip(row).zip(&mean) {
                *a += (f64::from(v) - m).powi(2);
            }
        }
        let inv_std = squares
            .iter()
            .map(|s| (1.0 / (s / count as f64 + f64::from(EPSILON)).sqrt()) as f32)
            .collect();
        Some(Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            inv_std,
        })
    }

    /// The statistics of a mean and a (population) variance per feature, in f64.
    pub fn from_moments(
        mean: impl Iterator<Item = f64>,
        variance: impl Iterator<Item = f64>,
    ) -> Self {
        Self {
            mean: mean.map(|m| m as f32).collect(),
            inv_std: variance
                .map(|v| (1.0 / (v.max(0.0) + f64::from(EPSILON)).sqrt()) as f32)
                .collect(),
        }
    }

    /// Standardises `features` (rows of `self.mean.len()` values) in place.
    pub fn apply_in_place(&self, features: &mut [f32]) {
        let dim = self.mean.len().max(1);
        for row in features.chunks_exact_mut(dim) {
            for ((v, m), s) in row.iter_mut().zip(&self.mean).zip(&self.inv_std) {
                *v = (*v - m) * s;
            }
        }
    }

    /// Checks that the statistics describe `features` finite values.
    pub fn check(&self, features: usize) -> Result<(), String> {
        if self.mean.len() != features || self.inv_std.len() != features {
            return Err(format!(
                "the site statistics hold {} means and {} scales, the model takes {features} \
                 features",
                self.mean.len(),
                self.inv_std.len()
            ));
        }
        if !self.mean.iter().chain(&self.inv_std).all(|v| v.is_finite()) {
            return Err("a site statistic is not finite".into());
        }
        Ok(())
    }
}

/// Fewest rows of a class whose mean a device sends ([`FeatureSummary::without_rare_classes`]).
pub const MIN_CLASS_ROWS: f64 = 5.0;

/// Fewest devices with rows of a class for a round to fold that class into the pool
/// ([`FeatureSummary::robust_merge`]): the pool's change then never shows one device's class
/// alone, and a clipped value has a median of others to be clipped around.
pub const MIN_CLASS_DEVICES: usize = 3;

/// How far, in robust spreads, a part's class mean may lie from the parts' median before a
/// robust merge clips it ([`FeatureSummary::robust_merge`]).
const MEAN_BAND: f32 = 4.0;

/// How many times above the parts' median within-class variance (or the features' average
/// of those, when larger) a part's may be before a robust merge clips it.
const SPREAD_RATIO: f32 = 16.0;

/// The median of `values` (sorted in place; the mean of the middle two of an even count).
fn median(values: &mut [f32]) -> f32 {
    values.sort_by(f32::total_cmp);
    let m = values.len();
    match m {
        0 => 0.0,
        _ if m % 2 == 1 => values[m / 2],
        _ => (values[m / 2 - 1] + values[m / 2]) / 2.0,
    }
}

/// What the pooled estimators need of a set of labelled rows (docs/algorithms.md §7): rows per
/// class, class means and the within-class variance per feature. Devices send theirs with an
/// update when the federation's `feature_norm` pools; the coordinator merges them exactly
/// ([`FeatureSummary::merge`]) and sends the federation's with every task and release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureSummary {
    /// Rows per class `n_k` (K); merged summaries carry weights, so not always whole.
    pub counts: Vec<f64>,
    /// Class means `μ_k`, shape `[K, F]`; zero rows for absent classes.
    pub means: TensorF32,
    /// Within-class variance per feature `w_j = (1/n) Σ_i (x_ij − μ_{y_i j})²` (F).
    pub within: TensorF32,
}

impl FeatureSummary {
    /// The summary of `rows` (each `dim` values) with `labels` below `classes`, or `None`
    /// without a row, with a row of another length or a label out of range.
    pub fn of_rows<'a>(
        dim: usize,
        classes: usize,
        rows: impl Iterator<Item = &'a [f32]> + Clone,
        labels: &[u32],
    ) -> Option<Self> {
        if dim == 0 || classes == 0 || labels.iter().any(|&y| y as usize >= classes) {
            return None;
        }
        let mut counts = vec![0f64; classes];
        let mut sums = vec![0f64; classes * dim];
        let mut n = 0usize;
        for (row, &y) in rows.clone().zip(labels) {
            if row.len() != dim {
                return None;
            }
            n += 1;
            counts[y as usize] += 1.0;
            let sum = &mut sums[y as usize * dim..][..dim];
            for (a, &v) in sum.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
        if n == 0 || n != labels.len() {
            return None;
        }
        for (sum, &c) in sums.chunks_exact_mut(dim).zip(&counts) {
            sum.iter_mut().for_each(|v| *v /= c.max(1.0));
        }
        let mut squares = vec![0f64; dim];
        for (row, &y) in rows.zip(labels) {
            let mean = &sums[y as usize * dim..][..dim];
            for ((a, &v), m) in squares.iter_mut().zip(row).zip(mean) {
                *a += (f64::from(v) - m).powi(2);
            }
        }
        Some(Self::from_parts(
            counts,
            &sums,
            squares.iter().map(|s| s / n as f64),
        ))
    }

    fn from_parts(counts: Vec<f64>, means: &[f64], within: impl Iterator<Item = f64>) -> Self {
        let means: Vec<f32> = means.iter().map(|&m| m as f32).collect();
        let within: Vec<f32> = within.map(|w| w as f32).collect();
        let (k, f) = (counts.len() as u32, within.len() as u32);
        Self {
            counts,
            means: TensorF32::new(vec![k, f], &means).expect("K × F class means"),
            within: TensorF32::from_slice(&within),
        }
    }

    /// Classes `K`.
    pub fn classes(&self) -> usize {
        self.counts.len()
    }

    /// Features `F`.
    pub fn features(&self) -> usize {
        self.within.len()
    }

    /// Rows (or weight) in all.
    pub fn total(&self) -> f64 {
        self.counts.iter().sum()
    }

    /// The same summary with its tensors packed with `codec` (an update's or a task's: f16
    /// halves its bytes; a value f16 cannot carry keeps its tensor in f32).
    pub fn recoded(&self, codec: crate::Codec) -> Self {
        Self {
            counts: self.counts.clone(),
            means: self.means.recoded(codec),
            within: self.within.recoded(codec),
        }
    }

    /// How far features may be from the pool's classes before they are unfamiliar: the
    /// pool's class means and inverse within-class variances, ready for [`Familiarity::distance`].
    /// `None` without a class that has rows.
    pub fn familiarity(&self) -> Option<Familiarity> {
        let f = self.features();
        let means = self.means.to_vec();
        let within = self.within.to_vec();
        if means.len() != self.classes() * f {
            return None;
        }
        let present: Vec<f32> = (self.counts.iter().enumerate())
            .filter(|(_, n)| **n > 0.0)
            .flat_map(|(k, _)| means[k * f..(k + 1) * f].iter().copied())
            .collect();
        if f == 0 || present.is_empty() || means.len() != self.classes() * f {
            return None;
        }
        // A feature the pool never saw vary (a dead unit) is held to a thousandth of the
        // average spread instead of dividing by zero.
        let floor =
            (within.iter().map(|w| f64::from(*w)).sum::<f64>() / f as f64 * 1e-3).max(1e-12) as f32;
        let inverse = within.iter().map(|w| 1.0 / w.max(floor)).collect();
        Some(Familiarity {
            means: present,
            inverse,
        })
    }

    /// The summary with every count scaled by `factor` (a weight cap, a decay).
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            counts: self.counts.iter().map(|c| c * factor).collect(),
            ..self.clone()
        }
    }

    /// The summary of all rows of `parts` together, exactly (in f64): per class the
    /// count-weighted mean, and the within-class variance about the merged class means,
    /// `W = Σ_d (n_d W_d + Σ_k n_dk ‖μ_dk − μ_k‖²) / N`. `None` without a part, a row, or
    /// when parts disagree on their sizes.
    pub fn merge<'a>(parts: impl Iterator<Item = &'a Self> + Clone) -> Option<Self> {
        let first = parts.clone().next()?;
        let (k, f) = (first.classes(), first.features());
        let mut counts = vec![0f64; k];
        let mut means = vec![0f64; k * f];
        for part in parts.clone() {
            if part.classes() != k || part.features() != f || part.means.len() != k * f {
                return None;
            }
            let part_means = part.means.to_vec();
            for (c, (&n, row)) in part
                .counts
                .iter()
                .zip(part_means.chunks_exact(f))
                .enumerate()
            {
                counts[c] += n;
                for (a, &m) in means[c * f..][..f].iter_mut().zip(row) {
                    *a += n * f64::from(m);
                }
            }
        }
        let total: f64 = counts.iter().sum();
        if total.is_nan() || total <= 0.0 {
            return None;
        }
        for (row, &n) in means.chunks_exact_mut(f).zip(&counts) {
            row.iter_mut()
                .for_each(|v| *v /= if n > 0.0 { n } else { 1.0 });
        }
        let mut within = vec![0f64; f];
        for part in parts {
            let part_means = part.means.to_vec();
            let part_within = part.within.to_vec();
            for (a, &w) in within.iter_mut().zip(&part_within) {
                *a += part.total() * f64::from(w);
            }
            for (c, (&n, row)) in part
                .counts
                .iter()
                .zip(part_means.chunks_exact(f))
                .enumerate()
            {
                let merged = &means[c * f..][..f];
                for ((a, &m), g) in within.iter_mut().zip(row).zip(merged) {
                    *a += n * (f64::from(m) - g).powi(2);
                }
            }
        }
        Some(Self::from_parts(
            counts,
            &means,
            within.iter().map(|w| w / total),
        ))
    }

    /// The summary without its classes of fewer than [`MIN_CLASS_ROWS`] rows (their count and
    /// mean set to 0), what a device sends: the mean of one or two rows is those images'
    /// features. The within-class variance still covers every row (it names no class).
    pub fn without_rare_classes(&self) -> Self {
        let f = self.features();
        let mut means = self.means.to_vec();
        let mut counts = self.counts.clone();
        for (k, n) in counts.iter_mut().enumerate() {
            if *n < MIN_CLASS_ROWS {
                *n = 0.0;
                if let Some(row) = means.get_mut(k * f..(k + 1) * f) {
                    row.fill(0.0);
                }
            }
        }
        let (k, f) = (counts.len() as u32, f as u32);
        Self {
            counts,
            means: TensorF32::new(vec![k, f], &means).unwrap_or_else(|_| self.means.clone()),
            within: self.within.clone(),
        }
    }

    /// The round's summaries of several devices as one, robustly (docs/algorithms.md §7,
    /// "Bounded influence"): a class counts only where at least [`MIN_CLASS_DEVICES`] parts
    /// have rows of it; per feature `j`, with `M_j` the median of the parts' within-class
    /// variances or their average over the features when larger, each part's variance is
    /// clipped to `[0, 16 M_j]`, and each class mean to `c_kj ± 4 r_kj` around the median
    /// `c_kj` of the parts' means of that class, with `r_kj = max(√M_j, 1.4826 · MAD_kj)`
    /// (the within-class spread, or the spread of the parts' means about their median when
    /// wider); then the parts merge exactly
    /// ([`FeatureSummary::merge`]). Medians and MADs of three or more parts are set by the
    /// others when one part lies, so one part, whatever its values, moves a class mean by at
    /// most its weight times `4 r`, and honest parts near one another are not clipped at all.
    /// `None` when no class has enough parts or the parts disagree on their sizes.
    pub fn robust_merge(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        let (k, f) = (first.classes(), first.features());
        if parts
            .iter()
            .any(|p| p.classes() != k || p.features() != f || p.means.len() != k * f)
        {
            return None;
        }
        let mut means: Vec<Vec<f32>> = parts.iter().map(|p| p.means.to_vec()).collect();
        let mut within: Vec<Vec<f32>> = parts.iter().map(|p| p.within.to_vec()).collect();
        let mut counts: Vec<Vec<f64>> = parts.iter().map(|p| p.counts.clone()).collect();
        // Classes too few parts have rows of are left out of every part.
        let thin: Vec<bool> = (0..k)
            .map(|class| counts.iter().filter(|c| c[class] > 0.0).count() < MIN_CLASS_DEVICES)
            .collect();
        for part in &mut counts {
            for (n, &thin) in part.iter_mut().zip(&thin) {
                if thin {
                    *n = 0.0;
                }
            }
        }
        let contributing: Vec<usize> = (0..parts.len())
            .filter(|&d| counts[d].iter().any(|&n| n > 0.0))
            .collect();
        if contributing.len() < MIN_CLASS_DEVICES {
            return None;
        }
        let mut column = Vec::with_capacity(parts.len());
        let spread: Vec<f32> = (0..f)
            .map(|j| {
                column.clear();
                column.extend(contributing.iter().map(|&d| within[d][j]));
                median(&mut column)
            })
            .collect();
        // A feature most devices never see vary (a unit that fires at one site only) is held
        // to the features' average spread, not to 0.
        let average = spread.iter().sum::<f32>() / f.max(1) as f32;
        let spread: Vec<f32> = spread.iter().map(|m| m.max(average)).collect();
        for &d in &contributing {
            for (w, m) in within[d].iter_mut().zip(&spread) {
                *w = w.clamp(0.0, m * SPREAD_RATIO);
            }
        }
        for class in 0..k {
            let have: Vec<usize> = (contributing.iter().copied())
                .filter(|&d| counts[d][class] > 0.0)
                .collect();
            if have.is_empty() {
                continue;
            }
            for (j, w) in spread.iter().enumerate() {
                column.clear();
                column.extend(have.iter().map(|&d| means[d][class * f + j]));
                let centre = median(&mut column);
                column.iter_mut().for_each(|v| *v = (*v - centre).abs());
                let mad = median(&mut column);
                let reach = MEAN_BAND * w.max(0.0).sqrt().max(1.4826 * mad);
                for &d in &have {
                    let v = &mut means[d][class * f + j];
                    *v = v.clamp(centre - reach, centre + reach);
                }
            }
        }
        let clipped: Vec<Self> = contributing
            .iter()
            .filter_map(|&d| {
                let means = TensorF32::new(vec![k as u32, f as u32], &means[d]).ok()?;
                Some(Self {
                    counts: std::mem::take(&mut counts[d]),
                    means,
                    within: TensorF32::from_slice(&within[d]),
                })
            })
            .collect();
        Self::merge(clipped.iter())
    }

    /// The class-balanced mixture of the summarised classes (every class present counted
    /// alike, whatever its share of the rows): the mean of the present class means `m`, and
    /// per feature the between-class variance `(1/K') Σ_k (μ_kj − m_j)²` over the `K'` present
    /// classes. `None` without a class.
    pub fn balanced_moments(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let f = self.features();
        let means = self.means.to_vec();
        let present: Vec<&[f32]> = (self.counts.iter())
            .zip(means.chunks_exact(f.max(1)))
            .filter(|(n, _)| **n > 0.0)
            .map(|(_, row)| row)
            .collect();
        if present.is_empty() || f == 0 {
            return None;
        }
        let k = present.len() as f64;
        let mut mean = vec![0f64; f];
        for row in &present {
            for (a, &m) in mean.iter_mut().zip(*row) {
                *a += f64::from(m) / k;
            }
        }
        let mut between = vec![0f64; f];
        for row in &present {
            for ((a, &m), g) in between.iter_mut().zip(*row).zip(&mean) {
                *a += (f64::from(m) - g).powi(2) / k;
            }
        }
        Some((mean, between))
    }

    /// The statistics of the class-balanced mixture ([`FeatureSummary::balanced_moments`]):
    /// mean `m`, variance `w_j + between_j`. `None` without a class.
    pub fn balanced_stats(&self) -> Option<FeatureStats> {
        let (mean, between) = self.balanced_moments()?;
        let within = self.within.to_vec();
        let variance = within.iter().zip(&between).map(|(&w, b)| f64::from(w) + b);
        Some(FeatureStats::from_moments(mean.into_iter(), variance))
    }

    /// Checks the tensors' encodings, the sizes against `classes` × `features`, that every
    /// value is finite and every count and variance ≥ 0.
    pub fn check(&self, classes: usize, features: usize) -> Result<(), String> {
        for tensor in [&self.means, &self.within] {
            tensor.validate().map_err(|e| e.to_string())?;
        }
        if self.classes() != classes
            || self.features() != features
            || self.means.len() != classes.saturating_mul(features)
        {
            return Err(format!(
                "a feature summary of {} classes × {} features (with {} means), the head takes \
                 {classes} × {features}",
                self.classes(),
                self.features(),
                self.means.len()
            ));
        }
        let means = self.means.to_vec();
        let within = self.within.to_vec();
        let finite = means.iter().chain(&within).all(|v| v.is_finite());
        if !finite || !self.counts.iter().all(|c| c.is_finite() && *c >= 0.0) {
            return Err("a feature summary value is not finite or a count is negative".into());
        }
        if within.iter().any(|&w| w < 0.0) {
            return Err("a within-class variance is negative".into());
        }
        Ok(())
    }
}

/// The pool's class means and inverse within-class variances (see
/// [`FeatureSummary::familiarity`]): how unlike everything the federation trained on a row of
/// backbone features is (docs/algorithms.md §7, "Unfamiliar inputs").
#[derive(Debug, Clone, PartialEq)]
pub struct Familiarity {
    /// The means of the classes with rows, `[K', F]`.
    means: Vec<f32>,
    /// `1 / w_j` per feature.
    inverse: Vec<f32>,
}

impl Familiarity {
    /// The distance of `x` (one row of `F` raw features) to the nearest class mean, in
    /// within-class standard deviations averaged over the features:
    /// `d(x) = min_k √((1/F) Σ_j (x_j − μ_kj)² / w_j)`. A row of the pool's own classes
    /// measures about 1; `None` when `x` is not `F` values long.
    pub fn distance(&self, x: &[f32]) -> Option<f32> {
        let f = self.inverse.len();
        if x.len() != f {
            return None;
        }
        let nearest = (self.means.chunks_exact(f))
            .map(|mean| {
                (x.iter().zip(mean).zip(&self.inverse))
                    .map(|((x, m), inv)| f64::from((x - m) * (x - m) * inv))
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min);
        Some((nearest / f as f64).sqrt() as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(rows: &[[f32; 2]], labels: &[u32]) -> FeatureSummary {
        FeatureSummary::of_rows(2, 3, rows.iter().map(|r| &r[..]), labels).unwrap()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    #[test]
    fn familiarity_is_the_distance_to_the_nearest_class_in_within_class_deviations() {
        // Class 0 around (0, 0), class 1 around (10, 0); within-class variance 1 and 4;
        // class 2 has no row and is never the nearest.
        let rows = [[-1.0, -2.0], [1.0, 2.0], [9.0, -2.0], [11.0, 2.0]];
        let s = summary(&rows, &[0, 0, 1, 1]);
        let near = s.familiarity().unwrap();
        assert_eq!(near.distance(&[0.0, 0.0]), Some(0.0));
        // From class 1's mean: (1/2)(1²/1 + 2²/4) = 1.
        assert!((near.distance(&[11.0, 2.0]).unwrap() - 1.0).abs() < 1e-6);
        // Far from both: (1/2)(5²/1 + 20²/4) = 62.5 from either.
        let far = near.distance(&[5.0, 20.0]).unwrap();
        assert!((far - 62.5f32.sqrt()).abs() < 1e-4, "{far}");
        assert_eq!(near.distance(&[1.0]), None);
        // A feature that never varied does not divide by zero.
        let flat = summary(&[[0.0, 3.0], [2.0, 3.0]], &[0, 0]);
        assert!(
            flat.familiarity()
                .unwrap()
                .distance(&[1.0, 4.0])
                .unwrap()
                .is_finite()
        );
    }

    #[test]
    fn summaries_merge_exactly_into_the_summary_of_all_rows() {
        let rows = [
            [1.0, 2.0],
            [3.0, 0.0],
            [5.0, 4.0],
            [0.0, 1.0],
            [2.0, 2.0],
            [7.0, 3.0],
        ];
        let labels = [0, 0, 1, 1, 0, 2];
        let whole = summary(&rows, &labels);
        assert_eq!(whole.counts, [3.0, 2.0, 1.0]);
        // Class 0's mean is (2, 4/3); the within variance of feature 0 is
        // ((1−2)² + (3−2)² + (2−2)² + (5−2.5)² + (0−2.5)² + 0) / 6.
        assert!(close(&whole.means.to_vec()[..2], &[2.0, 4.0 / 3.0]));
        assert!((whole.within.to_vec()[0] - 14.5 / 6.0).abs() < 1e-5);
        let (a, b) = (
            summary(&rows[..3], &labels[..3]),
            summary(&rows[3..], &labels[3..]),
        );
        let merged = FeatureSummary::merge([a.clone(), b].iter()).unwrap();
        assert_eq!(merged.counts, whole.counts);
        assert!(close(&merged.means.to_vec(), &whole.means.to_vec()));
        assert!(close(&merged.within.to_vec(), &whole.within.to_vec()));
        // A scaled summary weighs less in a merge, and other sizes do not merge.
        let light = FeatureSummary::merge([a.scaled(0.0), summary(&rows, &labels)].iter());
        assert_eq!(light.unwrap().counts, whole.counts);
        let wide = FeatureSummary::of_rows(1, 3, [[1.0f32]].iter().map(|r| &r[..]), &[0]);
        assert_eq!(FeatureSummary::merge([a, wide.unwrap()].iter()), None);
        assert_eq!(
            FeatureSummary::of_rows(2, 3, [[1.0f32, 2.0]].iter().map(|r| &r[..]), &[3]),
            None
        );
    }

    #[test]
    fn balanced_statistics_do_not_move_with_the_class_mix() {
        // Two classes at (0, 0) and (4, 2); the same rows with class 1 repeated five times.
        let even = summary(&[[0.0, 0.0], [4.0, 2.0]], &[0, 1]);
        let skewed = summary(
            &[
                [0.0, 0.0],
                [4.0, 2.0],
                [4.0, 2.0],
                [4.0, 2.0],
                [4.0, 2.0],
                [4.0, 2.0],
            ],
            &[0, 1, 1, 1, 1, 1],
        );
        let (a, b) = (
            even.balanced_stats().unwrap(),
            skewed.balanced_stats().unwrap(),
        );
        assert!(close(&a.mean, &[2.0, 1.0]) && close(&a.mean, &b.mean));
        assert!(close(&a.inv_std, &b.inv_std));
        // Between-class variance 4 and 1, no within-class spread.
        let expected = [1.0 / (4.0 + EPSILON).sqrt(), 1.0 / (1.0 + EPSILON).sqrt()];
        assert!(close(&a.inv_std, &expected), "{:?}", a.inv_std);
        // The plain statistics of the skewed rows lean to class 1.
        let plain = FeatureStats::of_rows(2, [[0.0f32, 0.0], [4.0, 2.0]].iter().map(|r| &r[..]));
        assert!(close(&plain.unwrap().mean, &a.mean));
    }

    #[test]
    fn a_summary_that_does_not_fit_or_is_not_finite_is_refused() {
        let good = summary(&[[0.0, 1.0], [2.0, 3.0]], &[0, 2]);
        assert_eq!(good.check(3, 2), Ok(()));
        assert!(good.check(3, 4).unwrap_err().contains("3 × 4"));
        let nan = FeatureSummary {
            within: TensorF32::from_slice(&[f32::NAN, 0.0]),
            ..good.clone()
        };
        assert!(nan.check(3, 2).is_err());
        let negative = FeatureSummary {
            counts: vec![-1.0, 0.0, 2.0],
            ..good
        };
        assert!(negative.check(3, 2).is_err());
    }

    fn part(counts: [f64; 2], means: [f32; 4], within: [f32; 2]) -> FeatureSummary {
        FeatureSummary {
            counts: counts.to_vec(),
            means: TensorF32::new(vec![2, 2], &means).unwrap(),
            within: TensorF32::from_slice(&within),
        }
    }

    #[test]
    fn a_robust_merge_bounds_one_lying_part_and_leaves_honest_parts_exact() {
        let a = part([10.0, 10.0], [0.0, 0.0, 4.0, 4.0], [1.0, 1.0]);
        let b = part([10.0, 10.0], [1.0, 1.0, 5.0, 5.0], [2.0, 2.0]);
        let c = part([10.0, 10.0], [2.0, 2.0, 6.0, 6.0], [3.0, 3.0]);
        // Honest parts within the band: exactly the plain merge.
        let honest = FeatureSummary::robust_merge(&[&a, &b, &c]).unwrap();
        assert_eq!(
            honest,
            FeatureSummary::merge([&a, &b, &c].into_iter()).unwrap()
        );
        // A liar with a quarter of the rows: each of its means clipped to the four parts'
        // median (1.5 from the honest 1) ± 4 × √(median variance 2.5) ≈ 6.3, so a merged mean
        // moves by at most a quarter of 6.8, whatever it claimed; its spreads to 16 × 2.5.
        let liar = part([10.0, 10.0], [1e9, -1e9, 1e9, -1e9], [1e9, 0.0]);
        let merged = FeatureSummary::robust_merge(&[&a, &b, &c, &liar]).unwrap();
        let honest_means = honest.means.to_vec();
        for (v, h) in merged.means.to_vec().iter().zip(&honest_means) {
            assert!((v - h).abs() <= 1.71, "{v} against {h}");
        }
        assert!(merged.within.values().all(|w| w < 30.0), "{merged:?}");
        assert_eq!(merged.counts, vec![40.0, 40.0]);
        // A class only two parts have is left out; with no class of three parts, nothing.
        let thin = part([10.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0]);
        let merged = FeatureSummary::robust_merge(&[&a, &b, &thin]).unwrap();
        assert_eq!(merged.counts, vec![30.0, 0.0]);
        assert_eq!(FeatureSummary::robust_merge(&[&a, &b]), None);
    }

    #[test]
    fn a_device_keeps_the_classes_it_has_too_few_rows_of() {
        let s = part([4.0, 12.0], [7.0, 8.0, 1.0, 2.0], [1.0, 1.0]).without_rare_classes();
        assert_eq!(s.counts, vec![0.0, 12.0]);
        assert_eq!(s.means.to_vec(), vec![0.0, 0.0, 1.0, 2.0]);
    }
}
