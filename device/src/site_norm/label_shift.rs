//! Label-shift-aware site adaptation from unlabelled rows (docs/algorithms.md §7, "`prior-em`"):
//! a site's class prior and a per-feature affine map of its features, estimated together
//! against the federation's pooled class-conditional statistics, and kept only where they
//! explain the site's rows better than the pooled statistics alone.
//!
//! The model: at the site, class `k`'s features are the pool's class `k` moved by a per-feature
//! affine map, `x = a ⊙ z + b` with `z ~ N(μ_k, diag w)` (the pool's class mean and within-class
//! variance), and the classes come with a prior `π` of the site's own. Given `π`, the map is the
//! one that matches the site's mean `M` and variance `V` per feature with the `π`-weighted
//! mixture of the pool's classes (prior-weighted moment matching):
//!
//! - `μ̄ = Σ_k π_k μ_k`, `B = Σ_k π_k (μ_k − μ̄)²`;
//! - `a = √(V / (w + B))` (held within [`SCALE_BOUNDS`]), `b = M − a μ̄`.
//!
//! Given the map, `π` is the maximum-likelihood prior of the head's posteriors on the site's
//! rows mapped back (`z = (x − b) / a`, then standardised with the pooled statistics as in
//! training): the EM of Saerens, Latinne and Decaestecker (2002), `r_ik ∝ (π_k / π⁰_k) p(k | x_i)`,
//! `π_k = (Σ_i r_ik + α π⁰_k) / (n + α)` with `α` = [`PRIOR_PSEUDO_ROWS`]. The two steps alternate
//! [`ROUNDS`] times from `π = π⁰`. `π⁰` is the training prior: the pool's class shares, what
//! the head's output prior learnt from (FedAvg weighs the devices' rows by count; the pooled
//! *statistics* are class-balanced, which does not change what the head learnt).
//!
//! The site then standardises with the map composed with the pooled statistics and adds
//! `log(π_k / π⁰_k)` to the head's logits. The fit is kept only when its likelihood on rows it
//! did not see (two folds, each fitted on the other) under the pool's class-conditional Gaussian
//! mixture is above the pooled model's (no map, prior `π⁰`) on the same rows; otherwise, or
//! below [`MIN_FIT_ROWS`] rows, the site gets `pooled` as it is.

use fedge_models::HeadConfig;
use fedge_models::head::{Forward, argmax};

use super::{FeatureStats, FeatureSummary, MIN_ROWS, holds_together};

/// The fewest rows the fit runs on: two folds of [`MIN_ROWS`] for the likelihood check.
pub const MIN_FIT_ROWS: usize = 2 * MIN_ROWS;
/// Alternations of the map and the prior.
pub const ROUNDS: usize = 5;
/// The most EM steps per prior estimate (it stops earlier once the prior moves by less than
/// [`EM_TOLERANCE`]).
pub const EM_STEPS: usize = 200;
/// The largest change of any class's prior at which EM stops.
pub const EM_TOLERANCE: f64 = 1e-7;
/// `α`: rows of the training prior added to the EM's counts, so that no class's prior is 0
/// and its log ratio stays finite.
pub const PRIOR_PSEUDO_ROWS: f64 = 1.0;
/// The range of the map's scale `a` per feature.
pub const SCALE_BOUNDS: (f64, f64) = (0.25, 4.0);
/// The pool's within-class variance is floored at this share of its average over the
/// features (a unit that never fires in the pool would otherwise have none).
pub const WITHIN_FLOOR: f64 = 1e-3;

/// Why a site was given the pooled statistics as they are, or that the fit was kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The fit is kept: its held-out log-likelihood per row against the pooled model's.
    Accepted {
        /// The fit's, per row.
        fitted: f64,
        /// The pooled model's, per row.
        pooled: f64,
    },
    /// Fewer rows than [`MIN_FIT_ROWS`].
    TooFewRows(usize),
    /// The fit explains rows it did not see no better than the pooled model.
    NoBetter {
        /// The fit's held-out log-likelihood per row.
        fitted: f64,
        /// The pooled model's, per row.
        pooled: f64,
    },
    /// A value of the fit was not finite.
    NotFinite,
}

