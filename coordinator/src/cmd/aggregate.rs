//! `fedge-coordinator aggregate`: one aggregation re-run offline from `.npy` files.

use std::path::PathBuf;

use anyhow::Context;
use fedge_coordinator::replay::{self, npy};
use fedge_coordinator::strategy::{SolverKind, StrategyKind};

#[derive(clap::Args)]
pub struct Args {
    /// fedavg or fedomg.
    #[arg(long, value_enum, default_value_t = StrategyKind::Fedomg)]
    pub strategy: StrategyKind,
    /// FedOMG's conflict-averse radius κ.
    #[arg(long, default_value_t = 0.5)]
    pub kappa: f64,
    /// Server learning rate in FedAvg units (the authors' η is global_lr × N).
    #[arg(long, default_value_t = 1.0)]
    pub global_lr: f64,
    /// FedOMG's solver: reference or converged.
    #[arg(long, value_enum, default_value_t = SolverKind::Reference)]
    pub solver: SolverKind,
    /// Global parameters (G.npy, f32, 1-D).
    #[arg(long, value_name = "G.npy")]
    pub global: PathBuf,
    /// Directory of <client>.npy deltas and counts.json.
    #[arg(long, value_name = "DIR")]
    pub deltas: PathBuf,
    /// Where to write the new global parameters.
    #[arg(long, value_name = "NEW.npy")]
    pub out: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, value_name = "REPORT.json")]
    pub report: Option<PathBuf>,
}

/// Runs it.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = fedge_coordinator::strategy::StrategyConfig {
        strategy: args.strategy,
        kappa: args.kappa,
        global_lr: args.global_lr,
        solver: args.solver,
        ..Default::default()
    };
    let (params, report) = replay::aggregate_files(&config, &args.global, &args.deltas)?;
    npy::write_f32(&args.out, &params)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.report {
        std::fs::write(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{json}");
    Ok(())
}
