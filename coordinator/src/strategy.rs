//! Server strategies: how the round's accepted updates become the next global head.
//!
//! Shaped like Flower's strategies: a small synchronous trait, with the arithmetic in free
//! functions that have their own tests. FedAvg (ALGORITHMS.md §1) lives here; later
//! strategies plug in behind the same trait.

use fedge_wire::TrainParams;

/// One update that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedUpdate {
    /// Client id.
    pub client: String,
    /// Local training samples (the FedAvg weight).
    pub num_samples: u32,
    /// `θ_local − θ_global`, flat layout.
    pub delta: Vec<f32>,
}

/// A server-side aggregation rule.
pub trait Strategy: Send {
    /// Name shown in status and metrics.
    fn name(&self) -> &str;

    /// Local training parameters for `round`; the default sends the configured ones unchanged.
    fn configure_round(&mut self, _round: u64, defaults: &TrainParams) -> TrainParams {
        defaults.clone()
    }

    /// The next global parameters from `global` and the round's accepted updates (never empty).
    fn aggregate(&mut self, global: &[f32], updates: &[AcceptedUpdate]) -> Vec<f32>;
}

/// FedAvg: `θ ← θ + Σ_u (n_u / Σ n) Δ_u`.
#[derive(Debug, Clone, Default)]
pub struct FedAvg;

impl Strategy for FedAvg {
    fn name(&self) -> &str {
        "fedavg"
    }

    fn aggregate(&mut self, global: &[f32], updates: &[AcceptedUpdate]) -> Vec<f32> {
        let delta = weighted_mean_delta(updates, global.len());
        global.iter().zip(&delta).map(|(g, d)| g + d).collect()
    }
}

/// `Σ_u (n_u / Σ n) Δ_u`, accumulated in f64; zeros when there is no weight.
pub fn weighted_mean_delta(updates: &[AcceptedUpdate], len: usize) -> Vec<f32> {
    let total: f64 = updates.iter().map(|u| u.num_samples as f64).sum();
    let mut acc = vec![0f64; len];
    if total <= 0.0 {
        return vec![0.0; len];
    }
    for u in updates {
        let w = u.num_samples as f64 / total;
        for (a, d) in acc.iter_mut().zip(&u.delta) {
            *a += w * *d as f64;
        }
    }
    acc.into_iter().map(|v| v as f32).collect()
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
    pub fn new(inner: S, beta: f32, lr: f32) -> Result<Self, String> {
        if !((0.0..1.0).contains(&beta) && lr.is_finite() && lr > 0.0) {
            return Err(format!(
                "server momentum needs 0 <= beta < 1 and lr > 0, got beta {beta}, lr {lr}"
            ));
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

    fn configure_round(&mut self, round: u64, defaults: &TrainParams) -> TrainParams {
        self.inner.configure_round(round, defaults)
    }

    fn aggregate(&mut self, global: &[f32], updates: &[AcceptedUpdate]) -> Vec<f32> {
        let inner = self.inner.aggregate(global, updates);
        if self.velocity.len() != global.len() {
            self.velocity = vec![0.0; global.len()];
        }
        for ((v, next), g) in self.velocity.iter_mut().zip(&inner).zip(global) {
            *v = self.beta * *v + (next - g);
        }
        global
            .iter()
            .zip(&self.velocity)
            .map(|(g, v)| g + self.lr * v)
            .collect()
    }
}

impl Strategy for Box<dyn Strategy> {
    fn name(&self) -> &str {
        self.as_ref().name()
    }

    fn configure_round(&mut self, round: u64, defaults: &TrainParams) -> TrainParams {
        self.as_mut().configure_round(round, defaults)
    }

    fn aggregate(&mut self, global: &[f32], updates: &[AcceptedUpdate]) -> Vec<f32> {
        self.as_mut().aggregate(global, updates)
    }
}

/// The server side of a configuration: which strategy and its parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StrategyConfig {
    /// `fedavg`, `fedavgm` (FedAvg with server momentum 0.9 unless set) or `fedomg`.
    pub strategy: String,
    /// FedOMG's `κ`.
    pub kappa: f64,
    /// FedOMG's server learning rate, in FedAvg units.
    pub global_lr: f64,
    /// Server momentum `β` around the strategy; 0 disables it.
    pub server_momentum: f32,
    /// Server learning rate `η_s` of the momentum update.
    pub server_learning_rate: f32,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        Self {
            strategy: "fedavg".into(),
            kappa: 0.5,
            global_lr: 1.0,
            server_momentum: 0.0,
            server_learning_rate: 1.0,
        }
    }
}

