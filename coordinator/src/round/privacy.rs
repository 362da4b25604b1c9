//! Central differential privacy in the round machine (`RoundConfig::privacy`,
//! docs/algorithms.md §8): how devices are drawn (Poisson or fixed-size), the number of
//! participants each round expects (what DP-FedAvg divides by), the accountant composed once per
//! aggregated round, the stop before `target_epsilon` would be passed, and the accountant's
//! saved form. The mechanism itself is the strategy's (`crate::strategy::dp`). No I/O.

use fedge_privacy::{Accountant, Sampling, Steps};
use rand::Rng;
use rand::seq::IteratorRandom;

use super::Rounds;
use super::saved::{SavedAccountant, SavedSampling, SavedSteps};
use super::types::{Output, Phase, PrivacySpent};
use crate::strategy::{CentralDp, SamplingKind};

/// The accountant and the open round's draw.
#[derive(Debug, Clone)]
pub(super) struct Ledger {
    settings: CentralDp,
    accountant: Accountant,
    /// The open round's sampling (as composed at its close) and expected participants.
    plan: Option<(Sampling, f64)>,
    /// `target_epsilon` would be passed by one more round: the federation finished.
    exhausted: bool,
}

impl Ledger {
    pub(super) fn new(settings: CentralDp) -> Self {
        Self {
            settings,
            accountant: Accountant::default(),
            plan: None,
            exhausted: false,
        }
    }
}

/// Draws larger than this many tries without a device fall back to one device chosen uniformly.
const MAX_EMPTY_DRAWS: usize = 1 << 20;

/// `fraction` as the decimal number the configuration wrote (`0.1`, not f32's
/// `0.100000001490116`), so the accounted rate is the configured one.
fn rate(fraction: f32) -> f64 {
    let fraction = fraction.clamp(0.0, 1.0);
    fraction.to_string().parse().unwrap_or(f64::from(fraction))
}

impl Rounds {
    /// The devices of a round under central DP with Poisson sampling: each eligible device
    /// independently with probability `fraction`, from the machine's seeded generator.
    ///
    /// **Choice**: a draw that selects nobody is drawn again (a round without participants
    /// would only publish noise, and the machine aggregates only received updates). The
    /// accountant assumes an unconditioned draw; the difference matters only when
    /// `fraction × online` is small enough for an empty draw to be likely (docs/privacy.md).
    pub(super) fn poisson_draw(&mut self, eligible: Vec<String>) -> Vec<String> {
        let q = rate(self.config.fraction);
        for _ in 0..MAX_EMPTY_DRAWS {
            let drawn: Vec<String> = eligible
                .iter()
                .filter(|_| self.rng.random_bool(q))
                .cloned()
                .collect();
            if !drawn.is_empty() {
                return drawn;
            }
        }
        eligible
            .into_iter()
            .choose(&mut self.rng)
            .into_iter()
            .collect()
    }

    /// Plans the next round under central DP, `wanted` of `online` devices for fixed-size
    /// sampling: its sampling for the accountant and its expected participants (`q × online`
    /// or `wanted`). Returns false, with the federation finished, when the round would take ε
    /// past `target_epsilon`. True without central DP.
    pub(super) fn plan_private_round(&mut self, wanted: usize, online: usize) -> bool {
        let fraction = self.config.fraction;
        let Some(ledger) = self.privacy.as_mut() else {
            return true;
        };
        let plan = match ledger.settings.sampling {
            SamplingKind::Poisson => {
                let q = rate(fraction);
                (Sampling::Poisson { rate: q }, q * online as f64)
            }
            SamplingKind::Fixed => (
                Sampling::FixedSize {
                    sample: wanted as u64,
                    population: online as u64,
                },
                wanted as f64,
            ),
        };
        ledger.plan = Some(plan);
        if !ledger.exhausted && ledger.fits(plan.0) {
            return true;
        }
        ledger.plan = None;
        self.finish_for_privacy();
        false
    }

    /// The open round's expected participants, for the strategy to divide by.
    pub(super) fn private_expected(&self) -> Option<f64> {
        self.privacy.as_ref()?.plan.map(|(_, expected)| expected)
    }