/// What a site serves with under the estimator: its statistics, and the correction of the
/// head's output prior.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorShift {
    /// What the site standardises its features with: the map composed with the pooled
    /// statistics, or the pooled statistics when the fit was not kept.
    pub stats: FeatureStats,
    /// The site's estimated class prior `π` (the training prior when the fit was not kept).
    pub prior: Vec<f64>,
    /// The training prior `π⁰`, the pool's class shares.
    pub train_prior: Vec<f64>,
    /// `log(π_k / π⁰_k)`, added to the head's logits (0 for a class the pool lacks, and for
    /// every class when the fit was not kept).
    pub log_ratio: Vec<f32>,
    /// The map's scale `a` per feature (1 when not kept).
    pub scale: Vec<f64>,
    /// The map's shift `b` per feature (0 when not kept).
    pub shift: Vec<f64>,
    /// Kept, or why not.
    pub outcome: Outcome,
}

impl PriorShift {
    /// Whether the fit was kept (otherwise this is `pooled`).
    pub fn accepted(&self) -> bool {
        matches!(self.outcome, Outcome::Accepted { .. })
    }

    /// The classes the site predicts for `rows` (`dim` features each, unstandardised): the
    /// head's logits on the rows standardised with [`PriorShift::stats`], plus the log prior
    /// ratio. `None` when `params` does not fit `head`.
    pub fn predict(
        &self,
        head: &HeadConfig,
        params: &[f32],
        rows: &[f32],
        dim: usize,
    ) -> Option<Vec<usize>> {
        let tensors = head.split(params).ok()?;
        let mut forward = Forward::new(head);
        let mut x = vec![0f32; dim];
        let mut out = Vec::with_capacity(rows.len() / dim.max(1));
        for row in rows.chunks_exact(dim.max(1)) {
            standardise_row(&self.stats, row, &mut x);
            let mut logits = forward.logits(&tensors, &x).to_vec();
            logits
                .iter_mut()
                .zip(&self.log_ratio)
                .for_each(|(l, r)| *l += r);
            out.push(argmax(&logits));
        }
        Some(out)
    }
}

/// The estimator on a site's unlabelled rows (`rows`, `dim` features each; labels are never
/// read) against the federation's `pooled` summary, for the head `head` with parameters
/// `params`, trained on features standardised with the pooled statistics. `None` when the
/// pool does not hold together or disagrees with the head's or the rows' sizes, or the
/// parameters do not fit the head (then there is nothing to serve with, as for `pooled`).
pub fn prior_shift(
    pooled: &FeatureSummary,
    rows: &[f32],
    dim: usize,
    head: &HeadConfig,
    params: &[f32],
) -> Option<PriorShift> {
    let pool = Pool::new(pooled, head)?;
    head.split(params).ok()?;
    let fallback = |outcome| pool.fallback(outcome);
    if rows.is_empty() {
        return Some(fallback(Outcome::TooFewRows(0)));
    }
    let rows: Vec<&[f32]> = match dim == pool.f {
        true => rows.chunks_exact(dim).collect(),
        false => return None,
    };
    if rows.len() < MIN_FIT_ROWS {
        return Some(fallback(Outcome::TooFewRows(rows.len())));
    }
    // Two folds (alternate rows), each fitted on the other: the likelihood of rows the fit did
    // not see, against the pooled model's on the same rows.
    let (even, odd): (Vec<_>, Vec<_>) = (rows.iter().enumerate()).partition(|(i, _)| i % 2 == 0);
    let even: Vec<&[f32]> = even.into_iter().map(|(_, r)| *r).collect();
    let odd: Vec<&[f32]> = odd.into_iter().map(|(_, r)| *r).collect();
    let mut fitted = 0.0;
    for (train, test) in [(&even, &odd), (&odd, &even)] {
        let (map, prior) = pool.fit(head, params, train);
        fitted += pool.log_likelihood(&map, &prior, test);
    }
    let n = rows.len() as f64;
    let (fitted, pooled_ll) = (
        fitted / n,
        pool.log_likelihood(&Map::identity(pool.f), &pool.train_prior, &rows) / n,
    );
    if !(fitted.is_finite() && pooled_ll.is_finite()) {
        return Some(fallback(Outcome::NotFinite));
    }
    if fitted <= pooled_ll {
        return Some(fallback(Outcome::NoBetter {
            fitted,
            pooled: pooled_ll,
        }));
    }
    let (map, prior) = pool.fit(head, params, &rows);
    let estimate = pool.serve(
        map,
        prior,
        Outcome::Accepted {
            fitted,
            pooled: pooled_ll,
        },
    );
    let finite = (estimate.stats.mean.iter().chain(&estimate.stats.inv_std))
        .chain(&estimate.log_ratio)
        .all(|v| v.is_finite());
    Some(match finite {
        true => estimate,
        false => fallback(Outcome::NotFinite),
    })
}

/// The per-feature affine map from the pool's space to the site's, `x = a ⊙ z + b`.
#[derive(Debug, Clone)]
struct Map {
    scale: Vec<f64>,
    shift: Vec<f64>,
}

