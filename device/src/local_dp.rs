//! Local differential privacy (`[privacy]` in a device profile; docs/privacy.md "Local DP",
//! docs/algorithms.md §8): the settings, and what the agent machine applies to every update
//! before it leaves the device.
//!
//! ```toml
//! [privacy]
//! local_noise_multiplier = 1.0   # σ: Gaussian noise of standard deviation σ·C per value
//! local_clip_norm = 0.5          # C: the delta is scaled to at most this L2 norm first
//! delta = 1e-5                   # the δ at which the device reports its ε
//! # seed = 7                     # tests and simulations only: reproducible noise
//! ```
//!
//! Without the section, updates leave as trained. With it, the delta (the whole flat vector,
//! head and, with Stable-FedADG, generator) is clipped to `C` and noised, whatever the objective
//! or the coordinator's strategy; objectives whose updates carry per-class statistics beside
//! the delta (FedDIM, FedDDL) are refused, since those statistics would leave un-noised.
//!
//! Each round the device answers is one Gaussian mechanism of sensitivity `C` and noise
//! multiplier `σ`, composed in the device's own accountant with sampling rate 1: the device
//! knows it took part, so its guarantee gets no amplification by sampling.
//!
//! This module uses nothing else of the crate: the profile loader, the set-up and the agent
//! machine all name it.

use fedge_privacy::{Accountant, Clip, GaussianNoise, PrivacyError, Sampling};
use fedge_wire::Objective;
use serde::{Deserialize, Serialize};

/// `[privacy]` in a device profile: local DP on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalPrivacy {
    /// `σ`: the noise added to every value of the clipped delta has standard deviation `σ × C`;
    /// > 0.
    pub local_noise_multiplier: f64,
    /// `C`: the L2 norm the whole delta is clipped to before the noise, > 0.
    pub local_clip_norm: f64,
    /// The δ at which the device reports the ε it has spent, in (0, 1).
    #[serde(default = "default_delta")]
    pub delta: f64,
    /// A fixed seed for the noise: tests and simulations only, since whoever knows it can
    /// subtract the noise. Unset: the noise source is seeded from the operating system.
    #[serde(default)]
    pub seed: Option<u64>,
}

fn default_delta() -> f64 {
    1e-5
}

/// A `[privacy]` value outside its domain, with the field named.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("[privacy] {field} = {value}: {expected}")]
pub struct InvalidLocalPrivacy {
    /// The field.
    pub field: &'static str,
    /// Its value.
    pub value: f64,
    /// What it must be.
    pub expected: &'static str,
}

/// The sampling the device's accountant composes each round with: rate 1, no amplification.
pub const SAMPLING: Sampling = Sampling::Poisson { rate: 1.0 };

impl LocalPrivacy {
    /// Refuses a non-positive or non-finite `σ` or `C`, and a `δ` outside `(0, 1)`.
    pub fn check(&self) -> Result<(), InvalidLocalPrivacy> {
        let positive = "must be a finite number > 0";
        let bad = |field, value, expected| {
            Err(InvalidLocalPrivacy {
                field,
                value,
                expected,
            })
        };
        let sigma = self.local_noise_multiplier;
        if !(sigma > 0.0 && sigma.is_finite()) {
            return bad("local_noise_multiplier", sigma, positive);
        }
        let clip = self.local_clip_norm;
        if !(clip > 0.0 && clip.is_finite()) {
            return bad("local_clip_norm", clip, positive);
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return bad("delta", self.delta, "must be in (0, 1)");
        }
        Ok(())
    }

    /// The device's noise source: seeded with `seed` when set, else from the operating
    /// system's entropy (the agent's driver calls this, never the machine).
    pub fn noise_source(&self) -> GaussianNoise {
        match self.seed {
            Some(seed) => GaussianNoise::from_seed(seed),
            None => GaussianNoise::from_os_rng(),
        }
    }
}

/// Local DP as the agent machine applies it: the settings and the noise source, injected by
/// the driver so the machine reads no entropy itself.
#[derive(Debug, Clone)]
pub struct LocalDp {
    settings: LocalPrivacy,
    noise: GaussianNoise,
}

