//! Robust aggregation wrappers (Flower's set: norm clipping, coordinate-wise trimmed mean and
//! median), usable around any strategy, FedAvg and FedOMG alike.
//!
//! Each wrapper rewrites the round's deltas and hands them to the inner strategy, which then
//! aggregates as usual (FedOMG recomputes its dot products on the rewritten deltas):
//!
//! - `clip`: a delta longer than the bound is scaled down to it, `Δ ← Δ · min(1, c/‖Δ‖)`; the
//!   bound `c` is `clip_norm` when positive, else the median of the round's norms (so one
//!   huge update cannot drag the model further than a typical one).
//! - `trimmed-mean` (fraction `β`): per coordinate, the `k = ⌊β·N⌋` largest and `k` smallest
//!   values are pulled in to the nearest value kept (winsorised). Around FedAvg the result is
//!   the sample-weighted winsorised mean, which resists the same `k` outliers per side as
//!   Flower's `FedTrimmedAvg` (it keeps their count in the weights instead of dropping them).
//! - `median`: the same with all values pulled in to the middle one (odd `N`) or the middle
//!   two (even `N`): around FedAvg the coordinate-wise median for odd `N`, a weighted mean of
//!   the two middle values for even `N`.
//!
//! **Choice**: winsorising rather than dropping keeps one delta per client, so every inner
//! strategy (FedOMG's per-client Gram matrix, momentum) still applies unchanged.

use super::names::closed_set;
use super::{Aggregated, Failure, Strategy};
use crate::updates::norms::{median, norms};
use crate::updates::{Delta, RoundUpdates, UpdatesConfig};

closed_set! {
    /// The robust rewrite of the deltas before the strategy (`robust`, `--robust`).
    pub enum RobustKind("robust") {
        /// No rewrite.
        #[default]
        None = "none",
        /// Scale deltas down to `clip_norm` (0: the round's median norm).
        Clip = "clip",
        /// Coordinate-wise winsorised trimmed mean (`trim_fraction` per side).
        TrimmedMean = "trimmed-mean",
        /// Coordinate-wise median.
        Median = "median",
    }
}

/// A robust rule's parameter out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RobustError {
    /// A negative or non-finite clipping bound.
    #[error("clip_norm must be >= 0 (0: median norm), got {0}")]
    ClipNorm(f64),
    /// A trimming fraction outside `[0, 0.5)`.
    #[error("trim_fraction must be in [0, 0.5), got {0}")]
    TrimFraction(f64),
}

/// Which rewrite of the deltas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RobustRule {
    /// Scale deltas down to a norm bound; `0` means the round's median norm.
    Clip {
        /// Absolute bound, or 0 for the median norm.
        norm: f64,
    },
    /// Winsorise `⌊β·N⌋` values at each end of every coordinate.
    TrimmedMean {
        /// Fraction `β` per side, in `[0, 0.5)`.
        fraction: f64,
    },
    /// Winsorise every coordinate to its middle value(s).
    Median,
}

impl RobustRule {
    /// The rule `kind` with its parameters, checked.
    pub fn of(
        kind: RobustKind,
        clip_norm: f64,
        fraction: f64,
    ) -> Result<Option<Self>, RobustError> {
        match kind {
            RobustKind::None => Ok(None),
            RobustKind::Clip if clip_norm.is_finite() && clip_norm >= 0.0 => {
                Ok(Some(Self::Clip { norm: clip_norm }))
            }
            RobustKind::Clip => Err(RobustError::ClipNorm(clip_norm)),
            RobustKind::TrimmedMean if (0.0..0.5).contains(&fraction) => {
                Ok(Some(Self::TrimmedMean { fraction }))
            }
            RobustKind::TrimmedMean => Err(RobustError::TrimFraction(fraction)),
            RobustKind::Median => Ok(Some(Self::Median)),
        }
    }

    /// Name shown after the strategy's, e.g. `fedomg+clip`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Clip { .. } => "clip",
            Self::TrimmedMean { .. } => "trimmed-mean",
            Self::Median => "median",
        }
    }
}