impl StrategyConfig {
    /// Builds the strategy, rejecting unknown names and bad parameters.
    pub fn build(&self) -> Result<Box<dyn Strategy>, String> {
        let mut beta = self.server_momentum;
        let base: Box<dyn Strategy> = match self.strategy.as_str() {
            "fedavg" => Box::new(FedAvg),
            "fedavgm" => {
                if beta == 0.0 {
                    beta = 0.9;
                }
                Box::new(FedAvg)
            }
            "fedomg" => {
                if !(self.kappa.is_finite()
                    && self.kappa >= 0.0
                    && self.global_lr.is_finite()
                    && self.global_lr > 0.0)
                {
                    return Err(format!(
                        "fedomg needs kappa >= 0 and global_lr > 0, got {} and {}",
                        self.kappa, self.global_lr
                    ));
                }
                let config = crate::fedomg::FedOmgConfig {
                    kappa: self.kappa,
                    ..Default::default()
                };
                Box::new(crate::fedomg::FedOmg {
                    config,
                    global_lr: self.global_lr,
                })
            }
            other => {
                return Err(format!(
                    "unknown strategy {other:?}; available: fedavg, fedavgm, fedomg"
                ));
            }
        };
        if beta != 0.0 || self.server_learning_rate != 1.0 {
            Ok(Box::new(ServerMomentum::new(
                base,
                beta,
                self.server_learning_rate,
            )?))
        } else {
            Ok(base)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(client: &str, n: u32, delta: &[f32]) -> AcceptedUpdate {
        AcceptedUpdate {
            client: client.into(),
            num_samples: n,
            delta: delta.to_vec(),
        }
    }

    #[test]
    fn fedavg_weights_deltas_by_sample_count() {
        let updates = [update("a", 1, &[1.0, 0.0]), update("b", 3, &[0.0, 4.0])];
        let next = FedAvg.aggregate(&[10.0, 20.0], &updates);
        assert_eq!(next, vec![10.25, 23.0]);
    }

    #[test]
    fn fedavg_of_one_update_applies_it_exactly() {
        let next = FedAvg.aggregate(&[1.0, -1.0, 0.5], &[update("a", 7, &[0.5, 0.25, -0.5])]);
        assert_eq!(next, vec![1.5, -0.75, 0.0]);
    }

    #[test]
    fn zero_total_weight_leaves_model_unchanged() {
        let next = FedAvg.aggregate(&[1.0, 2.0], &[update("a", 0, &[5.0, 5.0])]);
        assert_eq!(next, vec![1.0, 2.0]);
    }

    #[test]
    fn server_momentum_with_zero_beta_and_unit_rate_is_the_inner_strategy() {
        let updates = [update("a", 1, &[1.0, 0.0]), update("b", 3, &[0.0, 4.0])];
        let mut m = ServerMomentum::new(FedAvg, 0.0, 1.0).unwrap();
        assert_eq!(
            m.aggregate(&[10.0, 20.0], &updates),
            FedAvg.aggregate(&[10.0, 20.0], &updates)
        );
    }

    #[test]
    fn server_momentum_accumulates_directions() {
        let mut m = ServerMomentum::new(FedAvg, 0.5, 2.0).unwrap();
        let step = [update("a", 1, &[1.0])];
        // v = 1, θ = 0 + 2·1 = 2; then v = 0.5 + 1 = 1.5, θ = 2 + 3 = 5.
        let once = m.aggregate(&[0.0], &step);
        assert_eq!(once, vec![2.0]);
        assert_eq!(m.aggregate(&once, &step), vec![5.0]);
        assert_eq!(m.velocity(), &[1.5]);
        assert!(ServerMomentum::new(FedAvg, 1.0, 1.0).is_err());
        assert!(ServerMomentum::new(FedAvg, 0.5, 0.0).is_err());
    }

    #[test]
    fn momentum_can_wrap_fedomg_and_bad_parameters_are_rejected() {
        let config = StrategyConfig {
            strategy: "fedomg".into(),
            server_momentum: 0.5,
            ..StrategyConfig::default()
        };
        assert_eq!(config.build().unwrap().name(), "fedomg+momentum");
        let bad = StrategyConfig {
            strategy: "fedomg".into(),
            kappa: -1.0,
            ..StrategyConfig::default()
        };
        assert!(bad.build().err().unwrap().contains("kappa"));
    }

    #[test]
    fn unknown_strategy_name_lists_the_available_ones() {
        let named = |name: &str| {
            StrategyConfig {
                strategy: name.into(),
                ..StrategyConfig::default()
            }
            .build()
        };
        let err = named("fedfoo").err().unwrap();
        assert!(err.contains("fedavg, fedavgm, fedomg"), "{err}");
        for name in ["fedavg", "fedavgm", "fedomg"] {
            assert_eq!(named(name).unwrap().name(), name);
        }
    }
}
