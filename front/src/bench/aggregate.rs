//! `fedge bench aggregate`: the coordinator's aggregation cost against a numpy transcription of
//! the same step (`bench/fedomg_numpy.py`), side by side in one run.
//!
//! For each (N, M), fedge holds N random deltas the way a round does: the first N−1 arrive
//! (dot products streamed in blocks), then the clock that matters starts: the last update
//! arrives, the round finishes its dot products, solves and applies the weighted sum. That is
//! the end-of-round latency. Total CPU covers all N arrivals and the close. numpy gets the
//! whole N×M matrix at once and runs its whole step; its wall and CPU time are reported.
//!
//! Like the round machine, fedge reuses the previous round's delta arena, so the timed rounds
//! are steady-state rounds (the first, untimed, faults the memory in).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use fedge_coordinator::strategy::FedOmg;
use fedge_coordinator::strategy::{FedAvg, Strategy};
use fedge_coordinator::updates::{Arena, RoundUpdates, UpdatesConfig};
use rand::{Rng, SeedableRng};

/// One (N, M) measurement; times in seconds, medians over the repeats.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AggregateBench {
    /// Clients.
    pub n: usize,
    /// Parameters.
    pub m: usize,
    /// FedAvg: last arrival to new model.
    pub fedavg_close_s: f64,
    /// FedOMG: last arrival to new model.
    pub fedomg_close_s: f64,
    /// FedOMG: CPU time of all arrivals and the close, mean over the runs (None off Linux).
    pub fedomg_cpu_s: Option<f64>,
    /// FedOMG: wall time of all arrivals and the close.
    pub fedomg_total_s: f64,
    /// numpy's whole step, wall.
    pub numpy_wall_s: Option<f64>,
    /// numpy's whole step, CPU.
    pub numpy_cpu_s: Option<f64>,
}

/// Process CPU time (user + system, all threads) from `/proc/self/stat`, in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0) // USER_HZ is 100 on Linux
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One close: `held` already has N−1 updates; push the last, finish, aggregate. Returns the
/// time, the new parameters and the arena for the next round.
fn close(
    strategy: &mut dyn Strategy,
    mut held: RoundUpdates,
    last: &[f32],
    global: &[f32],
) -> (f64, Vec<f32>, Arena) {
    let t = Instant::now();
    held.push("client-last", 100, last).expect("no budget");
    held.finish();
    let next = strategy.aggregate(global, &held, &[]).params;
    (t.elapsed().as_secs_f64(), next, held.into_arena())
}

/// Measures fedge at (n, m), `repeats` times.
pub fn measure_fedge(n: usize, m: usize, repeats: usize) -> AggregateBench {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let deltas: Vec<f32> = (0..n * m)
        .map(|_| rng.random_range(-0.01f32..0.01))
        .collect();
    let global: Vec<f32> = (0..m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let row = |u: usize| &deltas[u * m..(u + 1) * m];
    let hold = |dots: bool, arena: Arena| {
        let config = UpdatesConfig {
            dots,
            budget_bytes: usize::MAX,
            ..UpdatesConfig::default()
        };
        let mut held = RoundUpdates::reusing(arena, m, n, config);
        for u in 0..n - 1 {
            held.push(&format!("client-{u:04}"), 50 + u as u32, row(u))
                .expect("no budget");
        }
        held
    };
    // Small cases run more often: CPU time is read in 10 ms ticks.
    let repeats = if n * m < 10_000_000 {
        repeats.max(1) * 20
    } else {
        repeats.max(1)
    };
    let (mut avg, mut omg, mut cpu, mut total) = (vec![], vec![], 0.0, vec![]);
    // An untimed round faults the arena in, as the coordinator's first round does.
    let (_, _, mut arena) = close(
        &mut FedAvg,
        hold(false, Arena::default()),
        row(n - 1),
        &global,
    );
    let cpu0 = cpu_seconds();
    for _ in 0..repeats {
        let (t, next, spare) = close(&mut FedAvg, hold(false, arena), row(n - 1), &global);
        std::hint::black_box(next);
        avg.push(t);
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let held = hold(true, spare);
        let (t, next, spare) = close(&mut FedOmg::default(), held, row(n - 1), &global);
        std::hint::black_box(next);
        total.push(t0.elapsed().as_secs_f64());
        if let (Some(c0), Some(c1)) = (c0, cpu_seconds()) {
            cpu += c1 - c0;
        }
        omg.push(t);
        arena = spare;
    }
    AggregateBench {
        n,
        m,
        fedavg_close_s: median(avg),
        fedomg_close_s: median(omg),
        fedomg_cpu_s: cpu0.map(|_| cpu / repeats as f64),
        fedomg_total_s: median(total),
        numpy_wall_s: None,
        numpy_cpu_s: None,
    }
}

/// Why the numpy peer could not be measured; each message says how to get it working.
#[derive(Debug, thiserror::Error)]
pub enum NumpyError {
    /// The interpreter did not start.
    #[error("cannot run {}", python.display())]
    Spawn {
        /// The interpreter.
        python: PathBuf,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// The script exited with an error.
    #[error("{} {} failed (is numpy installed? bench/aggregate.sh makes a venv): {stderr}", python.display(), script.display())]
    Failed {
        /// The interpreter.
        python: PathBuf,
        /// The script.
        script: PathBuf,
        /// What the script said.
        stderr: String,
    },
    /// The script printed something other than its JSON timings.
    #[error("unexpected output from {}", script.display())]
    Output {
        /// The script.
        script: PathBuf,
        /// Why its output is not JSON.
        source: serde_json::Error,
    },
    /// The script's JSON lacks `wall_s` or `cpu_s`.
    #[error("no timings in the output of {}", script.display())]
    NoTimings {
        /// The script.
        script: PathBuf,
    },
}

/// Runs the numpy transcription: its wall and CPU seconds.
pub fn measure_numpy(
    python: &Path,
    script: &Path,
    n: usize,
    m: usize,
    repeats: usize,
) -> Result<(f64, f64), NumpyError> {
    let out = Command::new(python)
        .arg(script)
        .args(["--n", &n.to_string(), "--m", &m.to_string()])
        .args(["--repeats", &repeats.to_string()])
        .output()
        .map_err(|source| NumpyError::Spawn {
            python: python.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(NumpyError::Failed {
            python: python.to_owned(),
            script: script.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|source| NumpyError::Output {
            script: script.to_owned(),
            source,
        })?;
    match (v["wall_s"].as_f64(), v["cpu_s"].as_f64()) {
        (Some(w), Some(c)) => Ok((w, c)),
        _ => Err(NumpyError::NoTimings {
            script: script.to_owned(),
        }),
    }
}

/// The default location of the numpy script, in the repository's `bench/`.
pub fn default_script() -> PathBuf {
    let front = Path::new(env!("CARGO_MANIFEST_DIR"));
    front
        .parent()
        .unwrap_or(front)
        .join("bench/fedomg_numpy.py")
}
