//! `fedge-edge`: the device agent binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use fedge_edge::config::EdgeConfig;

#[derive(Parser)]
#[command(
    name = "fedge-edge",
    version,
    about = "Trains a fedge head on local data and reports to the coordinator over MQTT"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Join the federation and train when selected, until Ctrl-C.
    Run {
        /// Device profile TOML (see firmware-configs/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Load the profile, backbone and data, print what the device would train on, and exit.
    Check {
        /// Device profile TOML.
        #[arg(long)]
        config: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    match cli.command {
        Command::Run { config } => {
            let setup = EdgeConfig::load(&config)?.setup()?;
            tracing::info!(
                client = %setup.client_id,
                train = setup.train.len(),
                val = setup.val.len(),
                backbone = %setup.backbone,
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
        }
        Command::Check { config } => {
            let setup = EdgeConfig::load(&config)?.setup()?;
            println!(
                "{}: backbone {} ({} features), {} train / {} validation samples, {} classes, head of {} parameters",
                setup.client_id,
                setup.backbone,
                setup.head.features,
                setup.train.len(),
                setup.val.len(),
                setup.head.classes,
                setup.head.num_params()
            );
        }
    }
    Ok(())
}
