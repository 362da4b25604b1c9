//! Offline replay of one aggregation from files (`fedge-coordinator aggregate`): a saved
//! round re-run with other settings, through exactly the strategy code the coordinator runs.
//!
//! Inputs: the global parameters `G.npy`; a directory with one `<client>.npy` delta per client
//! and `counts.json` (`{"<client>": samples}`). Every input problem is an error naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod npy;

use crate::strategy::{BuildError, Strategy, StrategyConfig, StrategyKind};
use crate::updates::RoundUpdates;
use npy::NpyFileError;

/// What the replay reports (`--report`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Strategy name.
    pub strategy: String,
    /// FedOMG's solver.
    pub solver: Option<String>,
    /// Clients aggregated.
    pub n_clients: usize,
    /// FedOMG's `Γ*` per client (empty for FedAvg).
    pub gamma: BTreeMap<String, f64>,
    /// FedOMG's objective at `Γ*`.
    pub objective: Option<f64>,
    /// FedOMG's `λ`.
    pub lambda: Option<f64>,
}

/// A replay that cannot run; every message names the file to fix.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A strategy that needs state the files do not hold.
    #[error("replay supports fedavg and fedomg, not {0} (server momentum needs the saved buffer)")]
    Unsupported(StrategyKind),
    /// The strategy's parameters.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A `.npy` file.
    #[error(transparent)]
    Npy(#[from] NpyFileError),
    /// File system error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `counts.json` is not a map of client to sample count.
    #[error("{}: {source} (expected {{\"<client>\": sample_count}})", path.display())]
    Counts {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// Anything else wrong with the files: which file, and what.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

fn invalid(path: &Path, message: String) -> ReplayError {
    ReplayError::Invalid {
        path: path.to_owned(),
        message,
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReplayError {
    let path = path.to_owned();
    move |source| ReplayError::Io { path, source }
}

/// Runs one aggregation from the files; returns the new parameters and the report.
pub fn aggregate_files(
    config: &StrategyConfig,
    global: &Path,
    deltas: &Path,
) -> Result<(Vec<f32>, ReplayReport), ReplayError> {
    if !matches!(config.strategy, StrategyKind::Fedavg | StrategyKind::Fedomg) {
        return Err(ReplayError::Unsupported(config.strategy));
    }
    let mut strategy = config.build()?;
    let theta = npy::read_f32(global)?;
    let counts_path = deltas.join("counts.json");
    let text = std::fs::read_to_string(&counts_path).map_err(io(&counts_path))?;
    let counts: BTreeMap<String, u32> =
        serde_json::from_str(&text).map_err(|source| ReplayError::Counts {
            path: counts_path.clone(),
            source,
        })?;
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(deltas).map_err(io(deltas))? {
        let path = entry.map_err(io(deltas))?.path();
        if path.extension().is_some_and(|e| e == "npy") {
            let client = path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or_else(|| invalid(&path, "file name is not UTF-8".into()))?
                .to_owned();
            files.insert(client, path);
        }
    }
    if files.is_empty() {
        return Err(invalid(deltas, "no <client>.npy deltas found".into()));
    }
    let mut held = Vec::new();
    for (client, path) in &files {
        let n = *counts.get(client).ok_or_else(|| {
            let shown = counts_path.display();
            invalid(
                path,
                format!("no sample count for client {client:?} in {shown}"),
            )
        })?;
        let delta = npy::read_f32(path)?;
        if delta.len() != theta.len() {
            let (got, shown, want) = (delta.len(), global.display(), theta.len());
            return Err(invalid(
                path,
                format!("{got} values, but {shown} holds {want}"),
            ));
        }
        if let Some(i) = delta.iter().position(|v| !v.is_finite()) {
            return Err(invalid(path, format!("value {i} is not finite")));
        }
        held.push((client.clone(), n, delta));
    }
    if let Some(extra) = counts.keys().find(|c| !files.contains_key(*c)) {
        let message = format!("client {extra:?} has a count but no {extra}.npy");
        return Err(invalid(&counts_path, message));
    }
    if held.iter().all(|(_, n, _)| *n == 0) {
        return Err(invalid(&counts_path, "all sample counts are zero".into()));
    }
    let updates = RoundUpdates::from_updates(
        theta.len(),
        strategy.needs_dots(),
        held.iter().map(|(c, n, d)| (c.as_str(), *n, d.as_slice())),
    );
    let result = strategy.aggregate(&theta, &updates, &[]);
    let report = ReplayReport {
        strategy: strategy.name().to_owned(),
        solver: result.report.solver.clone(),
        n_clients: updates.len(),
        gamma: result.report.gamma,
        objective: result.report.objective,
        lambda: result.report.lambda,
    };
    Ok((result.params, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of docs/algorithms.md §2 as files: equal counts make `p_u = 1/3`, so the
    /// deltas are `3·g_u`; `η_ref = 0.5` is `global_lr = 0.5 / 3`.
    pub(crate) fn worked_example(dir: &Path) {
        let g = [
            [1.0f32, 0.0, 0.5, -0.2],
            [0.0, 1.0, 0.5, 0.1],
            [-0.3, 0.2, 1.0, 0.0],
        ];
        let deltas = dir.join("deltas");
        std::fs::create_dir_all(&deltas).unwrap();
        npy::write_f32(&dir.join("global.npy"), &[0.1, -0.2, 0.3, 0.4]).unwrap();
        for (i, row) in g.iter().enumerate() {
            let delta: Vec<f32> = row.iter().map(|x| x * 3.0).collect();
            npy::write_f32(&deltas.join(format!("site-{i}.npy")), &delta).unwrap();
        }
        std::fs::write(
            deltas.join("counts.json"),
            r#"{"site-0": 100, "site-1": 100, "site-2": 100}"#,
        )
        .unwrap();
    }

    #[test]
    fn the_worked_example_is_reproduced_through_files() {
        let dir = tempfile::tempdir().unwrap();
        worked_example(dir.path());
        let config = StrategyConfig {
            strategy: crate::strategy::StrategyKind::Fedomg,
            global_lr: 0.5 / 3.0,
            ..StrategyConfig::default()
        };
        let (theta, report) = aggregate_files(
            &config,
            &dir.path().join("global.npy"),
            &dir.path().join("deltas"),
        )
        .unwrap();
        let want = [0.2779579292, -0.0120674882, 0.7010115382, 0.3665870888];
        for (got, want) in theta.iter().zip(want) {
            assert!(
                ((*got as f64) - want).abs() < 1e-6 * want.abs(),
                "{theta:?}"
            );
        }
        let gamma: Vec<f64> = report.gamma.values().copied().collect();
        for (got, want) in gamma.iter().zip([0.5502149834, 0.0672155945, 0.3825694221]) {
            assert!((got - want).abs() < 1e-6 * want, "{gamma:?}");
        }
        assert!((report.objective.unwrap() - 0.7856505870).abs() < 1e-6);
        assert_eq!(report.n_clients, 3);
    }

    #[test]
    fn mismatched_inputs_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        worked_example(dir.path());
        let global = dir.path().join("global.npy");
        let deltas = dir.path().join("deltas");
        let config = StrategyConfig::default();
        npy::write_f32(&deltas.join("site-1.npy"), &[1.0, 2.0]).unwrap();
        let err = aggregate_files(&config, &global, &deltas).unwrap_err();
        assert!(
            err.to_string().contains("site-1.npy") && err.to_string().contains("2 values"),
            "{err}"
        );
        npy::write_f32(&deltas.join("site-1.npy"), &[1.0; 4]).unwrap();
        npy::write_f32(&deltas.join("site-9.npy"), &[1.0; 4]).unwrap();
        let err = aggregate_files(&config, &global, &deltas).unwrap_err();
        assert!(
            err.to_string().contains("site-9.npy") && err.to_string().contains("no sample count"),
            "{err}"
        );
        std::fs::remove_file(deltas.join("site-9.npy")).unwrap();
        std::fs::write(deltas.join("counts.json"), "[1, 2]").unwrap();
        let err = aggregate_files(&config, &global, &deltas).unwrap_err();
        assert!(err.to_string().contains("counts.json"), "{err}");
        std::fs::write(deltas.join("site-0.npy"), b"not numpy").unwrap();
        let momentum = StrategyConfig {
            strategy: crate::strategy::StrategyKind::Fedavgm,
            ..StrategyConfig::default()
        };
        assert!(
            aggregate_files(&momentum, &global, &deltas)
                .unwrap_err()
                .to_string()
                .contains("fedavg and fedomg")
        );
    }
}
