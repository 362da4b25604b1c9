//! Rényi DP of one step of the subsampled Gaussian mechanism (`docs/algorithms.md §8`).
//!
//! Every function here returns the RDP `ε(α)` of a single step at one order `α > 1`, for a
//! mechanism that adds Gaussian noise of standard deviation `σ · Δ` to a query of L2
//! sensitivity `Δ` after sampling the population with rate `q`. Sums, products and binomial
//! coefficients are kept in log space so that orders up to 1024 neither overflow nor underflow.
//!
//! Sources (formulas only; the code is written for fedge):
//! - Poisson sampling: I. Mironov, K. Talwar, L. Zhang, *Rényi Differential Privacy of the
//!   Sampled Gaussian Mechanism*, 2019, §3.3 (integer orders by the binomial expansion,
//!   fractional orders by the two-sided series with `erfc` tails).
//! - Sampling without replacement: Y.-X. Wang, B. Balle, S. Kasiviswanathan, *Subsampled Rényi
//!   Differential Privacy and Analytical Moments Accountant*, AISTATS 2019, Theorem 27, with
//!   the interpolation of its Corollary 10 between integer orders.
//!
//! Numerical choices follow the reference implementation the tests compare with, Google's
//! dp-accounting (`dp_accounting.rdp`), so that the two agree to rounding.

/// The most terms the fractional-order series may take before the order is given up on.
const MAX_SERIES_TERMS: usize = 1000;

/// Above this order the without-replacement bound skips its forward differences (they cost
/// `O(α²)`), keeping only the cruder of its two bounds per term, as dp-accounting does.
const MAX_EXACT_WOR_ORDER: u64 = 256;

/// `ln(eᵃ + eᵇ)` without overflow; `-∞` is the log of zero.
pub(crate) fn log_add(a: f64, b: f64) -> f64 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// A real number held as its sign and the log of its magnitude.
#[derive(Clone, Copy, Debug)]
struct Signed {
    /// `true` for a value ≥ 0.
    positive: bool,
    /// `ln |value|`, `-∞` for zero.
    log_mag: f64,
}

impl Signed {
    /// `self − other`, computed on magnitudes in log space.
    fn minus(self, other: Signed) -> Signed {
        if self.positive != other.positive {
            // Opposite signs: the magnitudes add and the result takes `self`'s sign.
            return Signed {
                positive: self.positive,
                log_mag: log_add(self.log_mag, other.log_mag),
            };
        }
        // Same sign: |self| − |other| decides, then the common sign applies.
        let (larger_is_self, log_mag) = if self.log_mag > other.log_mag {
            (
                true,
                self.log_mag + (-(other.log_mag - self.log_mag).exp()).ln_1p(),
            )
        } else if self.log_mag < other.log_mag {
            (
                false,
                other.log_mag + (-(self.log_mag - other.log_mag).exp()).ln_1p(),
            )
        } else {
            (true, f64::NEG_INFINITY)
        };
        Signed {
            positive: larger_is_self == self.positive,
            log_mag,
        }
    }
}

/// `ln |C(n, k)|`, the generalised binomial coefficient `Γ(n+1) / (Γ(k+1) Γ(n−k+1))`, which
/// for a fractional `n` and `k > n + 1` has a negative Gamma argument in the denominator.
fn log_binomial(n: f64, k: f64) -> f64 {
    libm::lgamma_r(n + 1.0).0 - libm::lgamma_r(k + 1.0).0 - libm::lgamma_r(n - k + 1.0).0
}

/// `ln erfc(x)`, accurate far into the upper tail where `erfc` itself underflows.
pub(crate) fn log_erfc(x: f64) -> f64 {
    if x < 20.0 {
        return libm::erfc(x).ln();
    }
    // erfc(x) = e^{−x²} / (x √π) · Σₖ (−1)ᵏ (2k−1)!! / (2x²)ᵏ (asymptotic series); at x ≥ 20
    // the seventh term is below 1e-13 of the first.
    let inv = 1.0 / (2.0 * x * x);
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..7 {
        term *= -((2 * k - 1) as f64) * inv;
        sum += term;
    }
    -x * x - (x * std::f64::consts::PI.sqrt()).ln() + sum.ln()
}

