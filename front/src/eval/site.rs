//! The held-out site as a deployment meets it: a class mix of its own (`--label-shift`) and
//! statistics from a few unlabelled images it has seen (`--calibration`), scored on other
//! images it has not.
//!
//! The held-out domain's rows are shuffled per seed and halved: the statistics see `n` rows
//! of the first half (`all`: every row, the scored ones included — transductive, what the
//! benchmark measured before), the score is on the second half. With a label shift both halves
//! are drawn with the site's class mix, the mix itself drawn per seed, without replacement:
//! each class gets its share of the rows, and where a class of the half has fewer rows than
//! its share asks, the half shrinks so that the mix holds (a site that sees one class of a
//! domain with 15 images of it per half has 15 calibration images, whatever `n`). Every
//! feature normalisation of a run is scored on the same rows, so their differences are
//! paired.

use std::fmt;
use std::str::FromStr;

use fedge_device::FeatureSet;
use fedge_device::random::standard_normal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// How many unlabelled rows the held-out site's statistics see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calibration {
    /// `n` rows, disjoint from the scored ones.
    Rows(usize),
    /// Every row, the scored ones included.
    All,
}

impl Default for Calibration {
    /// 128 rows: what a site collects in its first minutes, and below half of every built-in
    /// held-out domain.
    fn default() -> Self {
        Self::Rows(128)
    }
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rows(n) => write!(f, "{n}"),
            Self::All => f.write_str("all"),
        }
    }
}

impl FromStr for Calibration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            n => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(Self::Rows(n)),
                _ => Err(format!(
                    "calibration `{s}`: give a number of rows (at least 1) or `all`"
                )),
            },
        }
    }
}

impl Serialize for Calibration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The held-out site's class mix.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LabelShift {
    /// The domain's own mix (balanced for the built-in data sets).
    #[default]
    None,
    /// Class proportions drawn from a symmetric Dirichlet(α).
    Dirichlet(f64),
    /// One class (drawn) holds this share; the others share the rest equally.
    Dominant(f64),
    /// Only this many classes (drawn), equally often.
    Classes(usize),
}

impl fmt::Display for LabelShift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Dirichlet(a) => write!(f, "dirichlet:{a}"),
            Self::Dominant(p) => write!(f, "dominant:{p}"),
            Self::Classes(k) => write!(f, "classes:{k}"),
        }
    }
}

