//! `fedge bench buffered`: buffered asynchronous aggregation (FedBuff) against synchronous
//! rounds, side by side in the simulator (the real round machine and agent machines, real
//! training, virtual time) on rotated digits split into many devices (`multi`), under the
//! straggler mix of [`crate::eval::Pace`]: 70 % of the devices at nominal speed, 20 % five times
//! slower, 10 % twenty times slower, and 30 % of them away in random windows.
//!
//! Three arms per seed, with the same devices, data, speeds and absences:
//!
//! - `synchronous`: rounds of `sample` devices with fedge's default 60 s deadline (virtual) and
//!   the whole sample as quorum: the slowest selected device sets each round's pace.
//! - `synchronous/deadline`: the same with a 3 s deadline (three nominal trainings) and half
//!   the sample as quorum: stragglers' work is dropped instead of waited for.
//! - `buffered`: `sample` devices training at once, a version every `buffer_size` updates,
//!   as many updates in all as the synchronous arms (`rounds × sample / buffer_size` versions).
//!
//! Reported per arm: the held-out domain's accuracy after the last aggregation, the virtual
//! time of that aggregation, and the time to reach the `synchronous` arm's final accuracy
//! minus one point (never reached: none), with the updates applied and refused by reason.

use fedge_coordinator::buffer::AggregationConfig;

use crate::eval::{self, BenchOptions, Pace, Prepared, RunResult, RunSpec, Scenario, SiteOptions};

/// The benchmark's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BufferedOptions {
    /// The seeds; seed `s` holds out domain `s mod domains`.
    pub seeds: Vec<u64>,
    /// Devices per source domain.
    pub clients_per_domain: usize,
    /// Devices per synchronous round, and devices training at once when buffered.
    pub sample: usize,
    /// Synchronous rounds.
    pub rounds: u64,
    /// Buffered: updates per version.
    pub buffer_size: usize,
    /// Buffered: most versions an update may lag.
    pub max_staleness: u64,
    /// Local epochs per training.
    pub local_epochs: u32,
    /// Devices away in random windows.
    pub offline: bool,
    /// Whole domains slow instead of devices at random ([`Pace::slow_domains`]).
    pub slow_domains: bool,
    /// Buffered: the staleness weight.
    pub staleness: fedge_coordinator::buffer::StalenessWeight,
    /// Buffered: the participation weight.
    pub participation: fedge_coordinator::buffer::ParticipationWeight,
}

/// One arm: a name and how it aggregates.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// `synchronous`, `synchronous/deadline` or `buffered`.
    pub name: &'static str,
    /// Its pace and aggregation.
    pub pace: Pace,
    /// Aggregations it runs.
    pub rounds: u64,
}

/// One arm's run with one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmRun {
    /// The arm's name.
    pub arm: &'static str,
    /// The run.
    pub run: RunResult,
}

impl ArmRun {
    /// Virtual ms of the last aggregation.
    pub fn end_ms(&self) -> u64 {
        self.run.curve.last().map_or(0, |s| s.at_ms)
    }

    /// Virtual ms of the first aggregation whose held-out accuracy reaches `accuracy`.
    pub fn reach_ms(&self, accuracy: f32) -> Option<u64> {
        (self.run.curve.iter())
            .find(|s| s.target_accuracy >= accuracy)
            .map(|s| s.at_ms)
    }

    /// Updates aggregated.
    pub fn applied(&self) -> usize {
        self.run.curve.iter().map(|s| s.clients).sum()
    }
}

/// The three arms.
pub fn arms(options: &BufferedOptions) -> Vec<Arm> {
    let pace = |aggregation, round_timeout_ms| Pace {
        aggregation,
        round_timeout_ms,
        stragglers: true,
        offline: options.offline,
        slow_domains: options.slow_domains,
    };
    let sync = AggregationConfig::default;
    let mut buffered =
        AggregationConfig::buffered(options.buffer_size, options.sample, options.max_staleness);
    buffered.concurrency = options.sample;
    buffered.staleness = options.staleness;
    buffered.participation = options.participation;
    let updates = options.rounds * options.sample as u64;
    vec![
        Arm {
            name: "synchronous",
            pace: pace(sync(), Some(60_000)),
            rounds: options.rounds,
        },
        Arm {
            name: "synchronous/deadline",
            pace: pace(sync(), Some(3 * eval::NOMINAL_TRAIN_MS)),
            rounds: options.rounds,
        },
        Arm {
            name: "buffered",
            pace: pace(buffered, None),
            rounds: updates.div_ceil(options.buffer_size.max(1) as u64),
        },
    ]
}

