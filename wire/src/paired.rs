//! The exact paired test on discordant counts (docs/algorithms.md §11): two models scored on
//! the same images, `gained` the images only the new one gets right, `lost` those only the old
//! one gets right. Under "the new one is no worse", `lost` given `gained + lost = d` is at most
//! Binomial(d, ½). The coordinator's evaluation gate holds a candidate on it; a device serves its
//! own correction of a release only when the same test, turned around, finds it better.

/// `P(X ≥ lost)` for `X ~ Binomial(gained + lost, ½)`: the one-sided exact McNemar p-value
/// of "the candidate is worse" (1 when no image disagrees).
pub fn regression_p(gained: u32, lost: u32) -> f64 {
    let d = u64::from(gained) + u64::from(lost);
    binomial_half_tail(d, u64::from(lost))
}

/// `P(X ≥ k)` for `X ~ Binomial(d, ½)`, summed in log space (exact to rounding for any `d`),
/// in constant memory: below the middle through the mirror `1 − P(X ≥ d − k + 1)`, so the
/// terms summed only fall, and the sum stops once they no longer count (a site claiming ten
/// million images costs a few milliseconds, not a buffer of them).
fn binomial_half_tail(d: u64, k: u64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > d {
        return 0.0;
    }
    if 2 * k <= d {
        return (1.0 - binomial_half_tail(d, d - k + 1)).clamp(0.0, 1.0);
    }
    let ln_half = -(d as f64) * std::f64::consts::LN_2;
    // ln C(d, j) for j = k.. d, from ln C(d, k) by the ratio (d − j) / (j + 1).
    let mut ln_c = ln_choose(d, k);
    let mut sum = f64::NEG_INFINITY;
    for j in k..=d {
        let term = ln_c + ln_half;
        if term < sum - 60.0 {
            break;
        }
        let (hi, lo) = if term > sum { (term, sum) } else { (sum, term) };
        sum = hi + (lo - hi).exp().ln_1p();
        if j < d {
            ln_c += ((d - j) as f64).ln() - ((j + 1) as f64).ln();
        }
    }
    sum.exp().min(1.0)
}

/// `ln C(n, k)`, as a sum of logarithms over the shorter side.
fn ln_choose(n: u64, k: u64) -> f64 {
    let k = k.min(n - k);
    (0..k)
        .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
        .sum()
}

/// The exact one-sided p-value of "the new model is better": `regression_p` with the counts
/// turned around.
pub fn improvement_p(gained: u32, lost: u32) -> f64 {
    regression_p(lost, gained)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_tail_matches_small_cases_worked_by_hand() {
        // 3 losses of 3: 1/8; at least 2 of 3: 4/8; none disagree: nothing to hold on.
        assert!((regression_p(0, 3) - 0.125).abs() < 1e-12);
        assert!((regression_p(1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(regression_p(0, 0), 1.0);
        // 10 of 10: 2^-10; a large count stays finite and small.
        assert!((regression_p(0, 10) - 1.0 / 1024.0).abs() < 1e-15);
        let p = regression_p(400, 600);
        assert!(p > 0.0 && p < 1e-9, "{p}");
        // Below the middle, through the mirror: 1 of 3 or more lost is 7/8.
        assert!((regression_p(2, 1) - 0.875).abs() < 1e-12);
        // Ten million images, the most a site may claim, both ways.
        assert!(regression_p(5_000_000, 5_000_000) > 0.49);
        assert!(regression_p(9_999_999, 1) > 0.999_999);
        assert!(regression_p(1, 9_999_999) < 1e-300);
    }

    #[test]
    fn improvement_is_regression_turned_around() {
        assert!((improvement_p(3, 0) - 0.125).abs() < 1e-12);
        assert_eq!(improvement_p(0, 0), 1.0);
        assert!(improvement_p(30, 5) < 0.001);
        assert!(improvement_p(5, 30) > 0.999);
    }
}