impl Map {
    fn identity(f: usize) -> Self {
        Self {
            scale: vec![1.0; f],
            shift: vec![0.0; f],
        }
    }
}

/// The pooled summary as the estimator reads it.
struct Pool {
    f: usize,
    /// The classes the pool has rows of.
    present: Vec<usize>,
    /// `π⁰`, over every class of the head (0 where the pool has no row).
    train_prior: Vec<f64>,
    /// `μ_k`, `[K, F]`.
    means: Vec<f64>,
    /// `w`, floored.
    within: Vec<f64>,
    /// The pooled statistics the head was trained with.
    base: FeatureStats,
}

impl Pool {
    fn new(pooled: &FeatureSummary, head: &HeadConfig) -> Option<Self> {
        let (k, f) = (pooled.classes(), pooled.features());
        if !holds_together(pooled) || k != head.classes || f != head.features || f == 0 {
            return None;
        }
        let base = pooled.balanced_stats()?;
        let total: f64 = pooled.counts.iter().filter(|c| **c > 0.0).sum();
        let present: Vec<usize> = (0..k).filter(|&c| pooled.counts[c] > 0.0).collect();
        if present.is_empty() || total <= 0.0 {
            return None;
        }
        let train_prior = (pooled.counts.iter())
            .map(|&c| if c > 0.0 { c / total } else { 0.0 })
            .collect();
        let within: Vec<f64> = pooled.within.to_vec().into_iter().map(f64::from).collect();
        let floor = (WITHIN_FLOOR * within.iter().sum::<f64>() / f as f64).max(1e-12);
        Some(Self {
            f,
            present,
            train_prior,
            means: pooled.means.to_vec().into_iter().map(f64::from).collect(),
            within: within.into_iter().map(|w| w.max(floor)).collect(),
            base,
        })
    }

    fn mean(&self, k: usize) -> &[f64] {
        &self.means[k * self.f..][..self.f]
    }

    /// The pooled statistics as they are: what a site gets when the fit is not kept.
    fn fallback(&self, outcome: Outcome) -> PriorShift {
        let mut out = self.serve(Map::identity(self.f), self.train_prior.clone(), outcome);
        out.stats = self.base.clone();
        out
    }

    /// What a site serves with under `map` and `prior`.
    fn serve(&self, map: Map, prior: Vec<f64>, outcome: Outcome) -> PriorShift {
        let log_ratio = (prior.iter().zip(&self.train_prior))
            .map(|(&p, &p0)| match p0 > 0.0 && p > 0.0 {
                true => (p / p0).ln() as f32,
                false => 0.0,
            })
            .collect();
        PriorShift {
            stats: self.composed(&map),
            prior,
            train_prior: self.train_prior.clone(),
            log_ratio,
            scale: map.scale,
            shift: map.shift,
            outcome,
        }
    }

    /// The statistics that map a site's row back to the pool's space and standardise it as
    /// in training: `((x − b) / a − m) · s = (x − (b + a m)) · s / a`.
    fn composed(&self, map: &Map) -> FeatureStats {
        let mean = (self.base.mean.iter())
            .zip(map.scale.iter().zip(&map.shift))
            .map(|(&m, (a, b))| (b + a * f64::from(m)) as f32)
            .collect();
        let inv_std = (self.base.inv_std.iter())
            .zip(&map.scale)
            .map(|(&s, a)| (f64::from(s) / a) as f32)
            .collect();
        FeatureStats { mean, inv_std }
    }

    /// The map that matches the site's per-feature mean and variance `(M, V)` with the
    /// `prior`-weighted mixture of the pool's classes.
    fn map_for(&self, prior: &[f64], moments: &(Vec<f64>, Vec<f64>)) -> Map {
        let (site_mean, site_var) = moments;
        let mut scale = vec![1.0; self.f];
        let mut shift = vec![0.0; self.f];
        for j in 0..self.f {
            let mix: f64 = self
                .present
                .iter()
                .map(|&k| prior[k] * self.mean(k)[j])
                .sum();
            let between: f64 = (self.present.iter())
                .map(|&k| prior[k] * (self.mean(k)[j] - mix).powi(2))
                .sum();
            let a = (site_var[j] / (self.within[j] + between)).sqrt();
            let a = match a.is_finite() {
                true => a.clamp(SCALE_BOUNDS.0, SCALE_BOUNDS.1),
                false => 1.0,
            };
            scale[j] = a;
            shift[j] = site_mean[j] - a * mix;
        }
        Map { scale, shift }
    }

