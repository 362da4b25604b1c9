//! Norms of deltas: the Euclidean norm accumulated in f64, a round's norms (read from the
//! streamed dot products when there are any) and their median. A leaf every layer may use (the
//! round machine's norm guards, clipping, server momentum, the driver's status); it holds no
//! state.

use super::RoundUpdates;

/// Euclidean norm, accumulated in f64.
pub fn l2_norm(values: &[f32]) -> f32 {
    l2_norm_f64(values) as f32
}

/// Euclidean norm, accumulated and returned in f64.
pub fn l2_norm_f64(values: &[f32]) -> f64 {
    values
        .iter()
        .map(|v| (*v as f64) * (*v as f64))
        .sum::<f64>()
        .sqrt()
}

/// Norms of the held deltas, in view order.
pub fn norms(updates: &RoundUpdates) -> Vec<f64> {
    (0..updates.len())
        .map(|i| match updates.dot(i, i) {
            Some(d) => d.max(0.0).sqrt(),
            None => l2_norm_f64(updates.delta(i)),
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
