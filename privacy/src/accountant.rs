//! The Rényi DP accountant: composition over rounds and conversion to (ε, δ)
//! (`docs/algorithms.md §8`).
//!
//! The accountant keeps one RDP value per order; a round adds its per-order RDP (composition
//! of RDP is a sum, Mironov 2017, Proposition 1), and (ε, δ) is read off by minimising a
//! conversion over the orders.

use serde::{Deserialize, Serialize};

use crate::PrivacyError;
use crate::rdp;

/// The orders dp-accounting's `RdpAccountant` uses by default: 1.1 to 10.9 in steps of 0.1,
/// the integers 11 to 63, then 128, 256, 512 and 1024 (156 orders).
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (1..100).map(|x| 1.0 + f64::from(x) / 10.0).collect();
    orders.extend((11..64).map(f64::from));
    orders.extend([128.0, 256.0, 512.0, 1024.0]);
    orders
}

/// How the devices of a round are chosen, which decides the amplification by sampling.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Sampling {
    /// Each device joins independently with probability `rate` (add-or-remove-one neighbours).
    Poisson {
        /// The sampling probability `q ∈ [0, 1]`.
        rate: f64,
    },
    /// Exactly `sample` of `population` devices, uniformly without replacement (replace-one
    /// neighbours: the population size is public). Under replace-one a sum of deltas clipped to
    /// `C` has L2 sensitivity `2C`, so the noise multiplier composed with this sampling is the
    /// noise standard deviation over `2C` (`docs/algorithms.md §8`).
    FixedSize {
        /// Devices per round, `m ≤ population`.
        sample: u64,
        /// Devices that could be chosen, `n ≥ 1`.
        population: u64,
    },
}

impl Sampling {
    /// The sampling fraction `q` (`rate`, or `m / n`).
    pub fn fraction(&self) -> f64 {
        match *self {
            Sampling::Poisson { rate } => rate,
            Sampling::FixedSize { sample, population } => sample as f64 / population as f64,
        }
    }

    /// The neighbouring relation under which this sampling's bound holds.
    pub fn relation(&self) -> Neighbouring {
        match self {
            Sampling::Poisson { .. } => Neighbouring::AddOrRemoveOne,
            Sampling::FixedSize { .. } => Neighbouring::ReplaceOne,
        }
    }

    fn check(&self) -> Result<(), PrivacyError> {
        match *self {
            Sampling::Poisson { rate } if !(0.0..=1.0).contains(&rate) => {
                Err(PrivacyError::SamplingRate(rate))
            }
            Sampling::FixedSize { sample, population }
                if population == 0 || sample > population =>
            {
                Err(PrivacyError::FixedSize { sample, population })
            }
            _ => Ok(()),
        }
    }
}

/// Which pairs of data sets (here: sets of devices) the guarantee distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Neighbouring {
    /// One device present or absent (Poisson sampling).
    AddOrRemoveOne,
    /// One device's data replaced by another's, the population size fixed (fixed-size sampling).
    ReplaceOne,
}

/// The RDP-to-(ε, δ) conversion (`docs/algorithms.md §8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conversion {
    /// `ε = min_α ε(α) + ln(1/δ) / (α − 1)` (Mironov 2017, Proposition 3).
    Standard,
    /// `ε = min_α ε(α) + ln(1 − 1/α) − (ln δ + ln α) / (α − 1)` (Canonne, Kamath & Steinke
    /// 2020; Balle et al. 2020), never larger than the standard one for `α > 1.01`; the one
    /// dp-accounting and Opacus report.
    Improved,
}

/// An (ε, δ) guarantee read from the accountant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Guarantee {
    /// The ε for the requested δ (`+∞` when no order gives a finite bound).
    pub epsilon: f64,
    /// The δ it was asked for.
    pub delta: f64,
    /// The order α that attains the minimum (`0` when ε is 0 or +∞ at every order).
    pub order: f64,
    /// The conversion used.
    pub conversion: Conversion,
}

/// One entry of the accountant's history: `steps` rounds with the same sampling and noise.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Steps {
    /// How the devices were chosen.
    pub sampling: Sampling,
    /// The noise multiplier σ (noise standard deviation over the query's L2 sensitivity).
    pub noise_multiplier: f64,
    /// How many rounds.
    pub steps: u64,
}

