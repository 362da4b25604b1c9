//! Server strategies: how the round's accepted updates become the next global head.
//!
//! Shaped like Flower's strategies: a small synchronous trait, with the arithmetic in free
//! functions that have their own tests. FedAvg (ALGORITHMS.md §1) lives here; later
//! strategies plug in behind the same trait.

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
    /// FedOMG's objective at `Γ*`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
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

/// A server-side aggregation rule, shaped like Flower's `Strategy`.
///
/// Server-side evaluation on held-out data is the driver's [`crate::Evaluator`]: it needs data,
/// which strategies never see.
pub trait Strategy: Send {
    /// Name shown in status and metrics.
    fn name(&self) -> &str;

    /// The parameters of round 1, given the configured or seeded ones.
    fn initialize_parameters(&mut self, initial: Vec<f32>) -> Vec<f32> {
        initial
    }

    /// Local training parameters for `round`; the default sends the configured ones unchanged.
    fn configure_round(&mut self, _round: u64, defaults: &TrainParams) -> TrainParams {
        defaults.clone()
    }

    /// Whether the round should stream dot products between deltas (FedOMG).
    fn needs_dots(&self) -> bool {
        false
    }

    /// The solver, for strategies that have one (shown in the status).
    fn solver(&self) -> Option<&str> {
        None
    }

    /// The next global parameters from `global`, the round's accepted updates (never empty,
    /// finished) and the selected clients that did not count.
    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated;

    /// Buffers to save with the checkpoint.
    fn state(&self) -> StrategyState {
        StrategyState::new()
    }

    /// Restores [`Strategy::state`]; unknown or mis-sized buffers are an error.
    fn restore(&mut self, state: &StrategyState) -> Result<(), String> {
        match state.keys().next() {
            None => Ok(()),
            Some(key) => Err(format!("{} keeps no state, found {key:?}", self.name())),
        }
    }
}

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

    fn initialize_parameters(&mut self, initial: Vec<f32>) -> Vec<f32> {
        self.inner.initialize_parameters(initial)
    }

    fn configure_round(&mut self, round: u64, defaults: &TrainParams) -> TrainParams {
        self.inner.configure_round(round, defaults)
    }

    fn needs_dots(&self) -> bool {
        self.inner.needs_dots()
    }

    fn solver(&self) -> Option<&str> {
        self.inner.solver()
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
        report.momentum_norm = Some(crate::round::l2_norm(&self.velocity));
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

    fn restore(&mut self, state: &StrategyState) -> Result<(), String> {
        let mut inner = state.clone();
        self.velocity = inner.remove(MOMENTUM_KEY).unwrap_or_default();
        if self.velocity.iter().any(|v| !v.is_finite()) {
            self.velocity.clear();
            return Err("saved server momentum is not finite".into());
        }
        self.inner.restore(&inner)
    }
}

const MOMENTUM_KEY: &str = "server_momentum";

impl Strategy for Box<dyn Strategy> {
    fn name(&self) -> &str {
        self.as_ref().name()
    }

    fn initialize_parameters(&mut self, initial: Vec<f32>) -> Vec<f32> {
        self.as_mut().initialize_parameters(initial)
    }

    fn configure_round(&mut self, round: u64, defaults: &TrainParams) -> TrainParams {
        self.as_mut().configure_round(round, defaults)
    }

    fn needs_dots(&self) -> bool {
        self.as_ref().needs_dots()
    }

    fn solver(&self) -> Option<&str> {
        self.as_ref().solver()
    }

    fn aggregate(
        &mut self,
        global: &[f32],
        updates: &RoundUpdates,
        failures: &[Failure],
    ) -> Aggregated {
        self.as_mut().aggregate(global, updates, failures)
    }

    fn state(&self) -> StrategyState {
        self.as_ref().state()
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), String> {
        self.as_mut().restore(state)
    }
}

/// Which server strategy (`strategy` in TOML, `--strategy` on the command line).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Sample-weighted mean of the deltas.
    #[default]
    Fedavg,
    /// FedAvg with server momentum (β = 0.9 unless `server_momentum` says otherwise).
    Fedavgm,
    /// FedOMG: on-server gradient matching (docs/algorithms.md §2).
    Fedomg,
}

