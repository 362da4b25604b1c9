//! The round-end guards that bound what any one device can do to the model: a bound on the
//! length of each delta relative to the others', a cap on the weight an update claims, and
//! the refusal of an aggregate that is not finite or that moves
//! the model far beyond the updates it came from. Pure functions; the machine applies them in
//! `lifecycle` (the per-update checks on arrival are in `validate`).

use super::types::{MAX_ABS_VALUE, NormClip};
use crate::updates::RoundUpdates;
use crate::updates::norms::{lower_median, medians_of_the_others};

/// How far an aggregate may move the model, in multiples of the longest accepted delta.
/// FedAvg moves at most 1×; server momentum and FedOMG's step size a few times that (β = 0.9
/// carries up to 10×); an overflowing or poisoned aggregate moves by orders of magnitude more.
pub const MAX_STEP_RATIO: f64 = 1_000.0;

/// The norm guard: every delta longer than `ratio` × the median norm of the *other* updates
/// (mean of the middle two for an even count) is scaled down to that length; `(index, clip)`
/// in the updates' order. Off with `ratio` 0 or fewer than two updates.
///
/// Why this rule. Comparing with the others' median means no update sets its own bound, and
/// with three or more updates an honest majority sets everyone's. Scaling instead of dropping
/// bounds any one device's pull on the model (its delta is at most `ratio` times the others'
/// median) without excluding it: a site whose data differ most from the others', or whose
/// data changed, still moves the model towards them, so its delta shrinks and it comes back
/// under the bound by itself. (The rule it replaces dropped any delta above `ratio` × the
/// round's lower median: with two sites the smaller delta set the bound, and a site once
/// excluded stayed excluded while the model drifted from its data.) The price: with two
/// updates, a sender of a near-zero delta holds the other one to `ratio` times its own.
pub(super) fn norm_clips(
    ratio: f64,
    accepted: &RoundUpdates,
    norms: &[f64],
) -> Vec<(usize, NormClip)> {
    if ratio <= 0.0 || norms.len() < 2 {
        return Vec::new();
    }
    let medians = medians_of_the_others(norms);
    (0..norms.len())
        .filter_map(|i| {
            let bound = ratio * medians[i];
            (norms[i] > bound).then(|| {
                let clip = NormClip {
                    client: accepted.client(i).to_owned(),
                    norm: norms[i],
                    bound,
                };
                (i, clip)
            })
        })
        .collect()
}

/// The sample count above which an update's weight is cut: `ratio` × the round's lower median
/// count, rounded up; `None` when off (`ratio` 0), with fewer than two updates, or when no
/// count passes it.
pub(super) fn sample_cap(ratio: f64, accepted: &RoundUpdates) -> Option<u32> {
    if ratio <= 0.0 || accepted.len() < 2 {
        return None;
    }
    let counts: Vec<f64> = (0..accepted.len())
        .map(|i| f64::from(accepted.num_samples(i)))
        .collect();
    let cap = (ratio * lower_median(&counts))
        .ceil()
        .clamp(1.0, f64::from(u32::MAX)) as u32;
    counts.iter().any(|&n| n > f64::from(cap)).then_some(cap)
}

/// Scales class counts by `scale` (at most 1), rounding to the nearest count.
pub(super) fn scale_counts(counts: &mut [u32], scale: f64) {
    for c in counts {
        *c = (f64::from(*c) * scale.min(1.0)).round() as u32;
    }
}

/// Why the aggregate `next` from `current` must not be applied: `non_finite_aggregate` when a
/// value is NaN, infinite or beyond ±[`MAX_ABS_VALUE`], `exploding_aggregate` when it moves the
/// model by more than [`MAX_STEP_RATIO`] × `longest`, the norm of the longest accepted delta.
/// `None` when it may be applied.
pub(super) fn refuse_aggregate(
    current: &[f32],
    next: &[f32],
    longest: f64,
) -> Option<&'static str> {
    if next.len() != current.len()
        || next
            .iter()
            .any(|v| !v.is_finite() || v.abs() > MAX_ABS_VALUE)
    {
        return Some("non_finite_aggregate");
    }
    let step = current
        .iter()
        .zip(next)
        .map(|(a, b)| {
            let d = f64::from(*b) - f64::from(*a);
            d * d
        })
        .sum::<f64>()
        .sqrt();
    (step > MAX_STEP_RATIO * longest + 1e-6).then_some("exploding_aggregate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::updates::UpdatesConfig;

    fn held(updates: &[(&str, u32, [f32; 2])]) -> RoundUpdates {
        let mut r = RoundUpdates::new(2, updates.len(), UpdatesConfig::default());
        for (c, n, d) in updates {
            r.push(c, *n, d).unwrap();
        }
        r.finish();
        r
    }

    #[test]
    fn a_claimed_sample_count_is_cut_to_the_ratio_of_the_lower_median() {
        let two = held(&[("a", 100, [0.0; 2]), ("m", u32::MAX, [0.0; 2])]);
        assert_eq!(sample_cap(10.0, &two), Some(1_000));
        let fair = held(&[("a", 100, [0.0; 2]), ("b", 900, [0.0; 2])]);
        assert_eq!(sample_cap(10.0, &fair), None);
        assert_eq!(sample_cap(0.0, &two), None);
        assert_eq!(sample_cap(10.0, &held(&[("m", u32::MAX, [0.0; 2])])), None);
        let mut counts = [10, 0, 7];
        scale_counts(&mut counts, 0.5);
        assert_eq!(counts, [5, 0, 4]);
    }

    #[test]
    fn a_non_finite_or_exploding_aggregate_is_refused() {
        // The longest accepted delta has norm 5.
        let current = [1.0, 1.0];
        assert_eq!(refuse_aggregate(&current, &[2.5, 3.5], 5.0), None);
        assert_eq!(
            refuse_aggregate(&current, &[f32::NAN, 1.0], 5.0),
            Some("non_finite_aggregate")
        );
        assert_eq!(
            refuse_aggregate(&current, &[1e10, 1.0], 5.0),
            Some("non_finite_aggregate")
        );
        assert_eq!(
            refuse_aggregate(&current, &[1.0, 6_000.0], 5.0),
            Some("exploding_aggregate")
        );
    }
}