/// A Rényi DP accountant for the subsampled Gaussian mechanism.
///
/// Serialises (with serde) to its orders, the accumulated RDP per order (an unbounded order is
/// written as `null`) and the history of composed steps, so a checkpoint restores it (exactly
/// with a format that round-trips f64; serde_json's default parser may differ in the last bit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Stored", into = "Stored")]
pub struct Accountant {
    orders: Vec<f64>,
    rdp: Vec<f64>,
    history: Vec<Steps>,
}

impl Default for Accountant {
    fn default() -> Self {
        Accountant::with_default_orders()
    }
}

impl Accountant {
    /// An accountant with nothing spent, at the given orders (each finite and `> 1`).
    pub fn new(orders: Vec<f64>) -> Result<Self, PrivacyError> {
        if orders.is_empty() {
            return Err(PrivacyError::Orders("no order".into()));
        }
        if let Some(bad) = orders.iter().find(|a| !(a.is_finite() && **a > 1.0)) {
            return Err(PrivacyError::Orders(format!(
                "order {bad} is not a finite number above 1"
            )));
        }
        let rdp = vec![0.0; orders.len()];
        Ok(Accountant {
            orders,
            rdp,
            history: Vec::new(),
        })
    }

    /// An accountant at [`default_orders`].
    pub fn with_default_orders() -> Self {
        Accountant::new(default_orders()).expect("the default orders are valid")
    }

    /// The orders α.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// The accumulated RDP at each order (same indices as [`Accountant::orders`]).
    pub fn rdp(&self) -> &[f64] {
        &self.rdp
    }

    /// The composed steps, consecutive steps with equal parameters merged.
    pub fn history(&self) -> &[Steps] {
        &self.history
    }

    /// The total number of composed steps (rounds).
    pub fn steps(&self) -> u64 {
        self.history.iter().map(|s| s.steps).sum()
    }

    /// The neighbouring relation of the composed steps (`None` before the first).
    pub fn relation(&self) -> Option<Neighbouring> {
        self.history.first().map(|s| s.sampling.relation())
    }

    /// The RDP of one step at each order, without composing it.
    pub fn step_rdp(
        &self,
        sampling: Sampling,
        noise_multiplier: f64,
    ) -> Result<Vec<f64>, PrivacyError> {
        sampling.check()?;
        if !(noise_multiplier >= 0.0 && noise_multiplier.is_finite()) {
            return Err(PrivacyError::NoiseMultiplier(noise_multiplier));
        }
        let q = sampling.fraction();
        let one = |alpha: f64| match sampling {
            Sampling::Poisson { .. } => rdp::poisson_gaussian(q, noise_multiplier, alpha),
            Sampling::FixedSize { .. } => rdp::fixed_size_gaussian(q, noise_multiplier, alpha),
        };
        Ok(self.orders.iter().map(|&a| one(a)).collect())
    }

    /// Composes `steps` rounds of the subsampled Gaussian mechanism.
    ///
    /// Refuses to mix Poisson and fixed-size steps: their bounds hold for different
    /// neighbouring relations, and so does not sum (dp-accounting refuses the same).
    pub fn compose(
        &mut self,
        sampling: Sampling,
        noise_multiplier: f64,
        steps: u64,
    ) -> Result<(), PrivacyError> {
        if let Some(relation) = self.relation()
            && relation != sampling.relation()
        {
            return Err(PrivacyError::MixedSampling);
        }
        let one = self.step_rdp(sampling, noise_multiplier)?;
        if steps == 0 {
            return Ok(());
        }
        for (total, r) in self.rdp.iter_mut().zip(&one) {
            *total += steps as f64 * r;
        }
        match self.history.last_mut() {
            Some(last)
                if last.sampling == sampling && last.noise_multiplier == noise_multiplier =>
            {
                last.steps += steps;
            }
            _ => self.history.push(Steps {
                sampling,
                noise_multiplier,
                steps,
            }),
        }
        Ok(())
    }

    /// Shorthand for [`Accountant::compose`] with Poisson sampling at rate `q`.
    pub fn compose_poisson(
        &mut self,
        q: f64,
        noise_multiplier: f64,
        steps: u64,
    ) -> Result<(), PrivacyError> {
        self.compose(Sampling::Poisson { rate: q }, noise_multiplier, steps)
    }