impl StrategyKind {
    /// Name in TOML, on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Fedavg => "fedavg",
            StrategyKind::Fedavgm => "fedavgm",
            StrategyKind::Fedomg => "fedomg",
        }
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = fedge_wire::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let all = [
            StrategyKind::Fedavg,
            StrategyKind::Fedavgm,
            StrategyKind::Fedomg,
        ];
        all.into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| fedge_wire::UnknownName::new("strategy", s, all.map(StrategyKind::name)))
    }
}

/// FedOMG's solver of the weights `Γ` (`solver`, `--solver`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum SolverKind {
    /// The authors' 20 SGD steps.
    #[default]
    Reference,
    /// Projected gradient until the Frank–Wolfe gap closes.
    Converged,
}

/// The robust rewrite of the deltas before the strategy (`robust`, `--robust`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum RobustKind {
    /// No rewrite.
    #[default]
    None,
    /// Scale deltas down to `clip_norm` (0: the round's median norm).
    Clip,
    /// Coordinate-wise winsorised trimmed mean (`trim_fraction` per side).
    TrimmedMean,
    /// Coordinate-wise median.
    Median,
}

/// The server side of a configuration: which strategy and its parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StrategyConfig {
    /// `fedavg`, `fedavgm` (FedAvg with server momentum 0.9 unless set) or `fedomg`.
    pub strategy: StrategyKind,
    /// FedOMG's `κ`.
    pub kappa: f64,
    /// FedOMG's server learning rate, in FedAvg units.
    pub global_lr: f64,
    /// FedOMG's solver: `reference` (the authors' 20 SGD steps) or `converged`.
    pub solver: SolverKind,
    /// Server momentum `β` around the strategy; 0 disables it.
    pub server_momentum: f32,
    /// Server learning rate `η_s` of the momentum update.
    pub server_learning_rate: f32,
    /// Robust rewrite of the deltas before the strategy: `none`, `clip`, `trimmed-mean` or
    /// `median` (see [`crate::robust`]).
    pub robust: RobustKind,
    /// `clip`'s norm bound; 0 clips to the round's median norm.
    pub clip_norm: f64,
    /// `trimmed-mean`'s fraction per side.
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
    pub fn build(&self) -> Result<Box<dyn Strategy>, String> {
        let mut beta = self.server_momentum;
        let base: Box<dyn Strategy> = match self.strategy {
            StrategyKind::Fedavg => Box::new(FedAvg),
            StrategyKind::Fedavgm => {
                if beta == 0.0 {
                    beta = 0.9;
                }
                Box::new(FedAvg)
            }
            StrategyKind::Fedomg => {
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
                    solver: crate::fedomg::Solver::of(self.solver),
                    ..Default::default()
                };
                Box::new(crate::fedomg::FedOmg {
                    config,
                    global_lr: self.global_lr,
                })
            }
        };
        let base = match crate::robust::RobustRule::parse(
            self.robust,
            self.clip_norm,
            self.trim_fraction,
        )? {
            Some(rule) => Box::new(crate::robust::Robust::new(base, rule)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn held(updates: &[(&str, u32, &[f32])]) -> RoundUpdates {
        RoundUpdates::from_updates(updates[0].2.len(), true, updates.iter().copied())
    }

    fn step(s: &mut impl Strategy, global: &[f32], updates: &[(&str, u32, &[f32])]) -> Vec<f32> {
        s.aggregate(global, &held(updates), &[]).params
    }

    #[test]
    fn fedavg_weights_deltas_by_sample_count() {
        let next = step(
            &mut FedAvg,
            &[10.0, 20.0],
            &[("a", 1, &[1.0, 0.0]), ("b", 3, &[0.0, 4.0])],
        );
        assert_eq!(next, vec![10.25, 23.0]);
    }

    #[test]
    fn fedavg_of_one_update_applies_it_exactly() {
        let next = step(
            &mut FedAvg,
            &[1.0, -1.0, 0.5],
            &[("a", 7, &[0.5, 0.25, -0.5])],
        );
        assert_eq!(next, vec![1.5, -0.75, 0.0]);
    }

    #[test]
    fn zero_total_weight_leaves_model_unchanged() {
        let next = step(&mut FedAvg, &[1.0, 2.0], &[("a", 0, &[5.0, 5.0])]);
        assert_eq!(next, vec![1.0, 2.0]);
    }

    #[test]
    fn server_momentum_with_zero_beta_and_unit_rate_is_the_inner_strategy() {
        let updates: [(&str, u32, &[f32]); 2] = [("a", 1, &[1.0, 0.0]), ("b", 3, &[0.0, 4.0])];
        let mut m = ServerMomentum::new(FedAvg, 0.0, 1.0).unwrap();
        assert_eq!(
            step(&mut m, &[10.0, 20.0], &updates),
            step(&mut FedAvg, &[10.0, 20.0], &updates)
        );
    }

    #[test]
    fn server_momentum_accumulates_directions() {
        let mut m = ServerMomentum::new(FedAvg, 0.5, 2.0).unwrap();
        let update: [(&str, u32, &[f32]); 1] = [("a", 1, &[1.0])];
        // v = 1, θ = 0 + 2·1 = 2; then v = 0.5 + 1 = 1.5, θ = 2 + 3 = 5.
        let once = step(&mut m, &[0.0], &update);
        assert_eq!(once, vec![2.0]);
        let twice = m.aggregate(&once, &held(&update), &[]);
        assert_eq!(twice.params, vec![5.0]);
        assert_eq!(twice.report.momentum_norm, Some(1.5));
        assert_eq!(m.velocity(), &[1.5]);
        assert!(ServerMomentum::new(FedAvg, 1.0, 1.0).is_err());
        assert!(ServerMomentum::new(FedAvg, 0.5, 0.0).is_err());
    }

    #[test]
    fn momentum_buffer_survives_a_save_and_restore() {
        let update: [(&str, u32, &[f32]); 1] = [("a", 1, &[1.0, -2.0])];
        let mut a = ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap();
        let theta = step(&mut a, &[0.0, 0.0], &update);
        let saved = a.state();
        assert_eq!(saved.get(MOMENTUM_KEY), Some(&vec![1.0, -2.0]));
        let mut b = ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap();
        b.restore(&saved).unwrap();
        assert_eq!(step(&mut a, &theta, &update), step(&mut b, &theta, &update));
        let mut bad = saved.clone();
        bad.insert(MOMENTUM_KEY.into(), vec![f32::NAN, 0.0]);
        assert!(b.restore(&bad).is_err());
        assert!(FedAvg.restore(&saved).is_err());
    }

    #[test]
    fn momentum_can_wrap_fedomg_and_bad_parameters_are_rejected() {
        let config = StrategyConfig {
            strategy: StrategyKind::Fedomg,
            server_momentum: 0.5,
            ..StrategyConfig::default()
        };
        let built = config.build().unwrap();
        assert_eq!(built.name(), "fedomg+momentum");
        assert!(built.needs_dots());
        let bad = StrategyConfig {
            strategy: StrategyKind::Fedomg,
            kappa: -1.0,
            ..StrategyConfig::default()
        };
        assert!(bad.build().err().unwrap().contains("kappa"));
    }

    #[test]
    fn unknown_names_fail_at_load_listing_the_valid_ones() {
        for (text, valid) in [
            ("strategy = \"fedfoo\"", "`fedavg`, `fedavgm`, `fedomg`"),
            ("solver = \"newton\"", "`reference` or `converged`"),
            (
                "robust = \"krum\"",
                "`none`, `clip`, `trimmed-mean`, `median`",
            ),
        ] {
            let err = toml::from_str::<StrategyConfig>(text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(valid), "{err}");
        }
        for kind in [
            StrategyKind::Fedavg,
            StrategyKind::Fedavgm,
            StrategyKind::Fedomg,
        ] {
            let text = format!("strategy = \"{}\"", kind.name());
            let config: StrategyConfig = toml::from_str(&text).unwrap();
            assert_eq!(config.build().unwrap().name(), kind.name());
            assert_eq!(kind.name().parse::<StrategyKind>(), Ok(kind));
        }
        let err = "fedfoo".parse::<StrategyKind>().unwrap_err().to_string();
        assert!(err.contains("fedavg, fedavgm, fedomg"), "{err}");
    }
}
