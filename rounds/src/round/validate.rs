//! Validation of a decoded update against the open round: the right client, round and shape,
//! finite values, samples, the norm bound, and the objectives' statistics; plus the round-end
//! guard that drops norm outliers. Pure functions: they say why an update cannot be used and
//! change nothing (an update that fails validation changes nothing but the rejection counters,
//! which the machine keeps).

use fedge_wire::{ClassStats, ClientUpdate, FeatureSummary, MIN_CLASS_ROWS, TensorF32};

use super::open::OpenRound;
use super::types::MAX_ABS_VALUE;
use super::types::{Rejection, RoundConfig};

/// Largest magnitude of a feature summary's values (backbone features are activations).
pub const MAX_SUMMARY_VALUE: f32 = 1e6;

/// How far, in the pool's spreads, a device's class means may lie from the pool's on
/// average over the features before its summary is refused (`summary_band`).
pub const SUMMARY_BAND: f64 = 10.0;

/// How many times larger or smaller than the pool's a device's within-class variance may be
/// on average (geometric mean over the features) before its summary is refused.
pub const SUMMARY_SPREAD_RATIO: f64 = 100.0;

/// Why `client`'s `update` cannot be used in the `open` round of a machine whose head has
/// `params` parameters and whose pooled feature summary is `pool`; `Ok` when it can.
/// `buffered`: the round and sender were checked against the devices in flight already.
pub(super) fn validate(
    config: &RoundConfig,
    open: Option<&OpenRound>,
    pool: Option<&FeatureSummary>,
    params: usize,
    client: &str,
    update: &ClientUpdate,
    buffered: bool,
) -> Result<(), (Rejection, String)> {
    if update.client_id != client {
        return Err((
            Rejection::ClientMismatch,
            format!("update names {:?}", update.client_id),
        ));
    }
    if update.run != config.run {
        return Err((
            Rejection::Replay,
            format!(
                "update answers run {:016x}, this federation runs {:016x}",
                update.run, config.run
            ),
        ));
    }
    let Some(open) = open else {
        return Err((
            Rejection::WrongRound,
            format!("round {} but no round is open", update.round),
        ));
    };
    // Buffered mode checks the round and the sender against the devices in flight instead.
    if !buffered {
        in_round(open, client, update)?;
    }
    check_body(config, open, pool, params, update)
}

/// The synchronous round's checks: the open round, a selected client, its first update.
fn in_round(
    open: &OpenRound,
    client: &str,
    update: &ClientUpdate,
) -> Result<(), (Rejection, String)> {
    if update.round != open.round {
        return Err((
            Rejection::WrongRound,
            format!("round {} but round {} is open", update.round, open.round),
        ));
    }
    if !open.selected.contains(client) {
        return Err((
            Rejection::NotSelected,
            format!("not selected for round {}", open.round),
        ));
    }
    if open.accepted.contains(client) {
        return Err((
            Rejection::Duplicate,
            format!("second update for round {}", open.round),
        ));
    }
    Ok(())
}

/// The checks of what an update carries: shape, values, samples, norm, statistics.
fn check_body(
    config: &RoundConfig,
    open: &OpenRound,
    pool: Option<&FeatureSummary>,
    params: usize,
    update: &ClientUpdate,
) -> Result<(), (Rejection, String)> {
    if update.delta.len() != params {
        return Err((
            Rejection::Shape,
            format!("{} parameters, the head has {}", update.delta.len(), params),
        ));
    }
    check_values(&update.delta, "parameter")?;
    if update.num_samples == 0 {
        return Err((Rejection::NoSamples, "zero samples".into()));
    }
    if config.max_update_norm > 0.0 {
        let norm = update.delta.l2_norm();
        if norm > config.max_update_norm {
            return Err((
                Rejection::Norm,
                format!(
                    "delta norm {norm:.4} above max_update_norm {}",
                    config.max_update_norm
                ),
            ));
        }
    }
    if let Some(insight) = &config.insight {
        let shape = (insight.hidden, insight.classes);
        let what = "FedDIM class statistics";
        let stats = update.class_stats.as_ref();
        check_class_stats(stats, shape, update.num_samples, Rejection::Insight, what)?;
    }
    if let Some(prototypes) = &config.prototypes {
        let shape = (prototypes.hidden, prototypes.classes);
        let what = "FedDDL prototypes";
        let stats = update.prototypes.as_ref();
        check_class_stats(
            stats,
            shape,
            update.num_samples,
            Rejection::Prototypes,
            what,
        )?;
    }
    if open.pools {
        check_features(config, pool, update)?;
    }
    Ok(())
}