    /// ε spent so far for `delta`, by the improved conversion.
    pub fn epsilon(&self, delta: f64) -> Result<Guarantee, PrivacyError> {
        self.epsilon_with(delta, Conversion::Improved)
    }

    /// ε spent so far for `delta`, by the given conversion.
    pub fn epsilon_with(
        &self,
        delta: f64,
        conversion: Conversion,
    ) -> Result<Guarantee, PrivacyError> {
        convert(&self.orders, &self.rdp, delta, conversion)
    }

    /// ε (improved conversion) once `more` further rounds with this sampling and noise have run,
    /// leaving the accountant unchanged.
    pub fn epsilon_after(
        &self,
        sampling: Sampling,
        noise_multiplier: f64,
        more: u64,
        delta: f64,
    ) -> Result<Guarantee, PrivacyError> {
        let mut next = self.clone();
        next.compose(sampling, noise_multiplier, more)?;
        next.epsilon(delta)
    }

    /// The largest number of further rounds, at most `limit`, after which ε (improved
    /// conversion) is still at most `target_epsilon`: the coordinator may run exactly that many
    /// more before its `target_epsilon` would be exceeded. `0` when even one round exceeds it.
    pub fn rounds_within(
        &self,
        sampling: Sampling,
        noise_multiplier: f64,
        delta: f64,
        target_epsilon: f64,
        limit: u64,
    ) -> Result<u64, PrivacyError> {
        if let Some(relation) = self.relation()
            && relation != sampling.relation()
        {
            return Err(PrivacyError::MixedSampling);
        }
        let one = self.step_rdp(sampling, noise_multiplier)?;
        let eps_after = |n: u64| -> Result<f64, PrivacyError> {
            let total: Vec<f64> = self
                .rdp
                .iter()
                .zip(&one)
                .map(|(t, r)| t + n as f64 * r)
                .collect();
            Ok(convert(&self.orders, &total, delta, Conversion::Improved)?.epsilon)
        };
        // ε is non-decreasing in the number of rounds (each order's bound is), so bisect.
        if eps_after(0)? > target_epsilon {
            return Ok(0);
        }
        if eps_after(limit)? <= target_epsilon {
            return Ok(limit);
        }
        let (mut ok, mut over) = (0u64, limit);
        while over - ok > 1 {
            let mid = ok + (over - ok) / 2;
            if eps_after(mid)? <= target_epsilon {
                ok = mid;
            } else {
                over = mid;
            }
        }
        Ok(ok)
    }
}

/// Converts per-order RDP values to ε for `delta` (`docs/algorithms.md §8`).
///
/// For the improved conversion, as in dp-accounting: an order whose RDP `r` satisfies
/// `δ² > 1 − e^{−r}` gives ε = 0 (the bound through the KL divergence, `δ ≤ √(1 − e^{−KL})`),
/// orders at most 1.01 are skipped (the formula is unstable there), and a negative RDP (which
/// only rounding can produce) counts as 0.
pub fn convert(
    orders: &[f64],
    rdp: &[f64],
    delta: f64,
    conversion: Conversion,
) -> Result<Guarantee, PrivacyError> {
    if !(delta > 0.0 && delta < 1.0) {
        return Err(PrivacyError::Delta(delta));
    }
    if orders.len() != rdp.len() {
        return Err(PrivacyError::Orders(format!(
            "{} orders but {} RDP values",
            orders.len(),
            rdp.len()
        )));
    }
    let log_delta = delta.ln();
    let bound = |alpha: f64, r: f64| -> f64 {
        if r.is_nan() {
            return f64::INFINITY;
        }
        match conversion {
            Conversion::Standard => r.max(0.0) - log_delta / (alpha - 1.0),
            Conversion::Improved => {
                if r < 0.0 || delta * delta + (-r).exp_m1() > 0.0 {
                    0.0
                } else if alpha > 1.01 {
                    r + (-1.0 / alpha).ln_1p() - (delta * alpha).ln() / (alpha - 1.0)
                } else {
                    f64::INFINITY
                }
            }
        }
    };
    let mut best = (f64::INFINITY, 0.0);
    for (&alpha, &r) in orders.iter().zip(rdp) {
        let eps = bound(alpha, r);
        if eps < best.0 {
            best = (eps, alpha);
        }
    }
    Ok(Guarantee {
        epsilon: best.0.max(0.0),
        delta,
        order: best.1,
        conversion,
    })
}