impl FromStr for LabelShift {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "label shift `{s}`: use none, dirichlet:ALPHA (ALPHA > 0), dominant:SHARE \
                 (0 < SHARE < 1) or classes:K (K ≥ 1)"
            )
        };
        let (kind, value) = s.split_once(':').unwrap_or((s, ""));
        let number = || value.parse::<f64>().ok().filter(|v| v.is_finite());
        match kind {
            "none" if value.is_empty() => Ok(Self::None),
            "dirichlet" => number()
                .filter(|a| *a > 0.0)
                .map(Self::Dirichlet)
                .ok_or_else(bad),
            "dominant" => number()
                .filter(|p| *p > 0.0 && *p < 1.0)
                .map(Self::Dominant)
                .ok_or_else(bad),
            "classes" => value
                .parse::<usize>()
                .ok()
                .filter(|k| *k >= 1)
                .map(Self::Classes)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

impl Serialize for LabelShift {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl LabelShift {
    /// The site's class proportions over `classes` classes, drawn with `rng` (`None`: the
    /// domain's own mix).
    pub fn prior(self, classes: usize, rng: &mut impl Rng) -> Option<Vec<f64>> {
        let k = classes.max(1);
        let mut order: Vec<usize> = (0..k).collect();
        order.shuffle(rng);
        let mut prior = vec![0.0; k];
        match self {
            Self::None => return None,
            Self::Dirichlet(alpha) => {
                for p in &mut prior {
                    *p = gamma(alpha, rng);
                }
            }
            Self::Dominant(share) => {
                let rest = if k > 1 {
                    (1.0 - share) / (k - 1) as f64
                } else {
                    0.0
                };
                prior.iter_mut().for_each(|p| *p = rest);
                prior[order[0]] = share;
            }
            Self::Classes(n) => {
                for &c in order.iter().take(n.min(k)) {
                    prior[c] = 1.0;
                }
            }
        }
        let total: f64 = prior.iter().sum();
        if total <= 0.0 {
            prior[order[0]] = 1.0;
            return Some(prior);
        }
        Some(prior.iter().map(|p| p / total).collect())
    }
}

/// A Gamma(α, 1) draw (Marsaglia and Tsang 2000; α < 1 through Gamma(α + 1)·U^(1/α)).
fn gamma(alpha: f64, rng: &mut impl Rng) -> f64 {
    if alpha < 1.0 {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        return gamma(alpha + 1.0, rng) * u.powf(1.0 / alpha);
    }
    let d = alpha - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = f64::from(standard_normal(rng));
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// How the held-out site is built (`--label-shift`, `--calibration`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct SiteOptions {
    /// The site's class mix.
    pub label_shift: LabelShift,
    /// The rows its statistics see.
    pub calibration: Calibration,
}

impl SiteOptions {
    /// The options of the benchmark before either existed: the domain's own mix, statistics
    /// over every row (what `--transport mqtt`'s evaluation-only device does with its rows).
    pub fn transductive() -> Self {
        Self {
            label_shift: LabelShift::None,
            calibration: Calibration::All,
        }
    }
}

/// The held-out site of one (seed, held-out domain).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSite {
    /// The labelled rows the global head is scored on.
    pub scored: FeatureSet,
    /// The unlabelled rows the site's statistics are computed from.
    pub calibration: FeatureSet,
}

impl TargetSite {
    /// The site `options` make of `held_out` (rows labelled on `classes` classes) for `seed`.
    pub fn new(held_out: &FeatureSet, classes: usize, options: SiteOptions, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x51_7e5e_ed00_c0de);
        let prior = options.label_shift.prior(classes, &mut rng);
        let mut rows: Vec<usize> = (0..held_out.len()).collect();
        match options.calibration {
            Calibration::All => {
                let scored = match &prior {
                    Some(p) => held_out.rows(&draw(held_out, &rows, p, rows.len(), &mut rng)),
                    None => held_out.clone(),
                };
                Self {
                    calibration: scored.clone(),
                    scored,
                }
            }
            Calibration::Rows(n) => {
                rows.shuffle(&mut rng);
                let (first, second) = rows.split_at(rows.len() / 2);
                let (calibration, scored) = match &prior {
                    Some(p) => (
                        draw(held_out, first, p, n, &mut rng),
                        draw(held_out, second, p, second.len(), &mut rng),
                    ),
                    None => (first[..n.min(first.len())].to_vec(), second.to_vec()),
                };
                Self {
                    scored: held_out.rows(&scored),
                    calibration: held_out.rows(&calibration),
                }
            }
        }
    }
}