/// Checks a feature summary where the round pools, if the update carries one: of the head's
/// classes and features, counts adding up to at most the update's samples and none between 0
/// and [`MIN_CLASS_ROWS`] (a device keeps such classes), values finite and within
/// ±[`MAX_SUMMARY_VALUE`], and within the band around the `pool` (`summary_band`).
fn check_features(
    config: &RoundConfig,
    pool: Option<&FeatureSummary>,
    update: &ClientUpdate,
) -> Result<(), (Rejection, String)> {
    let reason = Rejection::Features;
    // A device may keep its summary (local DP): its delta still counts.
    let Some(features) = &update.features else {
        return Ok(());
    };
    if let Some(head) = &config.head {
        features
            .check(head.classes, head.features)
            .map_err(|e| (reason, e))?;
    }
    let total = features.total();
    if total.is_nan() || total > f64::from(update.num_samples) {
        return Err((
            reason,
            format!(
                "feature summary counts add up to {total}, above the {} samples",
                update.num_samples
            ),
        ));
    }
    if let Some((k, n)) =
        (features.counts.iter().enumerate()).find(|(_, n)| **n > 0.0 && **n < MIN_CLASS_ROWS)
    {
        return Err((
            reason,
            format!(
                "feature summary: class {k} of {n} rows, fewer than {MIN_CLASS_ROWS} (its mean would be those images' features)"
            ),
        ));
    }
    for (values, what) in [(&features.means, "mean"), (&features.within, "variance")] {
        if let Some(i) = values.first_beyond(MAX_SUMMARY_VALUE) {
            return Err((
                reason,
                format!(
                    "feature summary: {what} {i} is not finite or beyond ±{MAX_SUMMARY_VALUE:e}"
                ),
            ));
        }
    }
    match pool {
        Some(pool)
            if pool.classes() == features.classes() && pool.features() == features.features() =>
        {
            summary_band(pool, features).map_err(|detail| (reason, detail))
        }
        _ => Ok(()),
    }
}

/// Whether `summary` lies within the band around `pool` a device of the federation's sites
/// plausibly sends from: for each class both have, the root mean square over the features of
/// `(μ_dkj − μ_kj) / s_j` at most [`SUMMARY_BAND`], with `s_j²` the pooled variance of the
/// class-balanced mixture (floored at a thousandth of its mean); the geometric mean over the
/// features of the device's within-class variance over the pool's within
/// [1 / [`SUMMARY_SPREAD_RATIO`], [`SUMMARY_SPREAD_RATIO`]].
fn summary_band(pool: &FeatureSummary, summary: &FeatureSummary) -> Result<(), String> {
    let f = pool.features();
    let Some((_, between)) = pool.balanced_moments() else {
        return Ok(());
    };
    let pool_within = pool.within.to_vec();
    let variance: Vec<f64> = (pool_within.iter().zip(&between))
        .map(|(&w, b)| f64::from(w) + b)
        .collect();
    let floor = (variance.iter().sum::<f64>() / f.max(1) as f64 * 1e-3).max(1e-12);
    let (pool_means, means) = (pool.means.to_vec(), summary.means.to_vec());
    for k in 0..pool.classes() {
        if pool.counts[k] <= 0.0 || summary.counts[k] <= 0.0 {
            continue;
        }
        let row = |m: &[f32]| m[k * f..(k + 1) * f].to_vec();
        let (p, d) = (row(&pool_means), row(&means));
        let mean_square = (p.iter().zip(&d).zip(&variance))
            .map(|((&p, &d), &v)| (f64::from(d) - f64::from(p)).powi(2) / v.max(floor))
            .sum::<f64>()
            / f.max(1) as f64;
        if mean_square.sqrt() > SUMMARY_BAND {
            return Err(format!(
                "feature summary: class {k}'s mean lies {:.1} pooled spreads from the pool's \
                 (at most {SUMMARY_BAND})",
                mean_square.sqrt()
            ));
        }
    }
    let within_floor = (pool_within.iter().map(|w| f64::from(*w)).sum::<f64>() / f.max(1) as f64
        * 1e-3)
        .max(1e-12);
    let log_ratio = (summary.within.values().zip(&pool_within))
        .map(|(d, &p)| (f64::from(d).max(within_floor) / f64::from(p).max(within_floor)).ln())
        .sum::<f64>()
        / f.max(1) as f64;
    if log_ratio.abs() > SUMMARY_SPREAD_RATIO.ln() {
        return Err(format!(
            "feature summary: within-class variance {:.3e} times the pool's (at most \
             {SUMMARY_SPREAD_RATIO} either way)",
            log_ratio.exp()
        ));
    }
    Ok(())
}

/// Checks that every value is finite (`non_finite`) and at most [`MAX_ABS_VALUE`] in
/// magnitude (`norm`).
fn check_values(values: &TensorF32, what: &str) -> Result<(), (Rejection, String)> {
    let Some(i) = values.first_beyond(MAX_ABS_VALUE) else {
        return Ok(());
    };
    match values.values().nth(i) {
        Some(v) if v.is_finite() => Err((
            Rejection::Norm,
            format!("{what} {i} is {v:e}, beyond ±{MAX_ABS_VALUE:e}"),
        )),
        _ => Err((Rejection::NonFinite, format!("{what} {i} is not finite"))),
    }
}

/// Checks per-class statistics of shape `(H, K)`: present, `K` counts adding up to at most
/// the update's `num_samples` (the counts weigh the statistics as `num_samples` weighs the
/// delta), `K·H` finite means of bounded magnitude.
fn check_class_stats(
    stats: Option<&ClassStats>,
    (h, k): (usize, usize),
    num_samples: u32,
    reason: Rejection,
    what: &str,
) -> Result<(), (Rejection, String)> {
    let Some(stats) = stats else {
        return Err((reason, format!("no {what}")));
    };
    if stats.counts.len() != k || stats.means.len() != k * h {
        return Err((
            reason,
            format!(
                "{what}: {} class counts and {} mean values, expected {k} and {}",
                stats.counts.len(),
                stats.means.len(),
                k * h
            ),
        ));
    }
    let total: u64 = stats.counts.iter().map(|&c| u64::from(c)).sum();
    if total > u64::from(num_samples) {
        return Err((
            reason,
            format!("{what}: class counts add up to {total}, above the {num_samples} samples"),
        ));
    }
    check_values(&stats.means, &format!("{what}: mean"))
}