/// The serialised form of an [`Accountant`]: `+∞` RDP values as `null` (JSON has no infinity).
#[derive(Serialize, Deserialize)]
struct Stored {
    orders: Vec<f64>,
    rdp: Vec<Option<f64>>,
    history: Vec<Steps>,
}

impl From<Accountant> for Stored {
    fn from(a: Accountant) -> Self {
        Stored {
            orders: a.orders,
            rdp: a
                .rdp
                .into_iter()
                .map(|r| r.is_finite().then_some(r))
                .collect(),
            history: a.history,
        }
    }
}

impl TryFrom<Stored> for Accountant {
    type Error = PrivacyError;

    fn try_from(s: Stored) -> Result<Self, PrivacyError> {
        let mut a = Accountant::new(s.orders)?;
        if s.rdp.len() != a.orders.len() {
            return Err(PrivacyError::Orders(format!(
                "{} orders but {} RDP values",
                a.orders.len(),
                s.rdp.len()
            )));
        }
        a.rdp = s
            .rdp
            .into_iter()
            .map(|r| r.unwrap_or(f64::INFINITY))
            .collect();
        a.history = s.history;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_orders_are_dp_accountings() {
        let o = default_orders();
        assert_eq!(o.len(), 156);
        assert_eq!(
            (o[0], o[8], o[98], o[99], o[151], o[155]),
            (1.1, 1.9, 10.9, 11.0, 63.0, 1024.0)
        );
        assert!(o.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn unsampled_gaussian_matches_its_closed_form() {
        // Without sampling, T rounds have RDP T·α/(2σ²); minimising the standard conversion over
        // all real α gives ε = ρ + 2√(ρ ln(1/δ)) with ρ = T/(2σ²) (Mironov 2017).
        let orders: Vec<f64> = (1..20_000).map(|i| 1.0 + f64::from(i) * 0.01).collect();
        let mut acc = Accountant::new(orders).unwrap();
        let (sigma, steps, delta): (f64, u64, f64) = (3.0, 50, 1e-5);
        acc.compose_poisson(1.0, sigma, steps).unwrap();
        for (&a, &r) in acc.orders().iter().zip(acc.rdp()) {
            assert!((r - 50.0 * a / 18.0).abs() <= 1e-12 * r);
        }
        let rho = steps as f64 / (2.0 * sigma * sigma);
        let want = rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt();
        let got = acc.epsilon_with(delta, Conversion::Standard).unwrap();
        assert!(
            got.epsilon >= want - 1e-9 && got.epsilon < want * 1.0001,
            "{got:?} vs {want}"
        );
        let best = 1.0 + ((1.0 / delta).ln() / rho).sqrt();
        assert!((got.order - best).abs() < 0.02, "{} vs {best}", got.order);
        let improved = acc.epsilon(delta).unwrap();
        assert!(improved.epsilon < got.epsilon);
        assert_eq!(improved.conversion, Conversion::Improved);
    }

    #[test]
    fn composition_adds_and_merges_history() {
        let mut one = Accountant::default();
        one.compose_poisson(0.02, 1.1, 1).unwrap();
        let mut many = Accountant::default();
        many.compose_poisson(0.02, 1.1, 30).unwrap();
        many.compose_poisson(0.02, 1.1, 70).unwrap();
        for (a, b) in one.rdp().iter().zip(many.rdp()) {
            assert!(
                (100.0 * a - b).abs() <= 1e-12 * b.abs().max(1e-300),
                "{a} {b}"
            );
        }
        assert_eq!(many.history().len(), 1);
        assert_eq!(many.steps(), 100);
        many.compose_poisson(0.05, 2.0, 10).unwrap();
        assert_eq!(many.history().len(), 2);
        assert_eq!(many.steps(), 110);
        let more = many.epsilon(1e-5).unwrap().epsilon;
        assert!(
            more > Accountant::default()
                .epsilon_after(Sampling::Poisson { rate: 0.02 }, 1.1, 100, 1e-5)
                .unwrap()
                .epsilon
        );
    }

    #[test]
    fn epsilon_grows_with_rounds_and_shrinks_with_noise() {
        let acc = Accountant::default();
        let p = Sampling::Poisson { rate: 0.1 };
        let e = |sigma, n| acc.epsilon_after(p, sigma, n, 1e-5).unwrap().epsilon;
        assert!(e(1.0, 10) < e(1.0, 100) && e(1.0, 100) < e(1.0, 1000));
        assert!(e(2.0, 100) < e(1.0, 100));
        assert_eq!(acc.epsilon(1e-5).unwrap().epsilon, 0.0);
    }

    #[test]
    fn rounds_within_stops_just_before_the_target() {
        let mut acc = Accountant::default();
        let p = Sampling::Poisson { rate: 0.05 };
        acc.compose(p, 1.0, 20).unwrap();
        let target = 3.0;
        let n = acc.rounds_within(p, 1.0, 1e-5, target, 1_000_000).unwrap();
        assert!(n > 0);
        assert!(acc.epsilon_after(p, 1.0, n, 1e-5).unwrap().epsilon <= target);
        assert!(acc.epsilon_after(p, 1.0, n + 1, 1e-5).unwrap().epsilon > target);
        assert_eq!(acc.rounds_within(p, 1.0, 1e-5, 0.01, 1000).unwrap(), 0);
        assert_eq!(acc.rounds_within(p, 1.0, 1e-5, 1e6, 1000).unwrap(), 1000);
    }

    #[test]
    fn fixed_size_sampling_is_accounted_apart() {
        let mut acc = Accountant::default();
        let f = Sampling::FixedSize {
            sample: 10,
            population: 100,
        };
        acc.compose(f, 1.0, 50).unwrap();
        assert_eq!(acc.relation(), Some(Neighbouring::ReplaceOne));
        assert_eq!(
            acc.compose_poisson(0.1, 1.0, 1),
            Err(PrivacyError::MixedSampling)
        );
        let e = acc.epsilon(1e-5).unwrap().epsilon;
        assert!(e.is_finite() && e > 0.0);
        let bad = Sampling::FixedSize {
            sample: 5,
            population: 4,
        };
        assert!(acc.compose(bad, 1.0, 1).is_err());
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut acc = Accountant::default();
        assert_eq!(
            acc.compose_poisson(1.5, 1.0, 1),
            Err(PrivacyError::SamplingRate(1.5))
        );
        assert!(acc.compose_poisson(0.5, -1.0, 1).is_err());
        assert!(acc.compose_poisson(0.5, f64::NAN, 1).is_err());
        assert!(acc.epsilon(0.0).is_err() && acc.epsilon(1.0).is_err());
        assert!(Accountant::new(vec![]).is_err());
        assert!(Accountant::new(vec![2.0, 1.0]).is_err());
        assert!(Accountant::new(vec![2.0, f64::INFINITY]).is_err());
        assert_eq!(acc.steps(), 0);
    }

    #[test]
    fn no_noise_means_no_privacy() {
        let mut acc = Accountant::default();
        acc.compose_poisson(0.1, 0.0, 1).unwrap();
        let g = acc.epsilon(1e-5).unwrap();
        assert_eq!(g.epsilon, f64::INFINITY);
    }

    #[test]
    fn serde_round_trip_keeps_infinite_orders() {
        let mut acc = Accountant::default();
        acc.compose_poisson(0.3, 0.5, 7).unwrap();
        acc.compose_poisson(0.3, 0.6, 3).unwrap();
        assert!(
            acc.rdp().iter().any(|r| r.is_infinite()),
            "expected an order whose series gives up"
        );
        let json = serde_json::to_string(&acc).unwrap();
        let back: Accountant = serde_json::from_str(&json).unwrap();
        // serde_json's default float parser may be one bit off; nothing more.
        assert_eq!(
            (back.orders(), back.history()),
            (acc.orders(), acc.history())
        );
        for (a, b) in back.rdp().iter().zip(acc.rdp()) {
            assert!(a == b || (a - b).abs() <= 1e-15 * b.abs(), "{a} {b}");
        }
        let (e1, e2) = (back.epsilon(1e-6).unwrap(), acc.epsilon(1e-6).unwrap());
        assert!((e1.epsilon - e2.epsilon).abs() <= 1e-14 * e2.epsilon && e1.order == e2.order);
        let broken = json.replacen("[1.1,", "[", 1);
        assert!(serde_json::from_str::<Accountant>(&broken).is_err());
    }
}