/// The rewritten deltas, held like the round's (same clients, counts and views), with dot
/// products computed when `dots`. Rows are rewritten as they are copied in: a row scale for
/// `clip`, per-coordinate bounds for the winsorising rules, and no copy of the round in between.
pub fn rewrite(rule: RobustRule, updates: &RoundUpdates, dots: bool) -> RoundUpdates {
    let (n, m) = (updates.len(), updates.m());
    let k = match rule {
        RobustRule::Clip { norm } => {
            let lengths = norms(updates);
            let bound = if norm > 0.0 { norm } else { median(&lengths) };
            let scales: Vec<f32> = (lengths.into_iter())
                .map(|length| match length > bound && length > 0.0 {
                    true => (bound / length) as f32,
                    false => 1.0,
                })
                .collect();
            return updates.scaled(&scales, dots);
        }
        RobustRule::TrimmedMean { fraction } => (fraction * n as f64).floor() as usize,
        RobustRule::Median => (n.saturating_sub(1)) / 2,
    };
    if k == 0 || n <= 2 * k {
        return updates.scaled(&vec![1.0; n], dots);
    }
    let mut column = vec![0f32; n];
    let deltas: Vec<Delta<'_>> = (0..n).map(|i| updates.delta(i)).collect();
    let bounds: Vec<(f32, f32)> = (0..m)
        .map(|j| {
            for (slot, delta) in column.iter_mut().zip(&deltas) {
                *slot = delta.get(j);
            }
            column.sort_by(f32::total_cmp);
            (column[k], column[n - 1 - k])
        })
        .collect();
    let config = UpdatesConfig {
        dots,
        budget_bytes: usize::MAX,
        ..UpdatesConfig::default()
    };
    let mut out = RoundUpdates::new(m, n, config);
    for (i, delta) in deltas.iter().enumerate() {
        let values = (delta.iter().zip(&bounds)).map(|(v, (low, high))| v.clamp(*low, *high));
        // No budget: the round's own arena already held these rows.
        let pushed = out.push_values(updates.client(i), updates.num_samples(i), values);
        debug_assert!(pushed.is_ok());
    }
    out.finish();
    out
}

/// A strategy whose input deltas are rewritten by a [`RobustRule`] first.
pub struct Robust {
    name: String,
    rule: RobustRule,
    inner: Box<dyn Strategy>,
}

impl Robust {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn Strategy>, rule: RobustRule) -> Self {
        Self {
            name: format!("{}+{}", inner.name(), rule.name()),
            rule,
            inner,
        }
    }
}

impl Strategy for Robust {
    fn name(&self) -> &str {
        &self.name
    }

    // Clipping reads the norms from the streamed dot products when the inner strategy asks for
    // them (`needs_dots` goes to the inner strategy).
    fn inner(&self) -> Option<&dyn Strategy> {
        Some(self.inner.as_ref())
    }

