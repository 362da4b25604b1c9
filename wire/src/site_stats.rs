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
