//! `fedge bench fleet`: flags and report of [`fedge::bench::fleet`]; fails when an update was
//! lost or rejected.

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench fleet`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FleetArgs {
    /// Simulated devices.
    #[arg(long, default_value_t = 200)]
    pub devices: usize,
    /// Rounds to watch.
    #[arg(long, default_value_t = 3)]
    pub rounds: u64,
    /// Broker URL of the federation.
    #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
    pub broker: String,
    /// Federation name.
    #[arg(long, default_value = "fleet")]
    pub federation: String,
    /// The coordinator's keys file, when it authenticates devices (`fleet-00000` …).
    #[arg(long)]
    pub keys: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Runs the fleet against the coordinator and prints what it used of each round.
pub async fn run(args: FleetArgs) -> anyhow::Result<()> {
    use fedge::bench::fleet::{FleetOptions, run_fleet};
    let keys = match &args.keys {
        Some(path) => fedge_coordinator::store::keys::load(path)?,
        None => Default::default(),
    };
    let options = FleetOptions {
        broker: fedge_mqtt::BrokerConfig::parse_url(&args.broker)?,
        federation: args.federation.clone(),
        devices: args.devices,
        rounds: args.rounds,
        timeout: std::time::Duration::from_secs(args.timeout_s),
        keys: keys.into_iter().collect(),
    };
    let report = run_fleet(&options).await?;
    println!("round  selected  reported  rejected  seconds  MB up");
    for r in &report.rounds {
        println!(
            "{:5}  {:8}  {:8}  {:8}  {:7.2}  {:5.1}",
            r.round,
            r.selected,
            r.reported,
            r.rejected,
            r.seconds,
            r.bytes_up as f64 / 1e6
        );
    }
    let reported: u64 = report.rounds.iter().map(|r| r.reported).sum();
    println!(
        "{} devices, {} updates sent, {} used by the coordinator, {:.1} s",
        report.devices, report.updates_sent, reported, report.seconds
    );
    args.json.write(&report)?;
    anyhow::ensure!(
        report
            .rounds
            .iter()
            .all(|r| r.reported == r.selected && r.rejected == 0)
            && reported == report.updates_sent,
        "updates were lost or rejected"
    );
    Ok(())
}
