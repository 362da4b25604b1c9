//! Central DP's state in the round machine (docs/algorithms.md §8): the settings, the
//! accountant, the open round's planned sampling and expected participants, whether the budget
//! is spent; the accountant's saved form for the checkpoint. Plain values and arithmetic; the
//! machine's use of them is in `privacy`.

use std::collections::BTreeMap;

use fedge_privacy::{Accountant, Sampling, Steps};

use super::saved::{SavedAccountant, SavedSampling, SavedSteps};
use crate::strategy::CentralDp;

/// The accountant and the open round's draw.
#[derive(Debug, Clone)]
pub(super) struct Ledger {
    pub(super) settings: CentralDp,
    pub(super) accountant: Accountant,
    /// The open round's sampling (as composed at its close) and expected participants.
    pub(super) plan: Option<(Sampling, f64)>,
    /// `target_epsilon` would be passed by one more round: the federation finished.
    pub(super) exhausted: bool,
    /// The accounted rounds each device was selected in. Round tasks name the selected devices
    /// and every device can read them, so amplification by subsampling does not hold against
    /// the audience ε is reported to: a device's ε is that of the Gaussian mechanism, composed
    /// once per round it was in.
    pub(super) selected: BTreeMap<String, u64>,
}

impl Ledger {
    /// Nothing spent yet, no round planned.
    pub(super) fn new(settings: CentralDp) -> Self {
        Self {
            settings,
            accountant: Accountant::default(),
            plan: None,
            exhausted: false,
            selected: BTreeMap::new(),
        }
    }

    /// The most rounds any one device was selected in.
    pub(super) fn most_selected(&self) -> u64 {
        self.selected.values().copied().max().unwrap_or(0)
    }

    /// ε at δ of a device selected in `rounds` rounds, with its participation known: the
    /// Gaussian mechanism composed `rounds` times, no amplification.
    pub(super) fn device_epsilon(&self, rounds: u64) -> f64 {
        if rounds == 0 {
            return 0.0;
        }
        let mut alone = Accountant::default();
        let sigma = self.settings.accounted_noise_multiplier();
        match alone.compose(Sampling::Poisson { rate: 1.0 }, sigma, rounds) {
            Ok(()) => alone
                .epsilon(self.settings.delta)
                .map_or(f64::INFINITY, |g| g.epsilon),
            Err(_) => f64::INFINITY,
        }
    }

    /// Whether one more round with `sampling` keeps ε within the target (always without one):
    /// the amplified ε of the federation, and the ε of the most selected device should it be
    /// selected once more.
    pub(super) fn fits(&self, sampling: Sampling) -> bool {
        let Some(target) = self.settings.target_epsilon else {
            return true;
        };
        let sigma = self.settings.accounted_noise_multiplier();
        let amplified = self
            .accountant
            .rounds_within(sampling, sigma, self.settings.delta, target, 1)
            .is_ok_and(|n| n >= 1);
        amplified && self.device_epsilon(self.most_selected() + 1) <= target
    }
}

/// `fraction` as the decimal number the configuration wrote (`0.1`, not f32's
/// `0.100000001490116`), so the accounted rate is the configured one.
pub(super) fn rate(fraction: f32) -> f64 {
    let fraction = fraction.clamp(0.0, 1.0);
    fraction.to_string().parse().unwrap_or(f64::from(fraction))
}

/// The accountant as plain values the checkpoint's binary format can hold.
pub(super) fn save(accountant: &Accountant) -> SavedAccountant {
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
pub(super) fn restore(saved: &SavedAccountant) -> Result<Accountant, String> {
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
