//! `[privacy]`: central differential privacy (DP-FedAvg with an accountant; docs/privacy.md,
//! docs/algorithms.md §8).
//!
//! ```toml
//! [privacy]
//! mode = "central"             # "off" (the default) or "central"
//! clip_norm = 1.0              # every device's delta is scaled to at most this L2 norm
//! noise_multiplier = 1.0       # noise of standard deviation noise_multiplier × clip_norm
//! delta = 1e-5                 # the δ of the (ε, δ) reported; below 1 / devices
//! target_epsilon = 8.0         # optional: finish before a round would pass this ε
//! sampling = "poisson"         # "poisson" (each device with probability fraction) or "fixed"
//! # seed = 7                   # tests and simulations only: reproducible noise
//! ```
//!
//! Central DP is refused, with the reason, with `strategy = "fedomg"`, a `robust` rule, the
//! FedDIM and FedDDL objectives and `role = "site"`.

use serde::{Deserialize, Serialize};

use super::Role;
use crate::strategy::{CentralDp, PrivacyMode, SamplingKind};

/// `[privacy]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PrivacySettings {
    /// Central differential privacy, or none.
    pub mode: PrivacyMode,
    /// `C`: the L2 norm every device's whole delta is clipped to, > 0 under central DP (with
    /// `adaptive_quantile`, the starting norm).
    pub clip_norm: f64,
    /// `σ`: the noise added once to the round's sum has standard deviation `σ × C`; > 0 under
    /// central DP.
    pub noise_multiplier: f64,
    /// The δ at which ε is reported and the target is checked, in (0, 1) and well below
    /// 1 / the number of devices.
    pub delta: f64,
    /// Finish the federation before a round would take ε past this, > 0; unset: run on.
    pub target_epsilon: Option<f64>,
    /// How devices are chosen for each round under central DP.
    pub sampling: SamplingKind,
    /// A fixed seed for the noise: for tests and simulations only, since anyone who knows it
    /// can remove the noise. Unset: drawn from the operating system.
    pub seed: Option<u64>,
    /// Adaptive clipping: the fraction `γ` of deltas the clip norm should leave unclipped
    /// (e.g. 0.5), in (0, 1); `clip_norm` is then the starting norm. Unset: a fixed clip norm.
    pub adaptive_quantile: Option<f64>,
    /// Adaptive clipping's `η` in `C ← C · exp(−η (b̃ − γ))`, > 0.
    pub adaptive_learning_rate: f64,
    /// Adaptive clipping's `σ_b`, the noise on the count of unclipped deltas: must be above
    /// `noise_multiplier / 2` with `adaptive_quantile`; about the expected devices per round / 20
    /// (Andrew et al. 2021).
    pub adaptive_count_noise: f64,
}

impl Default for PrivacySettings {
    fn default() -> Self {
        Self {
            mode: PrivacyMode::Off,
            clip_norm: 0.0,
            noise_multiplier: 0.0,
            delta: 1e-5,
            target_epsilon: None,
            sampling: SamplingKind::Poisson,
            seed: None,
            adaptive_quantile: None,
            adaptive_learning_rate: 0.2,
            adaptive_count_noise: 0.0,
        }
    }
}

