//! Server strategies: how the round's accepted updates become the next global head.
//!
//! Shaped like Flower's strategies: a small synchronous trait, with the arithmetic in free
//! functions that have their own tests. This module holds the trait, what it returns and the
//! shared arithmetic; each strategy lives in its own file ([`fedavg`], [`fedomg`], central
//! DP-FedAvg in [`dp`]), the
//! wrappers that go around any strategy too ([`momentum`], [`robust`]), and [`build`] turns a
//! configuration into a boxed strategy. Strategies see deltas and never do I/O.

pub mod build;
pub mod dp;
pub mod fedavg;
pub mod fedomg;
pub mod momentum;
mod names;
pub mod robust;

pub use build::{BuildError, StrategyConfig, StrategyKind};
pub use dp::{AdaptiveClip, CentralDp, DpFedAvg, PrivacyMode, SamplingKind};
pub use fedavg::FedAvg;
pub use fedomg::{FedOmg, SolverKind};
pub use momentum::ServerMomentum;
pub use robust::{Robust, RobustKind};

use fedge_wire::TrainParams;

use crate::updates::RoundUpdates;

/// A selected client whose update did not count this round.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Failure {
    /// Client id.
    pub client: String,
    /// Why: a rejection reason (`shape`, `non_finite`, ...) or `no_report`.
    pub reason: String,
}

/// What one aggregation did, for status and metrics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AggregationReport {
    /// FedOMG's weights `Γ*` per client (sums to 1).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty", default)]
    pub gamma: std::collections::BTreeMap<String, f64>,
    /// FedOMG's objective at `Γ*` (`fedomg_objective` in JSON: `objective` there is the
    /// devices' training objective, a name).
    #[serde(
        rename = "fedomg_objective",
        alias = "objective",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub objective: Option<f64>,
    /// FedOMG's `λ`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lambda: Option<f64>,
    /// FedOMG's solver (`reference` or `converged`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub solver: Option<String>,
    /// Objective evaluations the solver made.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub solver_evaluations: Option<usize>,
    /// Norm of the server momentum buffer after the update.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub momentum_norm: Option<f32>,
    /// Central DP: how many of the round's deltas were longer than the clip norm.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dp_clipped: Option<usize>,
    /// Central DP: the expected number of participants the noisy sum was divided by.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dp_expected: Option<f64>,
    /// Central DP: the clip norm this round used (it moves each round with adaptive clipping).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dp_clip_norm: Option<f64>,
}

/// The next global parameters and what the aggregation did.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregated {
    /// Next global parameters.
    pub params: Vec<f32>,
    /// Details for status and metrics.
    pub report: AggregationReport,
}

/// Named f32 buffers a strategy carries from round to round (momentum), saved with the
/// coordinator's checkpoint.
pub type StrategyState = std::collections::BTreeMap<String, Vec<f32>>;

/// Saved strategy buffers that do not fit the strategy restoring them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// A buffer this strategy does not keep.
    #[error("{strategy} keeps no state, found {key:?}")]
    Unexpected {
        /// The strategy's name.
        strategy: String,
        /// The buffer's key.
        key: String,
    },
    /// The saved server momentum holds NaN or infinite values.
    #[error("saved server momentum is not finite")]
    NonFiniteMomentum,
}

/// A server-side aggregation rule, shaped like Flower's `Strategy`.
///
/// A wrapper (server momentum, a robust rewrite, a box) names the strategy it wraps with
/// [`Strategy::inner`]; every method it does not write itself then goes to the inner strategy,
/// so the forwarding is written once, here.
///
/// Server-side evaluation on held-out data is the driver's `crate::Evaluator`: it needs data,
/// which strategies never see.
pub trait Strategy: Send {
    /// Name shown in status and metrics.
    fn name(&self) -> &str;

    /// The next global parameters from `global`, the round's accepted updates (never empty,
    /// finished) and the selected clients that did not count.
    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated;

    /// The strategy this one wraps, if it is a wrapper.
    fn inner(&self) -> Option<&dyn Strategy> {
        None
    }

    /// The strategy this one wraps, mutably; must agree with [`Strategy::inner`].
    fn inner_mut(&mut self) -> Option<&mut dyn Strategy> {
        None
    }

    /// The number of participants the round expects (central DP divides its noisy sum by it
    /// instead of the observed count: docs/algorithms.md §8); the round machine calls it before
    /// each aggregation. Other strategies ignore it.
    fn expect_participants(&mut self, expected: f64) {
        if let Some(inner) = self.inner_mut() {
            inner.expect_participants(expected);
        }
    }

    /// The parameters of round 1, given the configured or seeded ones.
    fn initialize_parameters(&mut self, initial: Vec<f32>) -> Vec<f32> {
        match self.inner_mut() {
            Some(inner) => inner.initialize_parameters(initial),
            None => initial,
        }
    }

    /// Local training parameters for `round`; the default sends the configured ones unchanged.
    fn configure_round(&mut self, round: u64, defaults: &TrainParams) -> TrainParams {
        match self.inner_mut() {
            Some(inner) => inner.configure_round(round, defaults),
            None => defaults.clone(),
        }
    }

    /// Whether the round should stream dot products between deltas (FedOMG).
    fn needs_dots(&self) -> bool {
        self.inner().is_some_and(|inner| inner.needs_dots())
    }

    /// The solver, for strategies that have one (shown in the status).
    fn solver(&self) -> Option<&str> {
        self.inner().and_then(|inner| inner.solver())
    }

    /// Buffers to save with the checkpoint.
    fn state(&self) -> StrategyState {
        self.inner().map(|inner| inner.state()).unwrap_or_default()
    }

    /// Restores [`Strategy::state`]; unknown or mis-sized buffers are an error.
    fn restore(&mut self, state: &StrategyState) -> Result<(), StateError> {
        if let Some(inner) = self.inner_mut() {
            return inner.restore(state);
        }
        match state.keys().next() {
            None => Ok(()),
            Some(key) => Err(StateError::Unexpected {
                strategy: self.name().to_owned(),
                key: key.clone(),
            }),
        }
    }
}

/// `Σ_u (n_u / Σ n) Δ_u` in f64; zeros when there is no weight.
pub fn weighted_mean_delta(updates: &RoundUpdates) -> Vec<f64> {
    let total = updates.total_samples();
    if total <= 0.0 {
        return vec![0.0; updates.m()];
    }
    let p: Vec<f64> = (0..updates.len())
        .map(|i| updates.num_samples(i) as f64 / total)
        .collect();
    updates.weighted_sum(&p)
}

/// `θ + scale · d`, computed in f64 and rounded once.
pub fn apply(global: &[f32], direction: &[f64], scale: f64) -> Vec<f32> {
    global
        .iter()
        .zip(direction)
        .map(|(g, d)| (*g as f64 + scale * d) as f32)
        .collect()
}

/// A boxed strategy is the strategy inside (so wrappers can hold any strategy).
impl Strategy for Box<dyn Strategy> {
    fn name(&self) -> &str {
        self.as_ref().name()
    }

    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated {
        self.as_mut().aggregate(global, updates, failures)
    }

    fn inner(&self) -> Option<&dyn Strategy> {
        Some(self.as_ref())
    }

    fn inner_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(self.as_mut())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod dp_tests;
