//! From a configuration to a strategy: the closed sets of names (`strategy`, `solver`,
//! `robust`, one kebab-case spelling in TOML, on the command line and in JSON), the
//! [`StrategyConfig`] with its parameters, and [`StrategyConfig::build`], which checks them and
//! stacks the wrappers (robust rewrite inside, server momentum outside). No arithmetic here.

use super::dp::{CentralDp, DpFedAvg};
use super::fedomg::{FedOmg, FedOmgConfig, Solver, SolverKind};
use super::momentum::{MomentumError, ServerMomentum};
use super::names::closed_set;
use super::robust::{Robust, RobustError, RobustKind, RobustRule};
use super::{FedAvg, Strategy};

/// A strategy configuration whose parameters are out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildError {
    /// FedOMG's `κ` or server learning rate.
    #[error("fedomg needs kappa >= 0 and global_lr > 0, got {kappa} and {global_lr}")]
    FedOmg {
        /// The `κ` asked for.
        kappa: f64,
        /// The server learning rate asked for.
        global_lr: f64,
    },
    /// The robust rule's parameter.
    #[error(transparent)]
    Robust(#[from] RobustError),
    /// Server momentum's parameters.
    #[error(transparent)]
    Momentum(#[from] MomentumError),
    /// Central DP with FedOMG.
    #[error(
        "[privacy] mode = \"central\" cannot run with strategy = \"fedomg\": FedOMG weighs each \
         device by the direction of its own delta (their dot products), which a clipped and noised \
         sum does not reveal, and its weights would let one device change how much the others \
         count; use strategy = \"fedavg\" or \"fedavgm\""
    )]
    PrivateFedOmg,
    /// Central DP with a robust rule.
    #[error(
        "[privacy] mode = \"central\" cannot run with robust = \"{0}\": the robust rules rewrite \
         each delta by the others (the round's median norm, order statistics per value), so one \
         device moves the others' contributions and the sum's sensitivity is no longer the clip \
         norm; central DP's clipping already bounds every device's influence: set robust = \"none\""
    )]
    PrivateRobust(RobustKind),
}

closed_set! {
    /// Which server strategy (`strategy` in TOML, `--strategy` on the command line).
    pub enum StrategyKind("strategy") {
        /// Sample-weighted mean of the deltas.
        #[default]
        Fedavg = "fedavg",
        /// FedAvg with server momentum (β = 0.9 unless `server_momentum` says otherwise).
        Fedavgm = "fedavgm",
        /// FedOMG: on-server gradient matching (docs/algorithms.md §2).
        Fedomg = "fedomg",
    }
}

/// The server side of a configuration: which strategy and its parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct StrategyConfig {
    /// The server strategy: how a round's deltas are combined into the new head.
    pub strategy: StrategyKind,
    /// FedOMG's `κ`, ≥ 0: the size of the ball around the FedAvg direction it searches in
    /// (docs/algorithms.md §2); 0 reduces it to FedAvg. Used with `strategy = "fedomg"`.
    pub kappa: f64,
    /// FedOMG's server learning rate, in FedAvg units, > 0. Used with `strategy = "fedomg"`.
    pub global_lr: f64,
    /// FedOMG's solver of its weights. Used with `strategy = "fedomg"`.
    pub solver: SolverKind,
    /// Server momentum `β` around the strategy, in [0, 1); 0 disables it (`fedavgm` then
    /// takes 0.9).
    pub server_momentum: f32,
    /// Server learning rate `η_s` of the momentum update, > 0; 1 without momentum leaves the
    /// strategy's step as it is.
    pub server_learning_rate: f32,
    /// Robust rewrite of the deltas before the strategy, against broken or hostile updates.
    pub robust: RobustKind,
    /// The L2 norm bound of `robust = "clip"`, ≥ 0; 0 clips to the round's median norm.
    pub clip_norm: f64,
    /// The fraction of `robust = "trimmed-mean"`: of every coordinate's values, this fraction
    /// at each end is pulled in to the nearest kept value; in [0, 0.5).
    pub trim_fraction: f64,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        Self {
            strategy: StrategyKind::Fedavg,
            kappa: 0.5,
            global_lr: 1.0,
            solver: SolverKind::Reference,
            server_momentum: 0.0,
            server_learning_rate: 1.0,
            robust: RobustKind::None,
            clip_norm: 0.0,
            trim_fraction: 0.1,
        }
    }
}

impl StrategyConfig {
    /// Builds the strategy, rejecting unknown names and bad parameters.
    pub fn build(&self) -> Result<Box<dyn Strategy>, BuildError> {
        self.build_with(None)
    }

    /// Builds the strategy; with `private`, central DP-FedAvg takes FedAvg's place (inside server
    /// momentum, if any), drawing its noise from the given source. Central DP is refused with
    /// FedOMG and with a robust rule, with the reason.
    pub fn build_with(
        &self,
        private: Option<(CentralDp, fedge_privacy::GaussianNoise)>,
    ) -> Result<Box<dyn Strategy>, BuildError> {
        if private.is_some() {
            if self.strategy == StrategyKind::Fedomg {
                return Err(BuildError::PrivateFedOmg);
            }
            if self.robust != RobustKind::None {
                return Err(BuildError::PrivateRobust(self.robust));
            }
        }
        let fedavg = move || -> Box<dyn Strategy> {
            match private {
                Some((settings, noise)) => Box::new(DpFedAvg::new(settings, noise)),
                None => Box::new(FedAvg),
            }
        };
        let mut beta = self.server_momentum;
        let base: Box<dyn Strategy> = match self.strategy {
            StrategyKind::Fedavg => fedavg(),
            StrategyKind::Fedavgm => {
                if beta == 0.0 {
                    beta = 0.9;
                }
                fedavg()
            }
            StrategyKind::Fedomg => {
                if !(self.kappa.is_finite()
                    && self.kappa >= 0.0
                    && self.global_lr.is_finite()
                    && self.global_lr > 0.0)
                {
                    return Err(BuildError::FedOmg {
                        kappa: self.kappa,
                        global_lr: self.global_lr,
                    });
                }
                let config = FedOmgConfig {
                    kappa: self.kappa,
                    solver: Solver::of(self.solver),
                    ..Default::default()
                };
                Box::new(FedOmg {
                    config,
                    global_lr: self.global_lr,
                })
            }
        };
        let base = match RobustRule::of(self.robust, self.clip_norm, self.trim_fraction)? {
            Some(rule) => Box::new(Robust::new(base, rule)),
            None => base,
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