/// The cases both samplings share: nobody sampled (`0`), no noise or an infinite order
/// (`+∞`), everybody sampled (the plain Gaussian mechanism, `α / (2σ²)`).
fn limit_cases(q: f64, sigma: f64, alpha: f64) -> Option<f64> {
    if q == 0.0 {
        Some(0.0)
    } else if sigma == 0.0 || alpha.is_infinite() {
        Some(f64::INFINITY)
    } else if q == 1.0 {
        Some(alpha / (2.0 * sigma * sigma))
    } else {
        None
    }
}

/// RDP at order `alpha` of one step of the Gaussian mechanism with noise multiplier `sigma`
/// after Poisson sampling with rate `q` (`docs/algorithms.md §8`).
///
/// Returns `0` for `q = 0`, `+∞` for `sigma = 0`, `α / (2σ²)` for `q = 1`, and `+∞` when the
/// series of a fractional order does not converge within 1000 terms (the order is then useless,
/// not wrong). The caller checks `0 ≤ q ≤ 1`, `sigma ≥ 0` and `alpha > 1`.
pub fn poisson_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    if let Some(rdp) = limit_cases(q, sigma, alpha) {
        return rdp;
    }
    let log_a = if alpha.fract() == 0.0 {
        poisson_log_a_integer(q, sigma, alpha)
    } else {
        poisson_log_a_fractional(q, sigma, alpha)
    };
    log_a / (alpha - 1.0)
}

/// `ln A_α` for an integer `α`: `A_α = Σᵢ C(α,i) qⁱ (1−q)^{α−i} e^{(i²−i)/(2σ²)}`, `i = 0..=α`.
fn poisson_log_a_integer(q: f64, sigma: f64, alpha: f64) -> f64 {
    let log_q = q.ln();
    let log_1mq = (-q).ln_1p();
    let two_var = 2.0 * sigma * sigma;
    let n = alpha as u64;
    let mut acc = f64::NEG_INFINITY;
    for i in 0..=n {
        let i = i as f64;
        let term =
            log_binomial(alpha, i) + i * log_q + (alpha - i) * log_1mq + (i * i - i) / two_var;
        acc = log_add(acc, term);
    }
    acc
}

/// `ln A_α` for a fractional `α`, by the series that splits the defining integral at
/// `z₀ = σ² ln(1/q − 1) + ½` into a lower part (terms in `i`) and an upper part (terms in
/// `j = α − i`), each term weighted by a Gaussian tail `½ erfc(·)`.
///
/// **Choice** (as dp-accounting 0.6): terms are added by magnitude. From `i = ⌈α⌉ + 1` on the
/// generalised binomial coefficients alternate in sign, so this sums an upper bound of the
/// series, never less than `A_α`: the accountant stays conservative. The sum stops when both
/// parts' terms are decreasing and 30 nats below the running total; a series that has not
/// stopped after 1000 terms yields `+∞`.
fn poisson_log_a_fractional(q: f64, sigma: f64, alpha: f64) -> f64 {
    let log_q = q.ln();
    let log_1mq = (-q).ln_1p();
    let two_var = 2.0 * sigma * sigma;
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let scale = std::f64::consts::SQRT_2 * sigma;
    let log_half = 0.5f64.ln();

    let (mut lower, mut upper) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let (mut prev_lower, mut prev_upper) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for step in 0..MAX_SERIES_TERMS {
        let i = step as f64;
        let j = alpha - i;
        let log_coef = log_binomial(alpha, i);
        let term_lower = log_coef
            + i * log_q
            + j * log_1mq
            + (i * i - i) / two_var
            + log_half
            + log_erfc((i - z0) / scale);
        let term_upper = log_coef
            + j * log_q
            + i * log_1mq
            + (j * j - j) / two_var
            + log_half
            + log_erfc((z0 - j) / scale);
        lower = log_add(lower, term_lower);
        upper = log_add(upper, term_upper);
        let total = log_add(lower, upper);
        if term_lower < prev_lower
            && term_upper < prev_upper
            && term_lower.max(term_upper) < total - 30.0
        {
            return total;
        }
        prev_lower = term_lower;
        prev_upper = term_upper;
    }
    f64::INFINITY
}

