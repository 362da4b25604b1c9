//! `fedge bench rollback`: flags and report of [`fedge::bench::rollback`].

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench rollback`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RollbackArgs {
    /// Simulated devices.
    #[arg(long, default_value_t = 1000)]
    pub devices: usize,
    /// Rounds to train before the rollback (at least 2: a rollback needs a release before).
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
    /// The coordinator's operator key file (`[auth] operator_key_file`).
    #[arg(long)]
    pub operator_key: PathBuf,
    /// Give up after this many seconds (each phase).
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Trains, rolls the fleet back and prints how long its devices took.
pub async fn run(args: RollbackArgs) -> anyhow::Result<()> {
    use fedge::bench::fleet::FleetOptions;
    anyhow::ensure!(
        args.rounds >= 2,
        "--rounds {}: give 2 or more (a rollback needs a release before the last)",
        args.rounds
    );
    let keys = match &args.keys {
        Some(path) => fedge_coordinator::store::keys::load(path)?,
        None => Default::default(),
    };
    let operator = fedge_coordinator::store::keys::load_operator(&args.operator_key)?;
    let options = FleetOptions {
        broker: fedge_mqtt::BrokerConfig::parse_url(&args.broker)?,
        federation: args.federation.clone(),
        devices: args.devices,
        rounds: args.rounds,
        timeout: std::time::Duration::from_secs(args.timeout_s),
        keys: keys.into_iter().collect(),
    };
    let report = fedge::bench::rollback::run_rollback(&options, &operator).await?;
    println!(
        "rollback of {} devices from round {} to round {}: {} switched; p50 {:.3} s, p99 {:.3} s, \
         slowest {:.3} s (ctl saw it in {:.3} s)",
        report.devices,
        report.from_round,
        report.to_round,
        report.switched,
        report.p50_s,
        report.p99_s,
        report.max_s,
        report.ctl_s
    );
    args.json.write(&report)?;
    anyhow::ensure!(
        report.switched == report.devices,
        "{} of {} devices did not switch",
        report.devices - report.switched,
        report.devices
    );
    Ok(())
}