    fn inner_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.inner.as_mut())
    }

    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated {
        let rewritten = rewrite(self.rule, updates, self.inner.needs_dots());
        self.inner.aggregate(global, &rewritten, failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::FedAvg;

    fn held(rows: &[(&str, u32, &[f32])]) -> RoundUpdates {
        RoundUpdates::from_updates(rows[0].2.len(), true, rows.iter().copied())
    }

    fn rows_of(updates: &RoundUpdates) -> Vec<Vec<f32>> {
        (0..updates.len())
            .map(|i| updates.delta(i).to_vec())
            .collect()
    }

    fn run(rule: RobustRule, rows: &[(&str, u32, &[f32])]) -> Vec<f32> {
        let mut s = Robust::new(Box::new(FedAvg), rule);
        s.aggregate(&vec![0.0; rows[0].2.len()], &held(rows), &[])
            .params
    }

    const HONEST_AND_ONE_ATTACKER: [(&str, u32, &[f32]); 5] = [
        ("a", 1, &[1.0, -1.0]),
        ("b", 1, &[1.2, -0.8]),
        ("c", 1, &[0.8, -1.2]),
        ("d", 1, &[1.1, -0.9]),
        ("evil", 1, &[100.0, 100.0]),
    ];

    #[test]
    fn median_around_fedavg_is_the_coordinate_median() {
        let out = run(RobustRule::Median, &HONEST_AND_ONE_ATTACKER);
        assert_eq!(out, vec![1.1, -0.9]);
    }

    #[test]
    fn trimmed_mean_pulls_in_the_extremes_of_each_coordinate() {
        // N = 5, β = 0.2: k = 1 per side. Coordinate 0 sorted: 0.8 1.0 1.1 1.2 100 → 0.8→1.0,
        // 100→1.2: mean (1.0 + 1.2 + 1.0 + 1.1 + 1.2) / 5 = 1.1.
        let out = run(
            RobustRule::TrimmedMean { fraction: 0.2 },
            &HONEST_AND_ONE_ATTACKER,
        );
        assert!((out[0] - 1.1).abs() < 1e-6, "{out:?}");
        // Coordinate 1 sorted: -1.2 -1.0 -0.9 -0.8 100 → -1.2→-1.0, 100→-0.8.
        let want = (-1.0 - 0.8 - 1.0 - 0.9 - 0.8) / 5.0;
        assert!((out[1] - want).abs() < 1e-6, "{out:?}");
        // Plain FedAvg is dragged to ~20.8 by the attacker.
        let plain = FedAvg
            .aggregate(&[0.0, 0.0], &held(&HONEST_AND_ONE_ATTACKER), &[])
            .params;
        assert!(plain[0] > 20.0);
    }

    #[test]
    fn clipping_to_the_median_norm_bounds_every_delta() {
        let rows = rows_of(&rewrite(
            RobustRule::Clip { norm: 0.0 },
            &held(&HONEST_AND_ONE_ATTACKER),
            false,
        ));
        let lengths: Vec<f64> = rows
            .iter()
            .map(|r| r.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt())
            .collect();
        let bound = median(&norms(&held(&HONEST_AND_ONE_ATTACKER)));
        assert!(
            lengths.iter().all(|l| *l <= bound * (1.0 + 1e-6)),
            "{lengths:?}"
        );
        // The attacker keeps its direction.
        assert!((rows[4][0] - rows[4][1]).abs() < 1e-6);
        // An absolute bound larger than every norm changes nothing.
        let rows = rows_of(&rewrite(
            RobustRule::Clip { norm: 1e6 },
            &held(&HONEST_AND_ONE_ATTACKER),
            false,
        ));
        assert_eq!(rows[4], vec![100.0, 100.0]);
    }

    #[test]
    fn clipping_wraps_fedomg_and_keeps_its_weights_summing_to_one() {
        let omg = crate::strategy::StrategyConfig {
            strategy: crate::strategy::StrategyKind::Fedomg,
            ..Default::default()
        }
        .build()
        .unwrap();
        let mut s = Robust::new(omg, RobustRule::Clip { norm: 0.0 });
        assert_eq!(s.name(), "fedomg+clip");
        let out = s.aggregate(&[0.0, 0.0], &held(&HONEST_AND_ONE_ATTACKER), &[]);
        let sum: f64 = out.report.gamma.values().sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert!(
            out.params.iter().all(|v| v.abs() < 10.0),
            "{:?}",
            out.params
        );
    }

    #[test]
    fn few_updates_and_bad_settings() {
        // With k = 0 nothing changes.
        let two: [(&str, u32, &[f32]); 2] = [("a", 1, &[1.0]), ("b", 3, &[5.0])];
        assert_eq!(run(RobustRule::Median, &two), vec![4.0]);
        assert!(RobustRule::of(RobustKind::TrimmedMean, 0.0, 0.5).is_err());
        assert!(RobustRule::of(RobustKind::Clip, -1.0, 0.1).is_err());
        assert_eq!(RobustRule::of(RobustKind::None, 0.0, 0.1), Ok(None));
    }
}
