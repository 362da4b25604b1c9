//! Server momentum (FedAvgM) around any strategy: a velocity buffer fed with the inner
//! strategy's direction, saved with the checkpoint. It does not look at the deltas itself.

use super::{Aggregated, Failure, StateError, Strategy, StrategyState};
use crate::updates::RoundUpdates;
use crate::updates::norms::l2_norm;

/// Server momentum parameters out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("server momentum needs 0 <= beta < 1 and lr > 0, got beta {beta}, lr {lr}")]
pub struct MomentumError {
    /// The momentum `β` asked for.
    pub beta: f32,
    /// The server learning rate asked for.
    pub lr: f32,
}

/// Server momentum around any strategy (FedAvgM; Flower's `server_momentum` and
/// `server_learning_rate`): with the inner strategy's direction `d = θ_inner − θ`,
/// `v ← β v + d`, `θ ← θ + η_s v`. `β = 0, η_s = 1` is the inner strategy unchanged.
pub struct ServerMomentum<S> {
    name: String,
    inner: S,
    beta: f32,
    lr: f32,
    velocity: Vec<f32>,
}

impl<S: Strategy> ServerMomentum<S> {
    /// Wraps `inner`; `beta` must be in `[0, 1)` and `lr` positive.
    pub fn new(inner: S, beta: f32, lr: f32) -> Result<Self, MomentumError> {
        if !((0.0..1.0).contains(&beta) && lr.is_finite() && lr > 0.0) {
            return Err(MomentumError { beta, lr });
        }
        let name = match inner.name() {
            "fedavg" => "fedavgm".to_string(),
            other => format!("{other}+momentum"),
        };
        Ok(Self {
            name,
            inner,
            beta,
            lr,
            velocity: Vec::new(),
        })
    }

    /// The momentum buffer (empty before the first aggregation).
    pub fn velocity(&self) -> &[f32] {
        &self.velocity
    }
}

impl<S: Strategy> Strategy for ServerMomentum<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn inner(&self) -> Option<&dyn Strategy> {
        Some(&self.inner)
    }

    fn inner_mut(&mut self) -> Option<&mut dyn Strategy> {
        Some(&mut self.inner)
    }

    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated {
        let Aggregated {
            params: inner,
            mut report,
        } = self.inner.aggregate(global, updates, failures);
        if self.velocity.len() != global.len() {
            self.velocity = vec![0.0; global.len()];
        }
        for ((v, next), g) in self.velocity.iter_mut().zip(&inner).zip(global) {
            *v = self.beta * *v + (next - g);
        }
        report.momentum_norm = Some(l2_norm(&self.velocity));
        let params = global
            .iter()
            .zip(&self.velocity)
            .map(|(g, v)| g + self.lr * v)
            .collect();
        Aggregated { params, report }
    }

    fn state(&self) -> StrategyState {
        let mut state = self.inner.state();
        if !self.velocity.is_empty() {
            state.insert(MOMENTUM_KEY.into(), self.velocity.clone());
        }
        state
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), StateError> {
        let mut inner = state.clone();
        self.velocity = inner.remove(MOMENTUM_KEY).unwrap_or_default();
        if self.velocity.iter().any(|v| !v.is_finite()) {
            self.velocity.clear();
            return Err(StateError::NonFiniteMomentum);
        }
        self.inner.restore(&inner)
    }
}

/// The momentum buffer's key in the saved strategy state.
pub(super) const MOMENTUM_KEY: &str = "server_momentum";