/// At most `count` distinct rows of `pool` with class proportions `prior`, without
/// replacement: as many rows as every class's rows in `pool` allow at those proportions, each
/// class's number by largest remainders, its rows drawn at random, the result shuffled.
/// Classes without a row in `pool` are left out and the others renormalised.
fn draw(
    set: &FeatureSet,
    pool: &[usize],
    prior: &[f64],
    count: usize,
    rng: &mut impl Rng,
) -> Vec<usize> {
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); prior.len()];
    for &i in pool {
        if let Some(rows) = by_class.get_mut(set.labels[i] as usize) {
            rows.push(i);
        }
    }
    let weights: Vec<f64> = (prior.iter().zip(&by_class))
        .map(|(p, rows)| if rows.is_empty() { 0.0 } else { *p })
        .collect();
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let shares: Vec<f64> = weights.iter().map(|w| w / total).collect();
    // The most rows the classes' rows allow at these shares.
    let allowed = (shares.iter().zip(&by_class))
        .filter(|(p, _)| **p > 0.0)
        .map(|(p, rows)| (rows.len() as f64 / p).floor() as usize)
        .min()
        .unwrap_or(0);
    let n = count.min(allowed);
    let exact: Vec<f64> = shares.iter().map(|p| p * n as f64).collect();
    let mut counts: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut order: Vec<usize> = (0..exact.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let mut missing = n.saturating_sub(counts.iter().sum());
    for k in order {
        if missing == 0 {
            break;
        }
        if counts[k] < by_class[k].len() && shares[k] > 0.0 {
            counts[k] += 1;
            missing -= 1;
        }
    }
    let mut out = Vec::with_capacity(n);
    for (rows, &c) in by_class.iter_mut().zip(&counts) {
        rows.shuffle(rng);
        out.extend_from_slice(&rows[..c.min(rows.len())]);
    }
    out.shuffle(rng);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(per_class: usize, classes: u32) -> FeatureSet {
        let labels: Vec<u32> = (0..classes)
            .flat_map(|c| std::iter::repeat_n(c, per_class))
            .collect();
        FeatureSet {
            dim: 1,
            features: (0..labels.len()).map(|i| i as f32).collect(),
            labels,
        }
    }

    fn shares(set: &FeatureSet, classes: usize) -> Vec<f64> {
        let mut counts = vec![0.0; classes];
        for &y in &set.labels {
            counts[y as usize] += 1.0;
        }
        counts.iter().map(|c| c / set.len() as f64).collect()
    }

    #[test]
    fn spellings_parse_and_print_the_same() {
        for text in ["none", "dirichlet:0.3", "dominant:0.8", "classes:2"] {
            assert_eq!(text.parse::<LabelShift>().unwrap().to_string(), text);
        }
        for bad in [
            "dominant:1",
            "dominant",
            "classes:0",
            "dirichlet:-1",
            "skew",
        ] {
            let e = bad.parse::<LabelShift>().unwrap_err();
            assert!(e.contains("dominant:SHARE"), "{e}");
        }
        assert_eq!("all".parse::<Calibration>(), Ok(Calibration::All));
        assert_eq!("32".parse::<Calibration>(), Ok(Calibration::Rows(32)));
        assert!("0".parse::<Calibration>().is_err());
    }

    #[test]
    fn calibration_rows_are_disjoint_from_the_scored_ones() {
        let held_out = set(30, 10);
        let options = SiteOptions {
            label_shift: LabelShift::None,
            calibration: Calibration::Rows(32),
        };
        let site = TargetSite::new(&held_out, 10, options, 4);
        assert_eq!((site.calibration.len(), site.scored.len()), (32, 150));
        // Features are row numbers: no calibration row is scored.
        for v in &site.calibration.features {
            assert!(!site.scored.features.contains(v), "{v} is in both");
        }
        assert_eq!(site, TargetSite::new(&held_out, 10, options, 4));
        assert_ne!(site, TargetSite::new(&held_out, 10, options, 5));
        let all = TargetSite::new(&held_out, 10, SiteOptions::transductive(), 4);
        assert_eq!((&all.scored, &all.calibration), (&held_out, &held_out));
    }

    #[test]
    fn a_label_shift_gives_both_halves_the_sites_class_mix() {
        let held_out = set(100, 10);
        let dominant = SiteOptions {
            label_shift: LabelShift::Dominant(0.8),
            calibration: Calibration::Rows(400),
        };
        let site = TargetSite::new(&held_out, 10, dominant, 1);
        for part in [&site.scored, &site.calibration] {
            let s = shares(part, 10);
            let top = s.iter().cloned().fold(0.0, f64::max);
            assert!((top - 0.8).abs() < 0.06, "{s:?}");
            // Without replacement: the dominant class's rows in the half (about 50) allow
            // about 1.25 times as many rows in all, each once (features are row numbers).
            assert!((30..=90).contains(&part.len()), "{}", part.len());
            let mut rows = part.features.clone();
            rows.sort_by(f32::total_cmp);
            rows.dedup();
            assert_eq!(rows.len(), part.len(), "a row drawn twice");
        }
        for v in &site.calibration.features {
            assert!(!site.scored.features.contains(v), "{v} is in both");
        }
        let one = SiteOptions {
            label_shift: LabelShift::Classes(1),
            calibration: Calibration::Rows(16),
        };
        let site = TargetSite::new(&held_out, 10, one, 2);
        assert_eq!(site.calibration.len(), 16);
        // A domain with 3 images per class: one class leaves at most 3 per half, once each.
        let small = TargetSite::new(&set(3, 10), 10, one, 2);
        assert!(small.calibration.len() <= 3 && small.scored.len() <= 3);
        let first = site.scored.labels[0];
        assert!(site.scored.labels.iter().all(|y| *y == first));
        assert!(site.calibration.labels.iter().all(|y| *y == first));
        // Dirichlet(0.3) is far from uniform; every draw a distribution.
        let mut rng = StdRng::seed_from_u64(3);
        let p = LabelShift::Dirichlet(0.3).prior(10, &mut rng).unwrap();
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(p.iter().cloned().fold(0.0, f64::max) > 0.25, "{p:?}");
    }
}