/// RDP at order `alpha` of one step of the Gaussian mechanism with noise multiplier `sigma`
/// after sampling a fixed fraction `q = m / n` of the population without replacement, under
/// the replace-one neighbouring relation (`docs/algorithms.md §8`).
///
/// Integer orders use the bound of Wang, Balle & Kasiviswanathan (2019, Theorem 27); a
/// fractional order interpolates linearly between the bound's cumulant at `⌊α⌋` and `⌈α⌉`
/// (their Corollary 10), which the convexity of the cumulant makes an upper bound.
/// Returns `0` for `q = 0`, `+∞` for `sigma = 0` and `α / (2σ²)` for `q = 1`. The caller
/// checks `0 ≤ q ≤ 1`, `sigma ≥ 0` and `alpha > 1`.
pub fn fixed_size_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    if let Some(rdp) = limit_cases(q, sigma, alpha) {
        return rdp;
    }
    if alpha.fract() == 0.0 {
        return wor_log_moment(q, sigma, alpha as u64) / (alpha - 1.0);
    }
    let below = alpha.floor();
    let t = alpha - below;
    let at_below = wor_log_moment(q, sigma, below as u64);
    let at_above = wor_log_moment(q, sigma, below as u64 + 1);
    ((1.0 - t) * at_below + t * at_above) / (alpha - 1.0)
}

/// `(α − 1) ε'(α)` of Theorem 27 for an integer `α`: the log of
/// `1 + q² C(α,2) min{4(e^{ε(2)} − 1), 2e^{ε(2)}} + Σ_{i=3}^{α} qⁱ C(α,i) min{4 √(Δ^{2⌊i/2⌋} Δ^{2⌈i/2⌉}), 2 e^{(i−1)ε(i)}}`,
/// where `ε(a) = a / (2σ²)` is the Gaussian's RDP and `Δˡ` the `l`-th forward difference at 0
/// of `k ↦ e^{(k−1)ε(k)}`.
fn wor_log_moment(q: f64, sigma: f64, alpha: u64) -> f64 {
    if alpha <= 1 {
        return 0.0;
    }
    let two_var = 2.0 * sigma * sigma;
    // (k − 1) ε(k) = (k − 1) k / (2σ²), the Gaussian's log moment at k − 1.
    let cumulant = |k: f64| (k - 1.0) * k / two_var;
    let log_q = q.ln();
    let a = alpha as f64;
    let (ln2, ln4) = (2f64.ln(), 4f64.ln());

    let eps2 = 2.0 / two_var;
    let log_expm1_eps2 = eps2 + (-(-eps2).exp()).ln_1p();
    let mut acc = 0.0; // ln 1
    acc = log_add(
        acc,
        2.0 * log_q + log_binomial(a, 2.0) + (ln4 + log_expm1_eps2).min(eps2 + ln2),
    );
    let diffs = if alpha <= MAX_EXACT_WOR_ORDER {
        forward_differences(alpha as usize + 1, cumulant)
    } else {
        Vec::new()
    };
    for i in 3..=alpha {
        let crude = ln2 + cumulant(i as f64);
        let bound = if diffs.is_empty() {
            crude
        } else {
            let lo = diffs[2 * (i as usize / 2)];
            let hi = diffs[2 * (i as usize).div_ceil(2)];
            (ln4 + 0.5 * (lo + hi)).min(crude)
        };
        acc = log_add(acc, bound + i as f64 * log_q + log_binomial(a, i as f64));
    }
    acc
}

