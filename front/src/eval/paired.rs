//! Paired comparisons over seeds: each algorithm against the first one listed, seed by seed
//! (both ran on the same splits, clients, held-out site and initial head), with a 95 %
//! Student-t interval of the mean difference.
//!
//! A seed's score is the held-out accuracy averaged over the held-out domains; a difference
//! counts only for seeds where both algorithms ran every domain.

use std::collections::BTreeMap;

use serde::Serialize;

use super::RunResult;

/// One algorithm against the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// The algorithm.
    pub algorithm: String,
    /// The first algorithm listed.
    pub baseline: String,
    /// Seeds both ran in full.
    pub seeds: usize,
    /// Mean over seeds of (algorithm − baseline), in points.
    pub mean: f64,
    /// The 95 % interval of that mean (equal to the mean with one seed).
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// Seeds where the algorithm scored above the baseline.
    pub wins: usize,
}

/// Each algorithm after the first against the first, on held-out accuracy.
pub fn paired(results: &[RunResult]) -> Vec<Paired> {
    paired_by(results, |r| r.target_accuracy)
}

/// [`paired`] on another score of each run (a fraction, reported in points), such as its best
/// source-validation accuracy.
pub fn paired_by(results: &[RunResult], score: impl Fn(&RunResult) -> f32) -> Vec<Paired> {
    let mut algorithms: Vec<&str> = Vec::new();
    for r in results {
        if !algorithms.contains(&r.algorithm.as_str()) {
            algorithms.push(&r.algorithm);
        }
    }
    let Some((&baseline, others)) = algorithms.split_first() else {
        return Vec::new();
    };
    let targets = |a: &str| -> usize {
        let mut t: Vec<&str> = (results.iter())
            .filter(|r| r.algorithm == a)
            .map(|r| r.target.as_str())
            .collect();
        t.sort_unstable();
        t.dedup();
        t.len()
    };
    let per_seed = |a: &str| -> BTreeMap<u64, f64> {
        let mut sums: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
        for r in results.iter().filter(|r| r.algorithm == a) {
            let e = sums.entry(r.seed).or_default();
            e.0 += f64::from(score(r)) * 100.0;
            e.1 += 1;
        }
        let full = targets(a);
        sums.into_iter()
            .filter(|(_, (_, n))| *n == full)
            .map(|(seed, (sum, n))| (seed, sum / n as f64))
            .collect()
    };
    let base = per_seed(baseline);
    others
        .iter()
        .filter_map(|&a| {
            let mine = per_seed(a);
            let diffs: Vec<f64> = (mine.iter())
                .filter_map(|(seed, v)| base.get(seed).map(|b| v - b))
                .collect();
            let (mean, half) = interval(&diffs)?;
            Some(Paired {
                algorithm: a.to_owned(),
                baseline: baseline.to_owned(),
                seeds: diffs.len(),
                mean,
                low: mean - half,
                high: mean + half,
                wins: diffs.iter().filter(|d| **d > 0.0).count(),
            })
        })
        .collect()
}

/// Every algorithm paired by seed against each of `baselines` in turn (the results with the
/// baseline's first, as [`paired`] pairs against the first); a name that did not run is
/// an error that lists the ones that did.
pub fn paired_against(
    baselines: &[String],
    results: &[RunResult],
) -> anyhow::Result<Vec<(String, Vec<Paired>)>> {
    baselines
        .iter()
        .map(|baseline| {
            let (first, rest): (Vec<RunResult>, Vec<RunResult>) =
                (results.iter().cloned()).partition(|r| &r.algorithm == baseline);
            if first.is_empty() && !results.is_empty() {
                let mut ran: Vec<&str> = results.iter().map(|r| r.algorithm.as_str()).collect();
                ran.sort_unstable();
                ran.dedup();
                anyhow::bail!("--paired-against {baseline}: not among {}", ran.join(", "));
            }
            Ok((baseline.clone(), paired(&[first, rest].concat())))
        })
        .collect()
}

/// The mean of `values` and the half-width of its 95 % Student-t interval (0 with one value);
/// `None` without values.
pub fn interval(values: &[f64]) -> Option<(f64, f64)> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Some((mean, 0.0));
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((mean, t975(n - 1) * (var / n as f64).sqrt()))
}

/// The 97.5 % quantile of Student's t with `df` degrees of freedom (standard tables; the
/// normal's 1.96 beyond 30).
fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    TABLE.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

/// The paired differences as a Markdown table.
pub fn paired_markdown(rows: &[Paired]) -> String {
    let mut out = String::from(
        "| algorithm | − baseline (points) | 95 % interval | seeds above |\n|---|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} − {} | {:+.1} | [{:+.1}, {:+.1}] | {}/{} |\n",
            r.algorithm, r.baseline, r.mean, r.low, r.high, r.wins, r.seeds
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_students_and_pairs_seed_by_seed() {
        // Differences 1, 2, 3: mean 2, s = 1, half-width t(2) · 1/√3.
        let (mean, half) = interval(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(mean, 2.0);
        assert!((half - 4.303 / 3f64.sqrt()).abs() < 1e-9, "{half}");
        assert_eq!(interval(&[5.0]), Some((5.0, 0.0)));
        assert_eq!(interval(&[]), None);
        assert_eq!(t975(100), 1.96);
    }

    fn run(algorithm: &str, target: &str, seed: u64, accuracy: f32) -> RunResult {
        RunResult {
            algorithm: algorithm.into(),
            target: target.into(),
            seed,
            best_round: 1,
            best_source_val: 0.5,
            target_accuracy: accuracy,
            final_target_accuracy: accuracy,
            curve: Vec::new(),
            train_seconds_per_round: f64::NAN,
            final_params: Vec::new(),
            epsilon: None,
            rejected: Default::default(),
            stopped: None,
        }
    }

    #[test]
    fn differences_are_taken_seed_by_seed_over_complete_seeds() {
        // Seed 0: a = (0.5 + 0.7)/2, b = (0.6 + 0.8)/2 → +10 points; seed 1: +20; seed 2 lacks
        // b's second domain and is left out.
        let results = vec![
            run("a", "x", 0, 0.5),
            run("a", "y", 0, 0.7),
            run("b", "x", 0, 0.6),
            run("b", "y", 0, 0.8),
            run("a", "x", 1, 0.5),
            run("a", "y", 1, 0.5),
            run("b", "x", 1, 0.7),
            run("b", "y", 1, 0.7),
            run("a", "x", 2, 0.9),
            run("a", "y", 2, 0.9),
            run("b", "x", 2, 0.1),
        ];
        let rows = paired(&results);
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!((row.algorithm.as_str(), row.baseline.as_str()), ("b", "a"));
        assert_eq!((row.seeds, row.wins), (2, 2));
        assert!((row.mean - 15.0).abs() < 1e-4, "{row:?}");
        let half = 12.706 * (50f64 / 2.0).sqrt();
        assert!((row.high - row.mean - half).abs() < 1e-3, "{row:?}");
        assert!(paired_markdown(&rows).contains("| b − a | +15.0 |"));
    }
}
