//! Site feature normalisation on a site's feature sets (docs/algorithms.md §7; the statistics
//! and their formula are `fedge_wire::FeatureStats`): a site standardises the frozen
//! backbone's features with statistics of its own unlabelled data before the head, in the
//! spirit of AdaBN and FedBN, so that a shift that moves a site's features as a whole (another
//! camera's contrast, light, sensor noise) no longer reaches the head.

use crate::features::FeatureSet;

pub use fedge_wire::site_stats::EPSILON;
pub use fedge_wire::{FeatureNorm, FeatureStats};

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
}
