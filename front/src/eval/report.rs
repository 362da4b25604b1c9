//! What a benchmark prints and writes: the summary over seeds, the Markdown table, the JSON
//! report and the data of the two plots.

use super::RunResult;

/// Mean and sample standard deviation.
pub fn mean_std(values: &[f32]) -> (f32, f32) {
    let n = values.len().max(1) as f32;
    let mean = values.iter().sum::<f32>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Per algorithm (in order of appearance): per target domain the mean and std over seeds of
/// the target accuracy, and the mean and std over seeds of the per-seed average; in percent.
pub struct Summary {
    /// Target domains, in order of appearance.
    pub targets: Vec<String>,
    /// One row per algorithm.
    pub rows: Vec<SummaryRow>,
}

/// One algorithm's line of a [`Summary`].
pub struct SummaryRow {
    /// Algorithm name.
    pub algorithm: String,
    /// Per target domain: mean and std over seeds (percent).
    pub cells: Vec<(f32, f32)>,
    /// Mean and std over seeds of the per-seed average (percent).
    pub average: (f32, f32),
    /// The same for the target accuracy after the last round, whatever source validation says.
    pub last: (f32, f32),
    /// The same for the best target accuracy of any round: an oracle that looks at the held-out
    /// site's labels, an upper bound on any selection by source validation.
    pub oracle: (f32, f32),
    /// Mean seconds of local training per round (summed over the round's clients), when the
    /// runs timed it.
    pub train_seconds: Option<f64>,
}

/// The row whose training cost is the reference of the cost ratios: plain cross-entropy with
/// FedAvg (`fedavg` or `ce`).
pub const COST_REFERENCE: [&str; 2] = ["fedavg", "ce"];

/// Summarises runs over seeds.
pub fn summarise(results: &[RunResult]) -> Summary {
    let mut algorithms: Vec<&str> = Vec::new();
    let mut targets: Vec<&str> = Vec::new();
    for r in results {
        if !algorithms.contains(&r.algorithm.as_str()) {
            algorithms.push(&r.algorithm);
        }
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let rows = algorithms
        .iter()
        .map(|a| {
            // Per seed: (selected, last round, oracle) target accuracy of each target.
            let mut per_seed: std::collections::BTreeMap<u64, Vec<[f32; 3]>> = Default::default();
            let cells = targets
                .iter()
                .map(|t| {
                    let accs: Vec<f32> = results
                        .iter()
                        .filter(|r| r.algorithm == *a && r.target == *t)
                        .map(|r| {
                            let oracle = (r.curve.iter())
                                .map(|c| c.target_accuracy)
                                .fold(r.target_accuracy, f32::max);
                            per_seed.entry(r.seed).or_default().push([
                                r.target_accuracy,
                                r.final_target_accuracy,
                                oracle,
                            ]);
                            r.target_accuracy * 100.0
                        })
                        .collect();
                    mean_std(&accs)
                })
                .collect();
            let average = |k: usize| {
                let averages: Vec<f32> = (per_seed.values())
                    .map(|v| v.iter().map(|x| x[k]).sum::<f32>() / v.len() as f32 * 100.0)
                    .collect();
                mean_std(&averages)
            };
            let timed: Vec<f64> = results
                .iter()
                .filter(|r| r.algorithm == *a && r.train_seconds_per_round.is_finite())
                .map(|r| r.train_seconds_per_round)
                .collect();
            SummaryRow {
                algorithm: a.to_string(),
                cells,
                average: average(0),
                last: average(1),
                oracle: average(2),
                train_seconds: (!timed.is_empty())
                    .then(|| timed.iter().sum::<f64>() / timed.len() as f64),
            }
        })
        .collect();
    Summary {
        targets: targets.iter().map(|t| t.to_string()).collect(),
        rows,
    }
}

/// The results as a Markdown table: rows are algorithms, columns target domains and the
/// average, cells `mean ± std` over seeds of the target accuracy at the round source
/// validation selects (percent; the mean alone from one seed, which has no spread to show),
/// then as DomainBed reports beside it the average after the last round and the oracle's (the
/// best round by the held-out site's own labels, an upper bound); when the runs were
/// timed, a last column with the local training time per round and its ratio to plain
/// cross-entropy ([`COST_REFERENCE`]).
pub fn markdown(results: &[RunResult]) -> String {
    let summary = summarise(results);
    let timed = summary.rows.iter().any(|r| r.train_seconds.is_some());
    let reference = summary
        .rows
        .iter()
        .find(|r| COST_REFERENCE.contains(&r.algorithm.as_str()))
        .and_then(|r| r.train_seconds);
    let mut out = format!(
        "| algorithm | {} | average | last round | oracle |{}\n|---|",
        summary.targets.join(" | "),
        if timed {
            " train s/round (× CE) |"
        } else {
            ""
        }
    );
    out.push_str(&"---|".repeat(summary.targets.len() + 3 + usize::from(timed)));
    out.push('\n');
    let seeds: std::collections::BTreeSet<u64> = results.iter().map(|r| r.seed).collect();
    let cell = |m: f32, s: f32| match seeds.len() {
        0 | 1 => format!("{m:.1}"),
        _ => format!("{m:.1} ± {s:.1}"),
    };
    for row in &summary.rows {
        let (a, (m, s)) = (&row.algorithm, row.average);
        out.push_str(&format!("| {a} |"));
        for (cm, cs) in &row.cells {
            out.push_str(&format!(" {} |", cell(*cm, *cs)));
        }
        out.push_str(&format!(" **{}** |", cell(m, s)));
        for (m, s) in [row.last, row.oracle] {
            out.push_str(&format!(" {} |", cell(m, s)));
        }
        if timed {
            match (row.train_seconds, reference) {
                (Some(t), Some(r)) if r > 0.0 => {
                    out.push_str(&format!(" {t:.2} ({:.1}×) |", t / r))
                }
                (Some(t), _) => out.push_str(&format!(" {t:.2} |")),
                (None, _) => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    out.push_str(&rejections(results));
    out.push_str(&stopped(results));
    out
}

/// Below the table, when runs ended before their last round: which, and why. Their cells
/// count the rounds they had (a run that stopped in its first round scores 0).
fn stopped(results: &[RunResult]) -> String {
    let lines: Vec<String> = (results.iter())
        .filter_map(|r| {
            let why = r.stopped.as_ref()?;
            Some(format!(
                "- {}, {} held out, seed {}: {why}",
                r.algorithm, r.target, r.seed
            ))
        })
        .collect();
    match lines.is_empty() {
        true => String::new(),
        false => format!(
            "\nRuns that stopped before their last round (declined by their devices, or their updates rejected):\n{}\n",
            lines.join("\n")
        ),
    }
}

/// Below the table, when the coordinators rejected updates: per algorithm, the reasons and
/// their counts summed over its runs (as the coordinator counts them in the field).
fn rejections(results: &[RunResult]) -> String {
    let mut by_algorithm: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, u64>> =
        Default::default();
    for r in results {
        for (reason, n) in &r.rejected {
            *(by_algorithm.entry(&r.algorithm).or_default())
                .entry(reason)
                .or_default() += n;
        }
    }
    let lines: Vec<String> = (by_algorithm.iter())
        .map(|(algorithm, reasons)| {
            let counts: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
            format!("- {algorithm}: {}", counts.join(", "))
        })
        .collect();
    match lines.is_empty() {
        true => String::new(),
        false => format!(
            "\nUpdates the coordinators rejected (summed over runs):\n{}\n",
            lines.join("\n")
        ),
    }
}

/// The bars of `fedge eval --plot`.
pub fn plot_bars(results: &[RunResult]) -> Vec<crate::plot::Bar> {
    summarise(results)
        .rows
        .into_iter()
        .map(|row| crate::plot::Bar {
            label: row.algorithm,
            mean: row.average.0,
            std: row.average.1,
            domains: row.cells.iter().map(|(m, _)| *m).collect(),
        })
        .collect()
}

/// The lines of `fedge eval --plot`, one per algorithm (in order of appearance): after each
/// round (from 1), each seed's target accuracy averaged over its targets (percent), then the
/// mean over seeds and the lowest and highest seed, drawn as the line's band. A round no run of
/// a seed scored leaves that seed out of the round; a round no seed scored is NaN (a gap).
pub fn curves(results: &[RunResult]) -> Vec<crate::plot::Curve> {
    // Per algorithm, per seed, per round: the sum and count of the targets' accuracies.
    type PerSeed = std::collections::BTreeMap<u64, Vec<(f32, u32)>>;
    let mut algorithms: Vec<(&str, PerSeed)> = Vec::new();
    for r in results {
        let at = match algorithms.iter().position(|(a, _)| *a == r.algorithm) {
            Some(at) => at,
            None => {
                algorithms.push((&r.algorithm, PerSeed::new()));
                algorithms.len() - 1
            }
        };
        let rounds = algorithms[at].1.entry(r.seed).or_default();
        for score in &r.curve {
            let i = score.round.saturating_sub(1) as usize;
            if rounds.len() <= i {
                rounds.resize(i + 1, (0.0, 0));
            }
            rounds[i].0 += score.target_accuracy * 100.0;
            rounds[i].1 += 1;
        }
    }
    algorithms
        .into_iter()
        .map(|(label, seeds)| {
            let len = seeds.values().map(Vec::len).max().unwrap_or(0);
            let (mut points, mut spread) = (Vec::with_capacity(len), Vec::with_capacity(len));
            for i in 0..len {
                let values: Vec<f32> = (seeds.values())
                    .filter_map(|rounds| rounds.get(i))
                    .filter(|(_, n)| *n > 0)
                    .map(|(sum, n)| sum / *n as f32)
                    .collect();
                if values.is_empty() {
                    points.push(f32::NAN);
                    spread.push((f32::NAN, f32::NAN));
                    continue;
                }
                points.push(mean_std(&values).0);
                let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                spread.push((lo, hi));
            }
            crate::plot::Curve {
                label: label.to_owned(),
                points,
                spread,
                seeds: seeds.len(),
            }
        })
        .collect()
}

/// One line of the privacy–utility table: an algorithm at one noise level.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PrivacyRow {
    /// The algorithm without its noise level.
    pub algorithm: String,
    /// The noise multiplier σ (0: without DP).
    pub noise: f64,
    /// Mean ε spent over the runs (None without DP).
    pub epsilon: Option<f64>,
    /// Mean and std over seeds of the per-seed average over targets of the held-out accuracy
    /// after the last round (%). The last round, not the best source-validation one: picking a
    /// round by the devices' validation scores would spend privacy the accountant does not
    /// count.
    pub final_accuracy: (f32, f32),
}

/// The privacy–utility rows of runs named `<algorithm> σ=<noise>` (and the same algorithms
/// without DP), in order of appearance; empty when no run used DP.
pub fn privacy_rows(results: &[RunResult]) -> Vec<PrivacyRow> {
    if results.iter().all(|r| r.epsilon.is_none()) {
        return Vec::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.algorithm.as_str()) {
            names.push(&r.algorithm);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.algorithm == name).collect();
            let mut per_seed: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
            for r in &runs {
                per_seed
                    .entry(r.seed)
                    .or_default()
                    .push(r.final_target_accuracy);
            }
            let averages: Vec<f32> = per_seed
                .values()
                .map(|v| v.iter().sum::<f32>() / v.len() as f32 * 100.0)
                .collect();
            let eps: Vec<f64> = runs.iter().filter_map(|r| r.epsilon).collect();
            let (algorithm, noise) = match name.rsplit_once(" σ=") {
                Some((a, n)) => (a.to_owned(), n.parse().unwrap_or(0.0)),
                None => (name.to_owned(), 0.0),
            };
            PrivacyRow {
                algorithm,
                noise,
                epsilon: (!eps.is_empty()).then(|| eps.iter().sum::<f64>() / eps.len() as f64),
                final_accuracy: mean_std(&averages),
            }
        })
        .collect()
}

/// The privacy–utility rows as a Markdown table.
pub fn privacy_markdown(rows: &[PrivacyRow], delta: f64) -> String {
    let mut out = format!(
        "| algorithm | noise σ | ε (δ = {delta:e}) | held-out accuracy after the last round (%) |\n|---|---|---|---|\n"
    );
    for row in rows {
        let eps = row
            .epsilon
            .map_or("∞ (no DP)".into(), |e| format!("{e:.2}"));
        let (mean, std) = row.final_accuracy;
        out += &format!(
            "| {} | {} | {eps} | {mean:.1} ± {std:.1} |\n",
            row.algorithm, row.noise
        );
    }
    out
}

/// The lines of the privacy–utility chart, one per algorithm.
pub fn tradeoff_lines(rows: &[PrivacyRow]) -> Vec<crate::plot::Tradeoff> {
    let mut lines: Vec<crate::plot::Tradeoff> = Vec::new();
    for row in rows {
        let at = match lines.iter().position(|l| l.label == row.algorithm) {
            Some(at) => at,
            None => {
                lines.push(crate::plot::Tradeoff {
                    label: row.algorithm.clone(),
                    points: Vec::new(),
                    without_dp: None,
                });
                lines.len() - 1
            }
        };
        let (mean, std) = row.final_accuracy;
        match row.epsilon {
            Some(e) => lines[at].points.push((e, mean, std)),
            None => lines[at].without_dp = Some(mean),
        }
    }
    lines
}

/// What a report says about how its runs were made.
#[derive(Debug, Clone)]
pub struct ReportMeta<'a> {
    /// Data set as given on the command line.
    pub dataset: &'a str,
    /// `lodo` or `multi`.
    pub scenario: &'a str,
    /// Backbone card name.
    pub backbone: &'a str,
    /// Rounds per run.
    pub rounds: u64,
    /// Seeds.
    pub seeds: u64,
    /// Local epochs.
    pub local_epochs: u32,
    /// The held-out site's class mix and calibration rows.
    pub site: super::SiteOptions,
}

/// The JSON report of DESIGN.md: `dataset`, `scenario`, `backbone`, `rounds`, `results` (one
/// entry per run with `algorithm`, `target`, `seed`, `target_accuracy`, `best_round`, plus the
/// per-round curve) and `summary` (per algorithm `mean_target_accuracy` and `std` over seeds of
/// the average over targets, as fractions like the per-run accuracies).
pub fn report_json(meta: &ReportMeta, results: &[RunResult]) -> serde_json::Value {
    let summary: Vec<serde_json::Value> = summarise(results)
        .rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "algorithm": row.algorithm,
                "mean_target_accuracy": row.average.0 / 100.0,
                "std": row.average.1 / 100.0,
                "mean_last_round_accuracy": row.last.0 / 100.0,
                "mean_oracle_accuracy": row.oracle.0 / 100.0,
            })
        })
        .collect();
    serde_json::json!({
        "dataset": meta.dataset,
        "scenario": meta.scenario,
        "backbone": meta.backbone,
        "rounds": meta.rounds,
        "seeds": meta.seeds,
        "local_epochs": meta.local_epochs,
        "label_shift": meta.site.label_shift,
        "calibration": meta.site.calibration,
        "results": results,
        "summary": summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FedAvg run on `target` whose held-out accuracy after each round is `curve`, scored
    /// 0.5 at the round source validation picks (round 1) and after the last round.
    fn scored(target: &str, seed: u64, curve: &[f32]) -> RunResult {
        RunResult {
            algorithm: "fedavg".into(),
            target: target.into(),
            seed,
            best_round: 1,
            best_source_val: 0.5,
            target_accuracy: 0.5,
            final_target_accuracy: 0.5,
            curve: (curve.iter().enumerate())
                .map(|(i, a)| super::super::RoundScore {
                    round: i as u64 + 1,
                    source_val: 0.5,
                    target_accuracy: *a,
                    clients: 1,
                    at_ms: 0,
                })
                .collect(),
            train_seconds_per_round: f64::NAN,
            final_params: vec![],
            epsilon: None,
            rejected: Default::default(),
            stopped: None,
        }
    }

    #[test]
    fn mean_and_std_of_seeds() {
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_std(&[1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 2f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn rejected_updates_are_listed_under_the_table() {
        let run = |algorithm: &str, rejected: &[(&str, u64)]| RunResult {
            algorithm: algorithm.into(),
            rejected: rejected.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            ..scored("t", 0, &[])
        };
        let clean = [run("fedavg", &[])];
        assert!(!markdown(&clean).contains("rejected"));
        // One seed has no spread: the mean alone, not "± 0.0".
        assert!(
            markdown(&clean).contains("| 50.0 | **50.0** |"),
            "{}",
            markdown(&clean)
        );
        let results = [
            run("fedavg", &[("norm", 2)]),
            run("fedavg", &[("norm", 1), ("wrong_round", 1)]),
        ];
        let text = markdown(&results);
        assert!(text.contains("- fedavg: norm 3, wrong_round 1"), "{text}");
        assert!(!text.contains("stopped"), "{text}");
        let diverged = RunResult {
            stopped: Some("after round 9: the loss diverged".into()),
            ..run("fedavg[lr=0.1]", &[])
        };
        let text = markdown(&[diverged]);
        assert!(
            text.contains("- fedavg[lr=0.1], t held out, seed 0: after round 9: the loss diverged"),
            "{text}"
        );
    }

    #[test]
    fn the_last_round_and_the_oracle_stand_beside_the_selected_round() {
        // Source validation picks round 2 (target 0.6); the last round scores 0.5; the best
        // round by the target's labels is round 3 (0.8).
        let run = |seed: u64, lift: f32| RunResult {
            best_round: 2,
            target_accuracy: 0.6 + lift,
            final_target_accuracy: 0.5 + lift,
            ..scored("t", seed, &[0.4 + lift, 0.6 + lift, 0.8 + lift, 0.5 + lift])
        };
        let results = [run(0, 0.0), run(1, 0.1)];
        let row = &summarise(&results).rows[0];
        let near = |(m, _): (f32, f32), want: f32| (m - want).abs() < 1e-3;
        assert!(near(row.average, 65.0), "{:?}", row.average);
        assert!(near(row.last, 55.0), "{:?}", row.last);
        assert!(near(row.oracle, 85.0), "{:?}", row.oracle);
        let text = markdown(&results);
        assert!(
            text.starts_with("| algorithm | t | average | last round | oracle |"),
            "{text}"
        );
        assert!(
            text.contains("| **65.0 ± 7.1** | 55.0 ± 7.1 | 85.0 ± 7.1 |"),
            "{text}"
        );
    }

    #[test]
    fn curves_carry_the_mean_and_the_spread_over_seeds() {
        // Seed 0 averages its two targets (0.4 and 0.6 after round 1); seed 1 has one target.
        let results = [
            scored("a", 0, &[0.4, 0.5]),
            scored("b", 0, &[0.6, 0.7]),
            scored("a", 1, &[0.8, 0.9]),
        ];
        let curves = curves(&results);
        assert_eq!(curves.len(), 1);
        let c = &curves[0];
        assert_eq!(c.seeds, 2);
        let near = |a: f32, b: f32| (a - b).abs() < 1e-4;
        assert!(near(c.points[0], 65.0) && near(c.points[1], 75.0), "{c:?}");
        assert!(
            near(c.spread[0].0, 50.0) && near(c.spread[0].1, 80.0),
            "{c:?}"
        );
        assert!(
            near(c.spread[1].0, 60.0) && near(c.spread[1].1, 90.0),
            "{c:?}"
        );
    }
}
