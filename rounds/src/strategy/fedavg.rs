//! FedAvg (docs/algorithms.md §1): the sample-weighted mean of the deltas, applied at once.

use super::{Aggregated, AggregationReport, Failure, Strategy, apply, weighted_mean_delta};
use crate::updates::RoundUpdates;

/// FedAvg: `θ ← θ + Σ_u (n_u / Σ n) Δ_u`.
#[derive(Debug, Clone, Default)]
pub struct FedAvg;

impl Strategy for FedAvg {
    fn name(&self) -> &str {
        "fedavg"
    }

    fn aggregate(&mut self, global: &[f32], updates: &RoundUpdates, _: &[Failure]) -> Aggregated {
        let delta = weighted_mean_delta(updates);
        Aggregated {
            params: apply(global, &delta, 1.0),
            report: AggregationReport::default(),
        }
    }
}
