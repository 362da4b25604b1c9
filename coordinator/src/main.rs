//! `fedge-coordinator`: runs a federation against an MQTT broker.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use fedge_coordinator::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::config::CoordinatorConfig;
use fedge_coordinator::{DriverOptions, Rounds, driver};
use fedge_models::HeadConfig;

#[derive(Parser)]
#[command(
    name = "fedge-coordinator",
    version,
    about = "Coordinates a fedge federation over MQTT"
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
    /// Run rounds until the configured number is reached (Ctrl-C stops early).
    Run {
        /// Coordinator TOML file (see coordinator/src/config.rs or README).
        #[arg(long)]
        config: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match cli.command {
        Command::Run { config } => run(config).await,
    }
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rumqttd=off"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(path: PathBuf) -> anyhow::Result<()> {
    let config = CoordinatorConfig::load(&path)?;
    if config.embedded_broker {
        let addr = format!("{}:{}", config.broker.host, config.broker.port)
            .parse()
            .context("embedded_broker needs [broker].host to be an IP address")?;
        let broker = start_embedded(addr, &BrokerLimits::default())?;
        tracing::info!(addr = %broker.addr, "embedded broker listening");
    }
    let head =
        HeadConfig::new(config.head.features, config.head.classes).with_hidden(config.head.hidden);
    let initial = match &config.initial_params {
        Some(file) => read_f32_file(file, head.num_params())?,
        None => head.init_flat(config.seed),
    };
    let strategy = config.strategy.build().map_err(anyhow::Error::msg)?;
    let rounds = Rounds::new(config.round_config(), strategy, initial);
    let options = DriverOptions {
        broker: config.broker.clone(),
        federation: config.federation.clone(),
        client_id: format!("fedge-coordinator-{}", config.federation),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop_tx.send(true);
    });
    tracing::info!(federation = %config.federation, strategy = %config.strategy.strategy, rounds = config.rounds, "coordinator starting");
    let rounds = driver::run(rounds, options, None, None, stop_rx).await?;
    tracing::info!(
        round = rounds.round(),
        phase = rounds.phase().name(),
        "coordinator stopped"
    );
    Ok(())
}

fn read_f32_file(path: &std::path::Path, expected: usize) -> anyhow::Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() == expected * 4,
        "{} holds {} bytes; the head needs {} f32 values ({} bytes)",
        path.display(),
        bytes.len(),
        expected,
        expected * 4
    );
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
