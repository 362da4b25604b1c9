//! Central DP-FedAvg (docs/algorithms.md §8): the coordinator clips every device's delta, sums
//! them with weight 1 each, adds Gaussian noise once to the sum and divides by the round's
//! *expected* number of participants. Also the closed sets of `[privacy]` (`mode`, `sampling`)
//! and the settings the strategy and the round machine share ([`CentralDp`]).
//!
//! **Choice**: every device weighs 1 (the plain DP-FedAvg of McMahan et al., 2018), whatever
//! sample count it claims: a weight a device states itself would have to be capped anyway to
//! bound its influence, and 1 is the cap that needs no configuration. The sample counts are
//! ignored, so a device cannot buy influence by inflating its count.
//!
//! The strategy does not account for privacy; the round machine composes its accountant once
//! per round it aggregates (the round machine). The noise source is given by the caller: seeded
//! for tests and simulations, from the operating system in a deployment.

use fedge_privacy::{GaussianNoise, clip_l2};

use super::names::closed_set;
use super::{Aggregated, AggregationReport, Failure, Strategy, apply};
use crate::updates::RoundUpdates;

closed_set! {
    /// Differential privacy on the coordinator (`[privacy] mode`).
    pub enum PrivacyMode("privacy mode") {
        /// No differential privacy: updates are aggregated as the strategy says.
        #[default]
        Off = "off",
        /// Central DP-FedAvg: clipped deltas, one Gaussian noise draw per round, an accountant.
        Central = "central",
    }
}

closed_set! {
    /// How devices are chosen each round under differential privacy (`[privacy] sampling`).
    pub enum SamplingKind("sampling") {
        /// Each online device independently with probability `fraction`.
        #[default]
        Poisson = "poisson",
        /// `max(⌈fraction × online⌉, min_clients)` devices uniformly without replacement.
        Fixed = "fixed",
    }
}

/// Central DP's settings, as the strategy and the round machine use them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CentralDp {
    /// `C`: every delta is scaled to an L2 norm of at most this.
    pub clip_norm: f64,
    /// `σ`: the noise added to the sum has standard deviation `σ × C` per value.
    pub noise_multiplier: f64,
    /// The δ of the (ε, δ) guarantee reported.
    pub delta: f64,
    /// The federation finishes before a round would take ε past this.
    pub target_epsilon: Option<f64>,
    /// How devices are chosen.
    pub sampling: SamplingKind,
    /// Adaptive clipping (Andrew et al. 2021): the clip norm follows a quantile of the
    /// devices' delta norms instead of staying at `clip_norm` (its starting value).
    pub adaptive: Option<AdaptiveClip>,
}

/// Adaptive clipping by the quantile method of Andrew, Thakkar, McMahan and Ramaswamy (2021,
/// "Differentially Private Learning with Adaptive Clipping"), docs/algorithms.md §8: each
/// round the coordinator counts the deltas no longer than the clip norm, noises the count, and
/// moves the norm geometrically towards the `quantile` of the norms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveClip {
    /// `γ`: the fraction of deltas the clip norm should leave unclipped.
    pub quantile: f64,
    /// `η`: `C ← C · exp(−η (b̃ − γ))`.
    pub learning_rate: f64,
    /// `σ_b`: the standard deviation of the noise on the count (of centred bits `b − ½`).
    pub count_noise: f64,
}

impl CentralDp {
    /// The noise multiplier the accountant composes: `σ` under Poisson sampling (add or remove
    /// one device moves the sum by at most `C`), `σ / 2` under fixed-size sampling (replacing
    /// one device moves it by up to `2C`; docs/algorithms.md §8).
    pub fn accounted_noise_multiplier(&self) -> f64 {
        match self.sampling {
            SamplingKind::Poisson => self.noise_multiplier,
            SamplingKind::Fixed => self.noise_multiplier / 2.0,
        }
    }

    /// The noise's standard deviation on the sum, `σ × C`, without adaptive clipping.
    pub fn noise_std(&self) -> f64 {
        self.noise_multiplier * self.clip_norm
    }

    /// The noise multiplier of the deltas' sum. With adaptive clipping the count is a second
    /// Gaussian release, and the two together must cost what `σ` alone is accounted for:
    /// `σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−½)`, finite while `2σ_b > σ` (docs/algorithms.md §8).
    pub fn delta_noise_multiplier(&self) -> f64 {
        match self.adaptive {
            None => self.noise_multiplier,
            Some(a) => {
                let left = self.noise_multiplier.powi(-2) - (2.0 * a.count_noise).powi(-2);
                if left > 0.0 {
                    left.powf(-0.5)
                } else {
                    f64::INFINITY
                }
            }
        }
    }
}

