//! Norms of deltas: the Euclidean norm accumulated in f64, a round's norms (read from the
//! streamed dot products when there are any) and their median. A leaf every layer may use (the
//! round machine's norm guards, clipping, server momentum, the driver's status); it holds no
//! state.

use super::RoundUpdates;
use super::delta::{Delta, WIDEN_CHUNK};

/// Euclidean norm, accumulated in f64.
pub fn l2_norm(values: &[f32]) -> f32 {
    l2_norm_f64(values.iter().copied()) as f32
}

/// Euclidean norm, accumulated and returned in f64.
pub fn l2_norm_f64(values: impl IntoIterator<Item = f32>) -> f64 {
    values
        .into_iter()
        .map(|v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt()
}

/// Euclidean norm of a held delta, accumulated in f64 in index order (the bits of
/// [`l2_norm_f64`] over its values), widened a chunk at a time.
pub fn delta_norm(delta: Delta<'_>) -> f64 {
    let mut buf = Vec::new();
    let mut sum = 0f64;
    let len = delta.len();
    for start in (0..len).step_by(WIDEN_CHUNK) {
        for v in delta.f32_range(start..(start + WIDEN_CHUNK).min(len), &mut buf) {
            sum += (*v as f64) * (*v as f64);
        }
    }
    sum.sqrt()
}

/// Norms of the held deltas, in view order.
pub fn norms(updates: &RoundUpdates) -> Vec<f64> {
    (0..updates.len())
        .map(|i| match updates.dot(i, i) {
            Some(d) => d.max(0.0).sqrt(),
            None => delta_norm(updates.delta(i)),
        })
        .collect()
}

/// The lower median of `values` (the smaller of the middle two for an even count); 0 when
/// empty. With two values it is the smaller one, so one of two senders cannot raise it.
pub fn lower_median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n => sorted[(n - 1) / 2],
    }
}

/// For each value, the [`median`] of all the *other* values, from one sort (`O(n log n)`, not
/// a sort per value); empty below two values.
pub fn medians_of_the_others(values: &[f64]) -> Vec<f64> {
    let n = values.len();
    if n < 2 {
        return Vec::new();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let k = n - 1;
    values
        .iter()
        .map(|v| {
            // Leaving out the first copy of `v` leaves the same multiset as any other copy.
            let rank = sorted.partition_point(|x| x.total_cmp(v).is_lt());
            let other = |j: usize| sorted[j + usize::from(rank <= j)];
            match k % 2 {
                1 => other(k / 2),
                _ => 0.5 * (other(k / 2 - 1) + other(k / 2)),
            }
        })
        .collect()
}

/// The median of `values` (mean of the middle two for an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_medians_of_the_others_are_those_of_each_value_left_out() {
        let cases: [&[f64]; 5] = [
            &[1.0, 2.0],
            &[3.0, 1.0, 2.0],
            &[5.0, 1.0, 5.0, 2.0],
            &[0.001, 1.0, 4.0, 4.0, 9.0, 0.5],
            &[2.0, 2.0, 2.0],
        ];
        for values in cases {
            let brute: Vec<f64> = (0..values.len())
                .map(|i| {
                    let others: Vec<f64> = (values.iter().enumerate())
                        .filter(|(j, _)| *j != i)
                        .map(|(_, v)| *v)
                        .collect();
                    median(&others)
                })
                .collect();
            assert_eq!(medians_of_the_others(values), brute, "{values:?}");
        }
        assert!(medians_of_the_others(&[1.0]).is_empty());
    }

    use super::*;

    #[test]
    fn a_held_delta_has_the_norm_of_its_values_bit_for_bit() {
        let values: Vec<f32> = (0..3_001).map(|i| (i % 17) as f32 * 0.37 - 2.9).collect();
        let halves: Vec<half::f16> = values.iter().map(|v| half::f16::from_f32(*v)).collect();
        let widened: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
        let want = l2_norm_f64(widened.iter().copied());
        assert_eq!(delta_norm(Delta::F16(&halves)).to_bits(), want.to_bits());
        assert_eq!(delta_norm(Delta::F32(&widened)).to_bits(), want.to_bits());
    }
}
