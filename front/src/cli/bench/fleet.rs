//! `fedge bench fleet`: flags and report of [`fedge::bench::fleet`]; fails when an update was
//! lost (neither applied, abandoned with its round, rejected with a reason, nor in the open
//! buffer), and, with devices that answer at once against synchronous rounds, when one was
//! rejected or not used.

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench fleet`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FleetArgs {
    /// Simulated devices.
    #[arg(long, default_value_t = 200)]
    pub devices: usize,
    /// Rounds (model versions in buffered mode) to watch.
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
    /// Milliseconds a device at nominal speed trains before it answers (0: at once).
    #[arg(long, default_value_t = 0)]
    pub train_ms: u64,
    /// The straggler mix: 70 % of the devices at nominal speed, 20 % five times slower, 10 %
    /// twenty times slower.
    #[arg(long)]
    pub stragglers: bool,
    /// 30 % of the devices go away in random windows (online for 20–120 nominal trainings,
    /// away for 10–60, the unit 1 s without --train-ms; their Last Will fires) and come back
    /// on their persistent session, sending what they finished while away.
    #[arg(long)]
    pub offline: bool,
    /// Seed of the straggler classes and absences.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// After the last round, seconds to wait for the coordinator to account for every update.
    #[arg(long, default_value_t = 10)]
    pub settle_s: u64,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Runs the fleet against the coordinator and prints what it did with each round's updates.
pub async fn run(args: FleetArgs) -> anyhow::Result<()> {
    use fedge::bench::fleet::{FleetLoad, FleetOptions, run_fleet_with};
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
    let load = FleetLoad {
        train_ms: args.train_ms,
        stragglers: args.stragglers,
        offline: args.offline,
        seed: args.seed,
    };
    let settle = std::time::Duration::from_secs(args.settle_s);
    let report = run_fleet_with(&options, &load, settle).await?;
    println!("round  selected  reported  rejected  stale  seconds  MB up");
    for r in &report.rounds {
        let stale = r.rejected_by_reason.get("stale").copied().unwrap_or(0);
        println!(
            "{:5}  {:8}  {:8}  {:8}  {:5}  {:7.2}  {:5.1}",
            r.round,
            r.selected,
            r.reported,
            r.rejected,
            stale,
            r.seconds,
            r.bytes_up as f64 / 1e6
        );
    }
    let a = &report.accounting;
    let mode = if report.buffered {
        "versions (buffered)"
    } else {
        "rounds"
    };
    println!(
        "{} devices, {} {mode} in {:.1} s",
        report.devices, args.rounds, report.seconds
    );
    let reasons: Vec<String> = a.rejected.iter().map(|(r, n)| format!("{r} {n}")).collect();
    println!(
        "updates: {} sent (acknowledged by the broker), {} applied, {} in abandoned rounds, {} \
         rejected ({}), {} in the open buffer; difference {}{}",
        a.sent,
        a.applied,
        a.abandoned,
        a.rejected_updates(),
        if reasons.is_empty() {
            "none".to_owned()
        } else {
            reasons.join(", ")
        },
        a.in_buffer,
        a.difference,
        match a.unconfirmed {
            0 => String::new(),
            n => format!(" ({n} more published, unacknowledged)"),
        },
    );
    if !report.staleness.is_empty() {
        let spread: Vec<String> = (report.staleness.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        println!(
            "staleness of the updates used (versions behind: updates): {}",
            spread.join(", ")
        );
    }
    if report.absences > 0 || report.queued > 0 {
        println!(
            "devices went away {} times, {} updates finished while away were sent on return, \
             {} tasks came while a device was training and were trained next",
            report.absences, report.held, report.queued
        );
    }
    args.json.write(&report)?;
    anyhow::ensure!(
        a.status_seen,
        "no coordinator status read: the updates cannot be accounted for"
    );
    anyhow::ensure!(
        a.balanced(),
        "{} updates sent are neither applied, rejected with a reason nor in the open buffer",
        a.difference
    );
    // Devices that answer at once in synchronous rounds: every update used, none rejected.
    if load == FleetLoad::default() && !report.buffered {
        anyhow::ensure!(
            (report.rounds.iter()).all(|r| r.reported == r.selected && r.rejected == 0)
                && a.rejected_updates() == 0
                && a.applied + a.in_buffer == a.sent,
            "updates were lost or rejected"
        );
    }
    Ok(())
}