/// `ln |Δˡ f(0)|` for `l = 0..=order` (index `l`), where `f(k) = e^{log_f(k)}` and `Δ` is the
/// forward difference, computed by repeated differencing in signed log space.
fn forward_differences(order: usize, log_f: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut level: Vec<Signed> = (0..=order)
        .map(|k| Signed {
            positive: true,
            log_mag: log_f(k as f64),
        })
        .collect();
    let mut out = Vec::with_capacity(order + 1);
    out.push(level[0].log_mag);
    for _ in 0..order {
        for j in 0..level.len() - 1 {
            level[j] = level[j + 1].minus(level[j]);
        }
        level.pop();
        out.push(level[0].log_mag);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct evaluation of the integer-order sum in plain arithmetic, for small orders.
    fn direct_integer(q: f64, sigma: f64, alpha: u32) -> f64 {
        let mut sum = 0.0;
        let mut binom = 1.0;
        for i in 0..=alpha {
            if i > 0 {
                binom *= f64::from(alpha - i + 1) / f64::from(i);
            }
            let i = f64::from(i);
            sum += binom
                * q.powf(i)
                * (1.0 - q).powf(f64::from(alpha) - i)
                * ((i * i - i) / (2.0 * sigma * sigma)).exp();
        }
        sum.ln() / (f64::from(alpha) - 1.0)
    }

    #[test]
    fn integer_orders_match_the_plain_sum() {
        for &(q, sigma) in &[(0.01, 1.0), (0.1, 0.8), (0.5, 2.0), (0.9, 3.0)] {
            for alpha in [2u32, 3, 5, 8, 16] {
                let got = poisson_gaussian(q, sigma, f64::from(alpha));
                let want = direct_integer(q, sigma, alpha);
                assert!(
                    (got - want).abs() <= 1e-12 * want.abs().max(1e-300),
                    "q={q} σ={sigma} α={alpha}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn full_sampling_is_the_gaussian() {
        assert_eq!(poisson_gaussian(1.0, 2.0, 3.0), 3.0 / 8.0);
        assert_eq!(fixed_size_gaussian(1.0, 2.0, 3.0), 3.0 / 8.0);
        assert_eq!(poisson_gaussian(0.0, 2.0, 3.0), 0.0);
        assert_eq!(poisson_gaussian(0.5, 0.0, 3.0), f64::INFINITY);
    }

    #[test]
    fn subsampling_amplifies_and_orders_are_monotone() {
        let (q, sigma) = (0.05, 1.1);
        let mut last = 0.0;
        for alpha in [1.5, 2.0, 2.5, 3.0, 4.5, 8.0, 32.0, 256.0] {
            let r = poisson_gaussian(q, sigma, alpha);
            assert!(r.is_finite() && r > last, "α={alpha}: {r} after {last}");
            assert!(r < alpha / (2.0 * sigma * sigma));
            last = r;
            let w = fixed_size_gaussian(q, sigma, alpha);
            assert!(w.is_finite() && w > 0.0 && w < alpha / (2.0 * sigma * sigma));
        }
    }

    #[test]
    fn fractional_orders_sit_between_their_integer_neighbours() {
        for &(q, sigma) in &[(0.01, 1.0), (0.02, 4.0), (0.005, 0.7)] {
            for alpha in [2.5f64, 3.5, 7.3, 12.5] {
                let mid = poisson_gaussian(q, sigma, alpha);
                let lo = poisson_gaussian(q, sigma, alpha.floor());
                let hi = poisson_gaussian(q, sigma, alpha.ceil());
                assert!(
                    lo <= mid * (1.0 + 1e-9) && mid <= hi * (1.0 + 1e-9),
                    "{lo} {mid} {hi}"
                );
            }
        }
    }

    #[test]
    fn large_orders_do_not_overflow() {
        for alpha in [512.0, 1024.0] {
            let r = poisson_gaussian(0.01, 0.5, alpha);
            assert!(r.is_finite() && r > 0.0);
            let w = fixed_size_gaussian(0.01, 0.5, alpha);
            assert!(w.is_finite() && w > 0.0);
        }
    }

    #[test]
    fn log_erfc_is_continuous_across_its_switch() {
        let below = log_erfc(20.0 - 1e-9);
        let above = log_erfc(20.0);
        assert!(
            (below - above).abs() < 1e-8 * above.abs(),
            "{below} {above}"
        );
        assert!((log_erfc(0.0)).abs() < 1e-15);
        assert!((log_erfc(-30.0) - 2f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn forward_differences_of_a_polynomial() {
        // f(k) = k² + 1: Δf(0) = 1, Δ²f = 2, Δ³f = 0.
        let d = forward_differences(3, |k| (k * k + 1.0).ln());
        assert!((d[0] - 0.0).abs() < 1e-15);
        assert!((d[1] - 0.0).abs() < 1e-12);
        assert!((d[2] - 2f64.ln()).abs() < 1e-12);
        assert!(d[3] < -30.0);
    }
}