/// What is wrong with `[privacy]` or what it is combined with; each message names the field
/// and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidPrivacy {
    /// An absolute bound that rejects updates by their norm.
    #[error(
        "max_update_norm = {0} with [privacy] mode = \"central\": set it to 0. Every delta is \
         clipped to clip_norm already, and a rejection by norm names the device and the reason \
         in the round's metrics: one bit about its data that no noise covers"
    )]
    UpdateNorm(f64),
    /// A value outside its domain.
    #[error("[privacy] {field} = {value}: {expected}")]
    Value {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
    /// FedDIM's or FedDDL's class statistics.
    #[error(
        "[privacy] mode = \"central\" cannot run with [train] objective = \"{0}\": its updates \
         carry each device's per-class statistics ({1}) beside the delta, and they reach the \
         coordinator and the global tensors every task carries without clipping or noise, so \
         they would reveal a device's data outside what the accountant counts; use \
         \"cross-entropy\", \"fedprox\", \"stable-fedadg\" or \"fedadg\""
    )]
    Statistics(fedge_wire::Objective, &'static str),
    /// Devices' feature summaries for pooled normalisation.
    #[error(
        "[privacy] mode = \"central\" cannot run with [train] feature_norm = \"{}\": its updates \
         carry each device's class counts and class means of its features beside the delta, \
         un-noised, and every task and release carries the pooled ones; use \"none\" (or \
         \"site\", whose statistics never leave the device)",
        .0.name()
    )]
    FeatureStatistics(fedge_wire::FeatureNorm),
    /// A site aggregator.
    #[error(
        "[privacy] mode = \"central\" cannot run on a site aggregator (role = \"site\"): its \
         aggregate is not released but sent upstream as one update, and the noise, the expected \
         count and the accountant belong where the model is released. Set [privacy] at the \
         global coordinator, which then protects each site as one participant (docs/privacy.md)"
    )]
    Site,
}

impl PrivacySettings {
    /// Central DP as a simulation runs it (`fedge demo`, `fedge eval`): noise multiplier,
    /// clip norm and δ, its noise seeded (see [`PrivacySettings::for_run`]).
    pub fn simulated(noise_multiplier: f64, clip_norm: f64, delta: f64) -> Self {
        Self {
            mode: PrivacyMode::Central,
            clip_norm,
            noise_multiplier,
            delta,
            seed: Some(0),
            ..Self::default()
        }
    }

    /// These settings with the noise seeded from a simulation's `seed`, so a run repeats.
    pub fn for_run(&self, seed: u64) -> Self {
        Self {
            seed: Some(seed ^ 0x5eed_d1ff_0000_0001),
            ..self.clone()
        }
    }

    /// Central DP's settings for the strategy and the round machine; `None` when off.
    pub fn central(&self) -> Option<CentralDp> {
        (self.mode == PrivacyMode::Central).then_some(CentralDp {
            clip_norm: self.clip_norm,
            noise_multiplier: self.noise_multiplier,
            delta: self.delta,
            target_epsilon: self.target_epsilon,
            sampling: self.sampling,
            adaptive: self
                .adaptive_quantile
                .map(|quantile| crate::strategy::dp::AdaptiveClip {
                    quantile,
                    learning_rate: self.adaptive_learning_rate,
                    count_noise: self.adaptive_count_noise,
                }),
        })
    }

    /// The noise source: seeded when `seed` is set, else from the operating system.
    pub fn noise(&self) -> fedge_privacy::GaussianNoise {
        match self.seed {
            Some(seed) => fedge_privacy::GaussianNoise::from_seed(seed),
            None => fedge_privacy::GaussianNoise::from_os_rng(),
        }
    }