    /// The bound the aggregate guard compares the step with under central DP, in place of
    /// the longest raw delta (which would make the guard's verdict depend on one device's
    /// unclipped data): `C·(n + σ(√d + 10)) / E` for `n` updates of `d` values, the largest
    /// honest step with the noise's norm taken ten standard deviations out.
    pub(super) fn private_step_bound(&self, updates: usize) -> Option<f64> {
        let ledger = self.privacy.as_ref()?;
        let expected = ledger.plan.map_or(1.0, |(_, e)| e).max(f64::MIN_POSITIVE);
        let CentralDp {
            clip_norm,
            noise_multiplier,
            ..
        } = ledger.settings;
        let d = self.params.len() as f64;
        Some(clip_norm * (updates as f64 + noise_multiplier * (d.sqrt() + 10.0)) / expected)
    }

    /// The open round's noisy aggregate was computed: composes one step of its sampling, and
    /// marks the budget exhausted when one more such round would pass `target_epsilon`.
    pub(super) fn account_round(&mut self) {
        let Some(ledger) = self.privacy.as_mut() else {
            return;
        };
        let Some((sampling, _)) = ledger.plan.take() else {
            return;
        };
        let sigma = ledger.settings.accounted_noise_multiplier();
        if let Err(e) = ledger.accountant.compose(sampling, sigma, 1) {
            // Cannot happen with checked settings; a round that cannot be counted stops the
            // federation rather than run uncounted.
            tracing::error!(error = %e, "the privacy accountant refused the round");
            ledger.exhausted = true;
        }
        if !ledger.fits(sampling) {
            ledger.exhausted = true;
        }
    }

    /// True when the privacy budget stops the federation.
    pub(super) fn privacy_exhausted(&self) -> bool {
        self.privacy.as_ref().is_some_and(|l| l.exhausted)
    }

    pub(super) fn finish_for_privacy(&mut self) {
        if let Some(spent) = self.privacy_spent() {
            tracing::warn!(
                epsilon = spent.epsilon,
                delta = spent.delta,
                target_epsilon = spent.target_epsilon,
                rounds = spent.rounds,
                "privacy budget reached: one more round would pass target_epsilon; the \
                 federation is finished"
            );
        }
        if let Some(ledger) = self.privacy.as_mut() {
            ledger.exhausted = true;
        }
        self.phase = Phase::Finished;
        self.outputs.push_back(Output::StatusChanged);
        self.outputs.push_back(Output::Finished);
    }

    /// Central DP's spending so far: ε at the configured δ (the improved conversion), the
    /// rounds composed, the target and whether it stopped the federation. `None` without
    /// central DP.
    pub fn privacy_spent(&self) -> Option<PrivacySpent> {
        let ledger = self.privacy.as_ref()?;
        let delta = ledger.settings.delta;
        let epsilon = ledger
            .accountant
            .epsilon(delta)
            .map_or(f64::INFINITY, |g| g.epsilon);
        Some(PrivacySpent {
            epsilon,
            delta,
            target_epsilon: ledger.settings.target_epsilon,
            rounds: ledger.accountant.steps(),
            exhausted: ledger.exhausted,
        })
    }

    /// The accountant, when central DP is on.
    pub fn accountant(&self) -> Option<&Accountant> {
        self.privacy.as_ref().map(|l| &l.accountant)
    }

    /// The accountant's saved form for the checkpoint.
    pub(super) fn saved_privacy(&self) -> Option<SavedAccountant> {
        self.privacy.as_ref().map(|l| save(&l.accountant))
    }