    /// The map and prior of `rows`, alternating [`ROUNDS`] times from the training prior.
    fn fit(&self, head: &HeadConfig, params: &[f32], rows: &[&[f32]]) -> (Map, Vec<f64>) {
        let moments = moments(rows, self.f);
        let mut prior = self.train_prior.clone();
        for _ in 0..ROUNDS {
            let map = self.map_for(&prior, &moments);
            let posteriors = self.posteriors(head, params, &self.composed(&map), rows);
            prior = self.em(&posteriors, prior);
        }
        (self.map_for(&prior, &moments), prior)
    }

    /// The head's softmax over its classes for each row standardised with `stats`.
    fn posteriors(
        &self,
        head: &HeadConfig,
        params: &[f32],
        stats: &FeatureStats,
        rows: &[&[f32]],
    ) -> Vec<Vec<f64>> {
        let Ok(tensors) = head.split(params) else {
            return Vec::new();
        };
        let mut forward = Forward::new(head);
        let mut x = vec![0f32; self.f];
        (rows.iter())
            .map(|row| {
                standardise_row(stats, row, &mut x);
                softmax(forward.logits(&tensors, &x))
            })
            .collect()
    }

    /// Saerens et al.'s EM for the prior of rows with head posteriors `posteriors`, from
    /// `prior`.
    fn em(&self, posteriors: &[Vec<f64>], mut prior: Vec<f64>) -> Vec<f64> {
        let n = posteriors.len() as f64;
        let mut r = vec![0.0; prior.len()];
        for _ in 0..EM_STEPS {
            let mut counts = vec![0.0; prior.len()];
            for p in posteriors {
                let mut total = 0.0;
                for &k in &self.present {
                    r[k] = prior[k] / self.train_prior[k] * p.get(k).copied().unwrap_or(0.0);
                    total += r[k];
                }
                if total > 0.0 && total.is_finite() {
                    self.present.iter().for_each(|&k| counts[k] += r[k] / total);
                }
            }
            let mut change: f64 = 0.0;
            for &k in &self.present {
                let next =
                    (counts[k] + PRIOR_PSEUDO_ROWS * self.train_prior[k]) / (n + PRIOR_PSEUDO_ROWS);
                change = change.max((next - prior[k]).abs());
                prior[k] = next;
            }
            if change < EM_TOLERANCE {
                break;
            }
        }
        prior
    }

    /// The log-likelihood of `rows` under the pool's class-conditional Gaussian mixture moved
    /// by `map`, with class prior `prior`: `Σ_i log Σ_k π_k N(x_i; a μ_k + b, diag(a² w))`.
    fn log_likelihood(&self, map: &Map, prior: &[f64], rows: &[&[f32]]) -> f64 {
        // The per-row constant: −½ Σ_j log(2π a_j² w_j).
        let constant: f64 = (map.scale.iter().zip(&self.within))
            .map(|(a, w)| -0.5 * (2.0 * std::f64::consts::PI * a * a * w).ln())
            .sum();
        let mut total = 0.0;
        let mut terms = Vec::with_capacity(self.present.len());
        for row in rows {
            terms.clear();
            for &k in &self.present {
                if prior[k] <= 0.0 {
                    continue;
                }
                let mu = self.mean(k);
                let mut quad = 0.0;
                for j in 0..self.f {
                    let (a, b) = (map.scale[j], map.shift[j]);
                    let d = f64::from(row[j]) - a * mu[j] - b;
                    quad += d * d / (a * a * self.within[j]);
                }
                terms.push(prior[k].ln() - 0.5 * quad);
            }
            total += constant + log_sum_exp(&terms);
        }
        total
    }
}

/// Per-feature mean and population variance of `rows`.
fn moments(rows: &[&[f32]], f: usize) -> (Vec<f64>, Vec<f64>) {
    let n = rows.len().max(1) as f64;
    let mut mean = vec![0.0; f];
    for row in rows {
        mean.iter_mut()
            .zip(*row)
            .for_each(|(m, &v)| *m += f64::from(v) / n);
    }
    let mut var = vec![0.0; f];
    for row in rows {
        for ((s, &v), m) in var.iter_mut().zip(*row).zip(&mean) {
            *s += (f64::from(v) - m).powi(2) / n;
        }
    }
    (mean, var)
}

fn standardise_row(stats: &FeatureStats, row: &[f32], out: &mut [f32]) {
    for (((o, &v), m), s) in out.iter_mut().zip(row).zip(&stats.mean).zip(&stats.inv_std) {
        *o = (v - m) * s;
    }
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = (logits.iter()).map(|&l| f64::from(l - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / total).collect()
}

fn log_sum_exp(terms: &[f64]) -> f64 {
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}