    /// Checks the values and what central DP is combined with (the strategy's own refusals,
    /// FedOMG and robust rules, are `crate::strategy::StrategyConfig::build_with`'s).
    pub fn check(
        &self,
        train: &fedge_wire::TrainParams,
        role: Role,
        max_update_norm: f64,
    ) -> Result<(), InvalidPrivacy> {
        if self.mode == PrivacyMode::Off {
            return Ok(());
        }
        if max_update_norm > 0.0 {
            return Err(InvalidPrivacy::UpdateNorm(max_update_norm));
        }
        let value = |field, value: f64, ok: bool, expected| match ok {
            true => Ok(()),
            false => Err(InvalidPrivacy::Value {
                field,
                value,
                expected,
            }),
        };
        let (c, sigma, delta) = (self.clip_norm, self.noise_multiplier, self.delta);
        value(
            "clip_norm",
            c,
            c.is_finite() && c > 0.0,
            "must be a finite number > 0 (the L2 bound on each device's delta)",
        )?;
        value(
            "noise_multiplier",
            sigma,
            sigma.is_finite() && sigma > 0.0,
            "must be a finite number > 0 (0 adds no noise and gives no privacy: set mode = \"off\")",
        )?;
        value(
            "delta",
            delta,
            delta > 0.0 && delta < 1.0,
            "must be in (0, 1), well below 1 / the number of devices (1e-5 by default)",
        )?;
        if let Some(quantile) = self.adaptive_quantile {
            value(
                "adaptive_quantile",
                quantile,
                quantile > 0.0 && quantile < 1.0,
                "must be in (0, 1): the fraction of deltas left unclipped (0.5: the median)",
            )?;
            let rate = self.adaptive_learning_rate;
            value(
                "adaptive_learning_rate",
                rate,
                rate.is_finite() && rate > 0.0,
                "must be a finite number > 0 (0.2 by default)",
            )?;
            let count = self.adaptive_count_noise;
            value(
                "adaptive_count_noise",
                count,
                count.is_finite() && 2.0 * count > sigma,
                "must be above noise_multiplier / 2, or the count's noise alone would cost more \
                 than the budget noise_multiplier stands for; about the expected devices per \
                 round / 20",
            )?;
        }
        if let Some(target) = self.target_epsilon {
            value(
                "target_epsilon",
                target,
                target.is_finite() && target > 0.0,
                "must be a finite number > 0, or left out to run without a budget",
            )?;
        }
        use fedge_wire::Objective;
        let objective = train.objective;
        if train.feature_norm.pools() {
            return Err(InvalidPrivacy::FeatureStatistics(train.feature_norm));
        }
        match objective {
            Objective::FedDim => {
                return Err(InvalidPrivacy::Statistics(
                    objective,
                    "FedDIM: class counts and class means of its hidden features",
                ));
            }
            Objective::FedDdl => {
                return Err(InvalidPrivacy::Statistics(
                    objective,
                    "FedDDL: class counts and causal prototypes of its hidden features",
                ));
            }
            _ => {}
        }
        if role == Role::Site {
            return Err(InvalidPrivacy::Site);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::CoordinatorConfig;
    use crate::strategy::PrivacyMode;

    const HEAD: &str = "[head]\nfeatures = 4\nclasses = 2\n";
    const CENTRAL: &str =
        "[privacy]\nmode = \"central\"\nclip_norm = 1.0\nnoise_multiplier = 1.1\n";

    /// Loads a configuration of `top` keys, the head, `[privacy]` and `rest` sections.
    fn load(top: &str, privacy: &str, rest: &str) -> Result<CoordinatorConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let text = format!("federation = \"f\"\n{top}{HEAD}{privacy}{rest}");
        std::fs::write(&path, text).unwrap();
        CoordinatorConfig::load(Path::new(&path)).map_err(|e| e.to_string())
    }

    #[test]
    fn central_dp_reaches_the_strategy_and_the_round_machine() {
        let config = load(
            "strategy = \"fedavgm\"\n",
            &format!("{CENTRAL}seed = 5\nsampling = \"fixed\"\ntarget_epsilon = 4.0\n"),
            "",
        )
        .unwrap();
        assert_eq!(config.privacy.mode, PrivacyMode::Central);
        assert_eq!(config.privacy.delta, 1e-5);
        let round = config.round_config().privacy.unwrap();
        assert_eq!((round.clip_norm, round.noise_multiplier), (1.0, 1.1));
        assert_eq!(round.target_epsilon, Some(4.0));
        assert_eq!(round.sampling, crate::strategy::SamplingKind::Fixed);
        assert_eq!(
            config.build_strategy().unwrap().name(),
            "dp-fedavg+momentum"
        );
        let adaptive = format!("{CENTRAL}adaptive_quantile = 0.5\nadaptive_count_noise = 2.5\n");
        let config = load("", &adaptive, "").unwrap();
        let clip = config.round_config().privacy.unwrap().adaptive.unwrap();
        assert_eq!(
            (clip.quantile, clip.learning_rate, clip.count_noise),
            (0.5, 0.2, 2.5)
        );
        for (bad, said) in [
            (
                "adaptive_quantile = 1.5\nadaptive_count_noise = 2.5\n",
                "adaptive_quantile = 1.5",
            ),
            (
                "adaptive_quantile = 0.5\nadaptive_count_noise = 0.5\n",
                "above noise_multiplier / 2",
            ),
            ("adaptive_quantile = 0.5\n", "adaptive_count_noise = 0"),
        ] {
            let error = load("", &format!("{CENTRAL}{bad}"), "").unwrap_err();
            assert!(error.contains(said), "{error}");
        }
        // Unwritten, feature_norm is "none" under central DP and "pooled" without it.
        use fedge_wire::FeatureNorm;
        assert_eq!(config.train.feature_norm, FeatureNorm::None);
        let off = load("", "", "").unwrap();
        assert_eq!(off.train.feature_norm, FeatureNorm::Pooled);
        // metrics_listen takes a host name as well as an address.
        let named = load("metrics_listen = \"localhost:9465\"\n", "", "").unwrap();
        let addr = named.metrics_listen.unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == 9465, "{addr}");
        let error = load("metrics_listen = \"9465\"\n", "", "").unwrap_err();
        assert!(error.contains("host:port"), "{error}");
        assert!(off.round_config().privacy.is_none());
        assert_eq!(off.build_strategy().unwrap().name(), "fedavg");
    }

