//! `fedge-edge`: the device agent binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fedge_daemon::{LogArgs, init_logs};
use fedge_edge::config::EdgeConfig;

#[derive(Parser)]
#[command(
    name = "fedge-edge",
    version,
    about = "Trains a fedge head on local data and reports to the coordinator over MQTT"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the federation and train when selected, until Ctrl-C.
    Run {
        /// Device profile TOML (see firmware-configs/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a profile and this device: key, TLS files, cache folder, backbone against its
    /// card, data, broker. Prints what to fix; exits with 1 when any check fails.
    Check {
        /// Device profile TOML.
        #[arg(long)]
        config: PathBuf,
        /// Skip the broker (for staging and CI, away from the federation's network).
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a systemd unit that runs this profile, with the memory limits of its
    /// `[resources] memory_budget_mb` (see deploy/fedge-edge.service and docs/deploy.md).
    Unit {
        /// Device profile TOML, where it will live on the device.
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log.log_format, "info");
    match cli.command {
        Command::Run { config } => {
            let config = EdgeConfig::load(&config)?;
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if config.resources.threads > 0 {
                runtime
                    .worker_threads(config.resources.threads)
                    .max_blocking_threads(config.resources.threads);
            }
            runtime.enable_all().build()?.block_on(run(config))?;
        }
        Command::Check { config, dry_run } => {
            let checks = fedge_edge::check::run_checks(&config, dry_run);
            print!("{}", fedge_edge::check::report(&checks));
            let failed = checks.iter().filter(|c| !c.ok).count();
            if failed > 0 {
                eprintln!("{failed} check(s) failed");
                std::process::exit(1);
            }
            println!("{}: ready", config.display());
        }
        Command::Unit { config } => {
            let profile = EdgeConfig::load(&config)?;
            let path = std::path::absolute(&config)?;
            print!(
                "{}",
                fedge_edge::resources::systemd_unit(
                    &path,
                    &profile.resources,
                    profile.device == fedge_models::Accelerator::Cuda
                )
            );
        }
    }
    Ok(())
}

/// The agent until Ctrl-C.
async fn run(config: EdgeConfig) -> anyhow::Result<()> {
    let setup = config.setup()?;
    tracing::info!(
        client = %setup.client_id,
        train = setup.train.len(),
        val = setup.val.len(),
        backbone = %setup.backbone,
        device = %setup.device.name,
        "edge starting"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop_tx.send(true);
    });
    let summary = fedge_edge::run_agent(setup, stop_rx).await?;
    tracing::info!(
        rounds = summary.rounds_trained,
        bytes_up = summary.bytes_up,
        "edge stopped"
    );
    Ok(())
}