    /// Restores the accountant from a checkpoint. A checkpoint without one restores nothing
    /// (the strategy's name already refuses a checkpoint of a federation without central DP);
    /// one with an accountant is refused without central DP or with the other sampling.
    pub(super) fn restore_privacy(
        &mut self,
        saved: Option<SavedAccountant>,
    ) -> Result<(), super::ResumeError> {
        let refuse = |why: String| Err(super::ResumeError::Privacy(why));
        match (self.privacy.as_mut(), saved) {
            (_, None) => Ok(()),
            (None, Some(_)) => refuse(
                "the checkpoint holds a privacy accountant but [privacy] mode is not \"central\"; \
                 a federation that spent ε keeps counting it"
                    .into(),
            ),
            (Some(ledger), Some(saved)) => {
                let accountant = restore(&saved).map_err(super::ResumeError::Privacy)?;
                let planned = match ledger.settings.sampling {
                    SamplingKind::Poisson => Sampling::Poisson { rate: 0.0 },
                    SamplingKind::Fixed => Sampling::FixedSize {
                        sample: 0,
                        population: 1,
                    },
                };
                if accountant
                    .relation()
                    .is_some_and(|r| r != planned.relation())
                {
                    return refuse(format!(
                        "the checkpoint's ε was spent with the other sampling; [privacy] \
                         sampling = \"{}\" cannot continue it (the two bounds hold for different \
                         neighbouring relations)",
                        ledger.settings.sampling
                    ));
                }
                ledger.accountant = accountant;
                Ok(())
            }
        }
    }
}

impl Ledger {
    /// Whether one more round with `sampling` keeps ε within the target (always without one).
    fn fits(&self, sampling: Sampling) -> bool {
        let Some(target) = self.settings.target_epsilon else {
            return true;
        };
        let sigma = self.settings.accounted_noise_multiplier();
        self.accountant
            .rounds_within(sampling, sigma, self.settings.delta, target, 1)
            .is_ok_and(|n| n >= 1)
    }
}

/// The accountant as plain values the checkpoint's binary format can hold.
fn save(accountant: &Accountant) -> SavedAccountant {
    SavedAccountant {
        orders: accountant.orders().to_vec(),
        rdp: accountant.rdp().to_vec(),
        history: accountant
            .history()
            .iter()
            .map(|s| SavedSteps {
                sampling: match s.sampling {
                    Sampling::Poisson { rate } => SavedSampling::Poisson { rate },
                    Sampling::FixedSize { sample, population } => {
                        SavedSampling::FixedSize { sample, population }
                    }
                },
                noise_multiplier: s.noise_multiplier,
                steps: s.steps,
            })
            .collect(),
    }
}

/// The accountant back from its saved form, bit for bit: through the accountant's own serde
/// form as a `serde_json::Value`, which holds each f64 as it is (no decimal text in between).
fn restore(saved: &SavedAccountant) -> Result<Accountant, String> {
    let history: Vec<Steps> = saved
        .history
        .iter()
        .map(|s| Steps {
            sampling: match s.sampling {
                SavedSampling::Poisson { rate } => Sampling::Poisson { rate },
                SavedSampling::FixedSize { sample, population } => {
                    Sampling::FixedSize { sample, population }
                }
            },
            noise_multiplier: s.noise_multiplier,
            steps: s.steps,
        })
        .collect();
    let rdp: Vec<Option<f64>> = saved
        .rdp
        .iter()
        .map(|r| r.is_finite().then_some(*r))
        .collect();
    if saved.rdp.iter().any(|r| r.is_nan() || *r < 0.0) {
        return Err("the saved accountant holds a negative or NaN RDP value".into());
    }
    let value = serde_json::json!({
        "orders": saved.orders,
        "rdp": rdp,
        "history": history,
    });
    serde_json::from_value(value).map_err(|e| format!("the saved accountant is invalid: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_accountant_comes_back_bit_for_bit() {
        let mut a = Accountant::default();
        a.compose(Sampling::Poisson { rate: 0.1 }, 1.1, 3).unwrap();
        a.compose(Sampling::Poisson { rate: 0.2 }, 0.0, 1).unwrap();
        assert!(a.rdp().iter().any(|r| r.is_infinite()));
        let back = restore(&save(&a)).unwrap();
        assert_eq!(back, a);
        let mut broken = save(&a);
        broken.rdp.pop();
        assert!(restore(&broken).is_err());
        broken = save(&a);
        broken.rdp[0] = f64::NAN;
        assert!(restore(&broken).is_err());
    }

    #[test]
    fn the_rate_is_the_written_fraction() {
        assert_eq!(rate(0.1), 0.1);
        assert_eq!(rate(1.0), 1.0);
        assert_eq!(rate(2.0), 1.0);
    }
}