/// Every arm with every seed, in parallel; `progress` hears each finished run.
pub fn run(
    prepared: &Prepared,
    options: &BufferedOptions,
    progress: impl Fn(&ArmRun) + Sync,
) -> anyhow::Result<Vec<ArmRun>> {
    let algorithm = eval::parse_algorithm("fedavg")?;
    let head =
        fedge_models::HeadConfig::new(prepared.feature_size, prepared.classes).with_hidden(64);
    let arms = arms(options);
    let cases: Vec<(u64, &Arm)> = (options.seeds.iter().copied())
        .flat_map(|seed| arms.iter().map(move |arm| (seed, arm)))
        .collect();
    eval::in_parallel(&cases, |&(seed, arm)| {
        let domains = prepared.split(seed);
        let bench = BenchOptions {
            scenario: Scenario::Multi {
                clients_per_domain: options.clients_per_domain,
                sample: options.sample,
            },
            rounds: arm.rounds,
            seeds: vec![seed],
            local_epochs: options.local_epochs,
            hidden: 64,
            site: SiteOptions::transductive(),
            pace: arm.pace.clone(),
        };
        let spec = RunSpec {
            algorithm: &algorithm,
            domains: &domains,
            target: seed as usize % domains.len(),
            seed,
            head: &head,
            tail: None,
            options: &bench,
        };
        let run = ArmRun {
            arm: arm.name,
            run: eval::run_one(&spec, |_| {})?,
        };
        progress(&run);
        Ok(run)
    })
}

/// One arm's figures over the seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmSummary {
    /// The arm.
    pub arm: &'static str,
    /// Seeds.
    pub seeds: usize,
    /// Final held-out accuracy in %, mean and 95 % half-width.
    pub final_accuracy: (f64, f64),
    /// Final accuracy minus `synchronous`'s, paired by seed, in points: mean and half-width.
    pub final_gain: (f64, f64),
    /// Virtual seconds to the last aggregation, mean.
    pub end_s: f64,
    /// Seeds whose run reached `synchronous`'s final accuracy minus one point.
    pub reached: usize,
    /// Virtual seconds to get there (seeds that did), mean.
    pub reach_s: f64,
    /// That time over `synchronous`'s time to its last aggregation, per seed (seeds that
    /// reached): mean and half-width.
    pub reach_ratio: (f64, f64),
    /// Updates aggregated per run, mean.
    pub applied: f64,
    /// Updates refused per run, by reason, mean.
    pub rejected: std::collections::BTreeMap<String, f64>,
}

/// The comparison: every run and the per-arm summaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Each arm's summary, in the order of [`arms`].
    pub arms: Vec<ArmSummary>,
}

impl Report {
    /// The summaries of `runs`.
    pub fn of(runs: &[ArmRun]) -> Self {
        let mut names: Vec<&'static str> = Vec::new();
        for r in runs {
            if !names.contains(&r.arm) {
                names.push(r.arm);
            }
        }
        let sync = |seed: u64| {
            runs.iter()
                .find(|r| r.arm == "synchronous" && r.run.seed == seed)
        };
        let arms = names
            .into_iter()
            .map(|arm| {
                let mine: Vec<&ArmRun> = runs.iter().filter(|r| r.arm == arm).collect();
                let finals: Vec<f64> = mine
                    .iter()
                    .map(|r| f64::from(r.run.final_target_accuracy) * 100.0)
                    .collect();
                let mut gains = Vec::new();
                let mut ratios = Vec::new();
                let mut reach = Vec::new();
                for r in &mine {
                    let Some(base) = sync(r.run.seed) else {
                        continue;
                    };
                    gains.push(
                        f64::from(r.run.final_target_accuracy - base.run.final_target_accuracy)
                            * 100.0,
                    );
                    let goal = base.run.final_target_accuracy - 0.01;
                    if let Some(at) = r.reach_ms(goal) {
                        reach.push(at as f64 / 1000.0);
                        ratios.push(at as f64 / base.end_ms().max(1) as f64);
                    }
                }
                let n = mine.len().max(1) as f64;
                let mut rejected = std::collections::BTreeMap::new();
                for r in &mine {
                    for (reason, count) in &r.run.rejected {
                        *rejected.entry(reason.clone()).or_insert(0.0) += *count as f64 / n;
                    }
                }
                let interval = |v: &[f64]| eval::interval(v).unwrap_or((f64::NAN, f64::NAN));
                ArmSummary {
                    arm,
                    seeds: mine.len(),
                    final_accuracy: interval(&finals),
                    final_gain: interval(&gains),
                    end_s: mine.iter().map(|r| r.end_ms() as f64 / 1000.0).sum::<f64>() / n,
                    reached: reach.len(),
                    reach_s: reach.iter().sum::<f64>() / reach.len().max(1) as f64,
                    reach_ratio: interval(&ratios),
                    applied: mine.iter().map(|r| r.applied() as f64).sum::<f64>() / n,
                    rejected,
                }
            })
            .collect();
        Self { arms }
    }

    /// The summaries as a Markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| arm | seeds | final held-out accuracy (%) | − synchronous (points) | virtual time to last \
             aggregation (s) | reached sync final − 1 pt | time to it (s) | over sync's total time | \
             updates applied | refused |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for a in &self.arms {
            let refused: Vec<String> = (a.rejected.iter())
                .map(|(r, n)| format!("{r} {n:.1}"))
                .collect();
            out.push_str(&format!(
                "| {} | {} | {:.1} ± {:.1} | {:+.1} ± {:.1} | {:.0} | {}/{} | {:.0} | {:.2} ± {:.2} | {:.0} | {} |\n",
                a.arm,
                a.seeds,
                a.final_accuracy.0,
                a.final_accuracy.1,
                a.final_gain.0,
                a.final_gain.1,
                a.end_s,
                a.reached,
                a.seeds,
                a.reach_s,
                a.reach_ratio.0,
                a.reach_ratio.1,
                a.applied,
                if refused.is_empty() { "none".to_owned() } else { refused.join(", ") },
            ));
        }
        out
    }
}