    #[test]
    fn refused_combinations_and_bad_values_give_the_reason() {
        for (top, privacy, rest, expected) in [
            (
                "strategy = \"fedomg\"\n",
                CENTRAL,
                "",
                "strategy = \"fedomg\": FedOMG weighs each device by the direction",
            ),
            ("robust = \"median\"\n", CENTRAL, "", "robust = \"median\""),
            ("robust = \"clip\"\n", CENTRAL, "", "set robust = \"none\""),
            (
                "",
                CENTRAL,
                "[train]\nobjective = \"feddim\"\n",
                "objective = \"feddim\": its updates carry each device's per-class statistics",
            ),
            (
                "",
                CENTRAL,
                "[train]\nobjective = \"fedddl\"\n",
                "causal prototypes",
            ),
            (
                "",
                CENTRAL,
                "[train]\nfeature_norm = \"balanced\"\n",
                "feature_norm = \"balanced\": its updates carry each device's class counts",
            ),
            (
                "role = \"site\"\n",
                CENTRAL,
                "[site]\nname = \"s\"\nfederation = \"g\"\n",
                "cannot run on a site aggregator (role = \"site\")",
            ),
            (
                "max_update_norm = 5.0\n",
                CENTRAL,
                "",
                "max_update_norm = 5 with [privacy] mode = \"central\": set it to 0",
            ),
            (
                "",
                "[privacy]\nmode = \"central\"\nnoise_multiplier = 1.0\n",
                "",
                "[privacy] clip_norm = 0",
            ),
            (
                "",
                "[privacy]\nmode = \"central\"\nclip_norm = 1.0\n",
                "",
                "[privacy] noise_multiplier = 0: must be a finite number > 0 (0 adds no noise",
            ),
            (
                "",
                &format!("{CENTRAL}delta = 1.5\n"),
                "",
                "[privacy] delta = 1.5",
            ),
            (
                "",
                &format!("{CENTRAL}target_epsilon = -1\n"),
                "",
                "[privacy] target_epsilon = -1",
            ),
            (
                "",
                "[privacy]\nmode = \"local\"\n",
                "",
                "expected `off` or `central`",
            ),
            (
                "",
                &format!("{CENTRAL}sampling = \"uniform\"\n"),
                "",
                "expected `poisson` or `fixed`",
            ),
            (
                "",
                &format!("{CENTRAL}adaptive = true\n"),
                "",
                "unknown key `adaptive` in [privacy]",
            ),
        ] {
            let err = load(top, privacy, rest).err().unwrap_or_default();
            assert!(err.contains(expected), "{top}{privacy}{rest}: {err}");
        }
        // The same combinations load without central DP.
        assert!(load("strategy = \"fedomg\"\n", "[privacy]\nmode = \"off\"\n", "").is_ok());
        assert!(load("", "", "[train]\nobjective = \"feddim\"\n").is_ok());
    }
}