impl LocalDp {
    /// Local DP with `settings` (checked at load), drawing noise from `noise`.
    pub fn new(settings: LocalPrivacy, noise: GaussianNoise) -> Self {
        LocalDp { settings, noise }
    }

    /// The settings.
    pub fn settings(&self) -> &LocalPrivacy {
        &self.settings
    }

    /// Clips `delta` to `C` and adds N(0, (σC)²) noise to every value.
    pub fn privatize(&mut self, delta: &mut [f32]) -> Result<Clip, PrivacyError> {
        let LocalPrivacy {
            local_noise_multiplier: sigma,
            local_clip_norm: clip,
            ..
        } = self.settings;
        fedge_privacy::privatize(delta, clip, sigma, &mut self.noise)
    }

    /// Composes one round (one update sent) into `accountant`.
    pub fn account(&self, accountant: &mut Accountant) -> Result<(), PrivacyError> {
        accountant.compose(SAMPLING, self.settings.local_noise_multiplier, 1)
    }

    /// The ε `accountant` has spent at the configured δ (`None` if it cannot say).
    pub fn epsilon(&self, accountant: &Accountant) -> Option<f64> {
        accountant
            .epsilon(self.settings.delta)
            .ok()
            .map(|g| g.epsilon)
    }
}

/// Why a task with `objective` cannot be trained under local DP, if it cannot: FedDIM's and
/// FedDDL's updates carry per-class statistics beside the delta, which local DP does not noise.
pub fn refusal(objective: Objective, round: u64) -> Option<String> {
    let what = match objective {
        Objective::FedDim => "class counts and class means of its features",
        Objective::FedDdl => "class counts and causal prototypes",
        _ => return None,
    };
    Some(format!(
        "refused round {round}: objective \"{objective}\" sends the device's {what} beside the \
         delta, and [privacy] local DP noises only the delta; this device sits the round out \
         rather than send them un-noised"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LocalPrivacy {
        LocalPrivacy {
            local_noise_multiplier: 1.0,
            local_clip_norm: 0.5,
            delta: 1e-5,
            seed: Some(3),
        }
    }

    #[test]
    fn values_outside_their_domain_name_the_field() {
        assert_eq!(settings().check(), Ok(()));
        for (field, changed) in [
            (
                "local_noise_multiplier",
                LocalPrivacy {
                    local_noise_multiplier: 0.0,
                    ..settings()
                },
            ),
            (
                "local_noise_multiplier",
                LocalPrivacy {
                    local_noise_multiplier: f64::NAN,
                    ..settings()
                },
            ),
            (
                "local_clip_norm",
                LocalPrivacy {
                    local_clip_norm: -1.0,
                    ..settings()
                },
            ),
            (
                "local_clip_norm",
                LocalPrivacy {
                    local_clip_norm: f64::INFINITY,
                    ..settings()
                },
            ),
            (
                "delta",
                LocalPrivacy {
                    delta: 1.0,
                    ..settings()
                },
            ),
        ] {
            let err = changed.check().unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().starts_with(&format!("[privacy] {field} =")));
        }
    }

    #[test]
    fn only_the_objectives_with_statistics_are_refused() {
        for objective in Objective::ALL {
            let refused = refusal(objective, 4);
            let expected = matches!(objective, Objective::FedDim | Objective::FedDdl);
            assert_eq!(refused.is_some(), expected, "{objective}");
        }
        let reason = refusal(Objective::FedDdl, 4).unwrap();
        assert!(
            reason.contains("round 4") && reason.contains("fedddl"),
            "{reason}"
        );
    }

    #[test]
    fn a_seed_makes_the_noise_reproducible() {
        let mut a = LocalDp::new(settings(), settings().noise_source());
        let mut b = LocalDp::new(settings(), settings().noise_source());
        let (mut x, mut y) = (vec![0.0f32; 16], vec![0.0f32; 16]);
        a.privatize(&mut x).unwrap();
        b.privatize(&mut y).unwrap();
        assert_eq!(x, y);
        assert!(x.iter().any(|v| *v != 0.0));
    }
}