/// DP-FedAvg: `θ ← θ + (Σ_u clip(Δ_u, C) + N(0, (σC)² I)) / E`, with `E` the expected number of
/// participants (docs/algorithms.md §8); with adaptive clipping, `C` moves each round and the
/// sum's noise multiplier is [`CentralDp::delta_noise_multiplier`].
pub struct DpFedAvg {
    settings: CentralDp,
    noise: GaussianNoise,
    expected: Option<f64>,
    /// The clip norm of the next aggregation (moves with adaptive clipping).
    clip: f64,
}

/// The checkpoint key of the adaptive clip norm.
const CLIP_KEY: &str = "dp_clip_norm";

impl DpFedAvg {
    /// The strategy with these settings, drawing its noise from `noise`. The settings are
    /// checked where the configuration is read; a non-positive or non-finite clip norm
    /// here zeroes every delta.
    pub fn new(settings: CentralDp, noise: GaussianNoise) -> Self {
        Self {
            clip: settings.clip_norm,
            settings,
            noise,
            expected: None,
        }
    }
}

impl Strategy for DpFedAvg {
    fn name(&self) -> &str {
        "dp-fedavg"
    }

    fn expect_participants(&mut self, expected: f64) {
        self.expected = Some(expected);
    }

    fn state(&self) -> super::StrategyState {
        match self.settings.adaptive {
            Some(_) => [(CLIP_KEY.to_owned(), vec![self.clip as f32])].into(),
            None => Default::default(),
        }
    }

    fn restore(&mut self, state: &super::StrategyState) -> Result<(), super::StateError> {
        for (key, values) in state {
            match (key.as_str(), values.as_slice(), self.settings.adaptive) {
                (CLIP_KEY, [clip], Some(_)) if clip.is_finite() && *clip > 0.0 => {
                    self.clip = f64::from(*clip);
                }
                _ => {
                    return Err(super::StateError::Unexpected {
                        strategy: self.name().to_owned(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Clips, sums, noises and divides (docs/algorithms.md §8). Without an expected count
    /// from [`Strategy::expect_participants`] since the last aggregation (a caller outside the
    /// round machine), the observed count is used and reported as such.
    fn aggregate(&mut self, global: &[f32], updates: &RoundUpdates, _: &[Failure]) -> Aggregated {
        let m = global.len().min(updates.m());
        let mut sum = vec![0.0f64; global.len()];
        let mut row = vec![0.0f32; updates.m()];
        let mut clipped = 0;
        let clip_norm = self.clip;
        // Σ (b − ½), b = 1 for a delta no longer than the clip norm (adaptive clipping).
        let mut centred_bits = 0.0;
        for i in 0..updates.len() {
            updates.delta(i).widen_into(&mut row);
            match clip_l2(&mut row, clip_norm) {
                Ok(clip) => {
                    clipped += usize::from(clip.clipped);
                    centred_bits += if clip.norm <= clip_norm { 0.5 } else { -0.5 };
                }
                // A clip norm outside its domain: the delta counts as nothing.
                Err(_) => row.fill(0.0),
            }
            for (s, v) in sum[..m].iter_mut().zip(&row) {
                *s += f64::from(*v);
            }
        }
        let std = self.settings.delta_noise_multiplier() * clip_norm;
        if !(std > 0.0 && std.is_finite()) {
            // Fail closed: a noise scale that cannot be drawn (an adaptive clip norm grown to
            // infinity) must not let an un-noised sum out. The model stays where it was.
            tracing::error!(
                std,
                clip_norm,
                "central DP: the noise scale is not a finite positive number; the aggregate \
                 is withheld and the model kept"
            );
            return Aggregated {
                params: global.to_vec(),
                report: AggregationReport {
                    dp_expected: None,
                    dp_clip_norm: Some(clip_norm),
                    ..AggregationReport::default()
                },
            };
        }
        for s in &mut sum {
            *s += std * self.noise.sample();
        }
        let expected = self
            .expected
            .take()
            .filter(|e| *e > 0.0 && e.is_finite())
            .unwrap_or(updates.len().max(1) as f64);
        if let Some(adaptive) = self.settings.adaptive {
            let noisy = centred_bits + adaptive.count_noise * self.noise.sample();
            let unclipped = noisy / expected + 0.5;
            let step = (-adaptive.learning_rate * (unclipped - adaptive.quantile)).exp();
            if step.is_finite() {
                self.clip = (clip_norm * step).clamp(f64::MIN_POSITIVE, f64::MAX);
            }
        }
        let report = AggregationReport {
            dp_clipped: Some(clipped),
            dp_expected: Some(expected),
            dp_clip_norm: Some(clip_norm),
            ..AggregationReport::default()
        };
        Aggregated {
            params: apply(global, &sum, 1.0 / expected),
            report,
        }
    }
}
