//! Site feature normalisation (docs/algorithms.md §7): a site standardises the frozen
//! backbone's features with statistics of its own unlabelled data before the head, in the
//! spirit of AdaBN and FedBN, so that a shift that moves a site's features as a whole (another
//! camera's contrast, light, sensor noise) no longer reaches the head.
//!
//! `x̂_j = (x_j − μ_j) / √(σ_j² + ε)` per feature `j`, with `μ` and `σ²` the mean and the
//! population variance over the site's rows and `ε` = [`EPSILON`] (BatchNorm's), which keeps a
//! feature that is constant at the site (a ReLU that never fires there) at 0 rather than
//! dividing by zero.

use serde::{Deserialize, Serialize};

use crate::features::FeatureSet;

pub use fedge_wire::FeatureNorm;

/// Added to every variance before its square root.
pub const EPSILON: f32 = 1e-5;

/// A site's per-feature mean and inverse standard deviation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureStats {
    /// `μ`, one per feature.
    pub mean: Vec<f32>,
    /// `1/√(σ² + ε)`, one per feature.
    pub inv_std: Vec<f32>,
}

impl FeatureStats {
    /// The statistics of every row of `sets` (labels unused), or `None` without rows or when
    /// the sets disagree on the feature size.
    pub fn of(sets: &[&FeatureSet]) -> Option<Self> {
        let dim = sets.first()?.dim;
        if dim == 0 || sets.iter().any(|s| s.dim != dim) {
            return None;
        }
        let rows: usize = sets.iter().map(|s| s.features.len() / dim).sum();
        if rows == 0 {
            return None;
        }
        // Two passes in f64: the mean, then the variance about it.
        let mut sum = vec![0f64; dim];
        for row in sets.iter().flat_map(|s| s.features.chunks_exact(dim)) {
            for (a, &v) in sum.iter_mut().zip(row) {
                *a += f64::from(v);
            }
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / rows as f64).collect();
        let mut squares = vec![0f64; dim];
        for row in sets.iter().flat_map(|s| s.features.chunks_exact(dim)) {
            for ((a, &v), m) in squares.iter_mut().zip(row).zip(&mean) {
                *a += (f64::from(v) - m).powi(2);
            }
        }
        let inv_std = squares
            .iter()
            .map(|s| (1.0 / (s / rows as f64 + f64::from(EPSILON)).sqrt()) as f32)
            .collect();
        Some(Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            inv_std,
        })
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

    /// `set` standardised.
    pub fn apply(&self, set: &FeatureSet) -> FeatureSet {
        let mut out = set.clone();
        self.apply_in_place(&mut out.features);
        out
    }

    /// A site's statistics over all of its own rows (training and validation; an
    /// evaluation-only site has only the latter), or `None` without any.
    pub fn of_site(train: &FeatureSet, val: &FeatureSet) -> Option<Self> {
        let sets: Vec<&FeatureSet> = [train, val].into_iter().filter(|s| !s.is_empty()).collect();
        Self::of(&sets)
    }
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
        let stats = FeatureStats::of(&[&set]).unwrap();
        assert_eq!(stats.mean, [3.0, 7.0]);
        let expected = 1.0 / (8.0f32 / 3.0 + EPSILON).sqrt();
        assert!((stats.inv_std[0] - expected).abs() < 1e-6);
        let out = stats.apply(&set);
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
        let again = FeatureStats::of(&[&shifted]).unwrap().apply(&shifted);
        for (a, b) in again.features.iter().zip(&out.features) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
        // Statistics over two sets are those of their rows together.
        let (first, second) = (set.rows(&[0]), set.rows(&[1, 2]));
        assert_eq!(FeatureStats::of(&[&first, &second]), Some(stats));
        assert_eq!(FeatureStats::of(&[&set.rows(&[])]), None);
        assert_eq!("site".parse::<FeatureNorm>(), Ok(FeatureNorm::Site));
        assert!(
            "batch"
                .parse::<FeatureNorm>()
                .unwrap_err()
                .to_string()
                .contains("site")
        );
    }
}
