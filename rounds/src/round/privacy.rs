//! Central differential privacy in the round machine (`RoundConfig::privacy`,
//! docs/algorithms.md §8): how devices are drawn (Poisson or fixed-size), the number of
//! participants each round expects (what DP-FedAvg divides by), the accountant composed once per
//! aggregated round, the stop before `target_epsilon` would be passed, and the accountant's
//! saved form. The mechanism itself is the strategy's (`crate::strategy::dp`). No I/O.

use fedge_privacy::{Accountant, Neighbouring, Sampling};
use rand::Rng;
use rand::seq::IteratorRandom;

use super::Rounds;
use super::ledger::{rate, restore, save};
use super::saved::SavedAccountant;
use super::types::{Output, Phase, PrivacySpent};
use crate::strategy::SamplingKind;

/// Draws larger than this many tries without a device fall back to one device chosen uniformly.
const MAX_EMPTY_DRAWS: usize = 1 << 20;

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
    pub(super) fn private_step_bound(&self, updates: usize, clip: Option<f64>) -> Option<f64> {
        let ledger = self.privacy.as_ref()?;
        let expected = ledger.plan.map_or(1.0, |(_, e)| e).max(f64::MIN_POSITIVE);
        // The clip norm the round used (adaptive clipping moves it), else the configured one.
        let clip_norm = clip.unwrap_or(ledger.settings.clip_norm);
        let noise_multiplier = ledger.settings.delta_noise_multiplier();
        let d = self.params.len() as f64;
        Some(clip_norm * (updates as f64 + noise_multiplier * (d.sqrt() + 10.0)) / expected)
    }

    /// The open round's noisy aggregate was computed: composes one step of its sampling, and
    /// marks the budget exhausted when one more such round would pass `target_epsilon`.
    pub(super) fn account_round(&mut self, selected: &std::collections::BTreeSet<String>) {
        let Some(ledger) = self.privacy.as_mut() else {
            return;
        };
        let Some((sampling, _)) = ledger.plan.take() else {
            return;
        };
        for device in selected {
            *ledger.selected.entry(device.clone()).or_default() += 1;
        }
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

    /// Central DP's spending so far: ε at the configured δ (the improved conversion) against
    /// an observer who knows who took part (the larger of the amplified ε and the most selected
    /// device's unamplified one), the amplified ε alone, the rounds composed, the target and
    /// whether it stopped the federation. `None` without central DP.
    pub fn privacy_spent(&self) -> Option<PrivacySpent> {
        let ledger = self.privacy.as_ref()?;
        let delta = ledger.settings.delta;
        let amplified = ledger
            .accountant
            .epsilon(delta)
            .map_or(f64::INFINITY, |g| g.epsilon);
        let most_selected = ledger.most_selected();
        Some(PrivacySpent {
            epsilon: amplified.max(ledger.device_epsilon(most_selected)),
            amplified_epsilon: amplified,
            most_selected,
            delta,
            target_epsilon: ledger.settings.target_epsilon,
            rounds: ledger.accountant.steps(),
            exhausted: ledger.exhausted,
        })
    }

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
    /// The rounds each device was selected in, for the checkpoint (empty without central DP).
    pub(super) fn saved_participation(&self) -> Vec<(String, u64)> {
        self.privacy.as_ref().map_or_else(Vec::new, |l| {
            l.selected.iter().map(|(d, n)| (d.clone(), *n)).collect()
        })
    }

    /// The rounds each device was selected in, from the checkpoint. A checkpoint written before
    /// they were kept has none: the devices' counts start from 0, and the amplified ε, kept
    /// whole, still bounds what is reported from below.
    pub(super) fn restore_participation(&mut self, saved: Vec<(String, u64)>) {
        if let Some(ledger) = self.privacy.as_mut() {
            ledger.selected = saved.into_iter().collect();
        }
    }

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
                let relation = match ledger.settings.sampling {
                    SamplingKind::Poisson => Neighbouring::AddOrRemoveOne,
                    SamplingKind::Fixed => Neighbouring::ReplaceOne,
                };
                if accountant.relation().is_some_and(|r| r != relation) {
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
