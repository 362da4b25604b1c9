//! `fedge bench fleet`: many lightweight simulated devices, each its own MQTT connection,
//! against a running coordinator (another process, so its CPU and memory can be measured on
//! their own, see `bench/fleet.sh`).
//!
//! A simulated device does what a real one does on the wire and nothing else: a Last Will,
//! a retained online status, the round task (reassembled when chunked, tag checked when it has
//! a key), and an update of the right size (chunked when large) for every round that selects
//! it. It trains nothing: the delta is a fixed pattern, so the coordinator's cost is what is
//! measured. With a [`FleetLoad`] the devices take their time (the straggler mix: 70 % at
//! nominal speed, 20 % five times slower, 10 % twenty times slower) and 30 % of them go away in
//! random windows (their Last Will fires) and come back on their persistent session.
//!
//! The report lists the rounds (model versions in buffered mode) from the `metrics` topic, and
//! accounts for every update the devices sent (acknowledged by the broker): applied, abandoned
//! with its round, rejected with a named reason (the coordinator status's `rejected_updates`),
//! or in the open buffer when the run stopped (the status's `clients_reported`).

mod device;
mod load;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fedge_mqtt::BrokerConfig;
use fedge_wire::{DeviceKey, Topics};
use serde::Serialize;
use tokio::sync::{mpsc, watch as signal};

pub use device::{Counters, Switch};
pub use load::FleetLoad;
pub use watch::{Accounting, FleetRound};

use watch::Watcher;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Broker of the federation.
    pub broker: BrokerConfig,
    /// Federation name.
    pub federation: String,
    /// Simulated devices, `fleet-00000` … .
    pub devices: usize,
    /// Rounds to watch before stopping.
    pub rounds: u64,
    /// Give up after this long.
    pub timeout: Duration,
    /// Keys by device id, when the coordinator authenticates.
    pub keys: BTreeMap<String, DeviceKey>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetReport {
    /// Devices simulated.
    pub devices: usize,
    /// Rounds seen on the metrics topic (those that ended while the run settled included).
    pub rounds: Vec<FleetRound>,
    /// Updates the devices published that the broker acknowledged, over all rounds.
    pub updates_sent: u64,
    /// Wall time from the first connection to the metrics of the `rounds`-th round.
    pub seconds: f64,
    /// Where every update went.
    pub accounting: Accounting,
    /// Buffered mode: the updates used by how many versions behind they started (index `s`),
    /// when the coordinator says it; empty otherwise.
    pub staleness: Vec<u64>,
    /// Whether the coordinator aggregates buffered (its status says so).
    pub buffered: bool,
    /// Times a device went away.
    pub absences: u64,
    /// Updates finished while their device was away, published on its return.
    pub held: u64,
    /// Tasks a device took while training another one (trained next).
    pub queued: u64,
}

/// Device ids of a fleet.
pub fn device_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("fleet-{i:05}")).collect()
}

fn topics(options: &FleetOptions) -> anyhow::Result<Topics> {
    Topics::new(&options.federation).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Starts the devices (each its own connection) at the pace of `load`; they stop when `stop`
/// says true.
async fn spawn_devices(
    options: &FleetOptions,
    load: &FleetLoad,
    follow: Option<mpsc::UnboundedSender<Switch>>,
    stop: signal::Receiver<bool>,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Arc<Counters>)> {
    let topics = topics(options)?;
    let counters = Arc::new(Counters::default());
    let mut tasks = Vec::new();
    for id in device_ids(options.devices) {
        let setup = device::Setup {
            broker: options.broker.clone(),
            topics: topics.clone(),
            key: options.keys.get(&id).cloned(),
            id,
            load: load.clone(),
            counters: Arc::clone(&counters),
            follow: follow.clone(),
        };
        tasks.push(tokio::spawn(device::run(setup, stop.clone())));
        // Spread the connection storm a little, as devices booting at one site would.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((tasks, counters))
}

/// Starts the fleet's devices (each its own connection, answering at once), following
/// releases when `follow` is given; returns their tasks (abort them to stop the devices) and
/// the count of updates they sent.
pub async fn spawn_fleet(
    options: &FleetOptions,
    follow: Option<mpsc::UnboundedSender<Switch>>,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, Arc<AtomicU64>)> {
    // Without a sender the devices never stop on their own.
    let (_, stop) = signal::channel(false);
    let (tasks, counters) = spawn_devices(options, &FleetLoad::default(), follow, stop).await?;
    Ok((tasks, Arc::clone(&counters.sent)))
}

/// Watches the metrics topic until `options.rounds` rounds were reported (or the timeout).
pub async fn watch_rounds(options: &FleetOptions) -> anyhow::Result<Vec<FleetRound>> {
    let mut watcher =
        Watcher::start(&options.broker, &topics(options)?, Some(options.rounds)).await?;
    let deadline = tokio::time::Instant::now() + options.timeout;
    let enough = |w: &Watcher| w.rounds.len() as u64 >= options.rounds;
    let reached = watcher.until(deadline, enough).await;
    let rounds = std::mem::take(&mut watcher.rounds);
    watcher.stop().await;
    anyhow::ensure!(reached, "timed out after {} rounds", rounds.len());
    Ok(rounds)
}

/// Runs the fleet, answering at once, until `rounds` rounds were reported on the metrics topic.
pub async fn run_fleet(options: &FleetOptions) -> anyhow::Result<FleetReport> {
    run_fleet_with(options, &FleetLoad::default(), Duration::ZERO).await
}

/// Runs the fleet at the pace of `load` until `options.rounds` rounds were reported on the
/// metrics topic, stops the devices (each once its updates in flight are acknowledged), and
/// reads the coordinator for up to `settle` more, until every update sent is accounted for.
pub async fn run_fleet_with(
    options: &FleetOptions,
    load: &FleetLoad,
    settle: Duration,
) -> anyhow::Result<FleetReport> {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + options.timeout;
    let mut watcher =
        Watcher::start(&options.broker, &topics(options)?, Some(options.rounds)).await?;
    let (stop, stopped) = signal::channel(false);
    let (mut tasks, counters) = spawn_devices(options, load, None, stopped).await?;
    let enough = |w: &Watcher| w.rounds.len() as u64 >= options.rounds;
    let reached = watcher.until(deadline, enough).await;
    let seconds = start.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let drained = tokio::time::Instant::now() + Duration::from_secs(10);
    for task in &mut tasks {
        let _ = tokio::time::timeout_at(drained, task).await;
    }
    for task in &tasks {
        task.abort();
    }
    let (sent, unconfirmed) = (
        counters.sent.load(Ordering::Relaxed),
        counters.unconfirmed.load(Ordering::Relaxed),
    );
    let settled = tokio::time::Instant::now() + settle;
    watcher
        .until(settled, |w| w.accounting(sent, unconfirmed).balanced())
        .await;
    let report = FleetReport {
        devices: options.devices,
        updates_sent: sent,
        seconds,
        accounting: watcher.accounting(sent, unconfirmed),
        staleness: watcher.staleness(),
        buffered: watcher.buffered(),
        absences: counters.absences.load(Ordering::Relaxed),
        held: counters.held.load(Ordering::Relaxed),
        queued: counters.queued.load(Ordering::Relaxed),
        rounds: std::mem::take(&mut watcher.rounds),
    };
    watcher.stop().await;
    anyhow::ensure!(reached, "timed out after {} rounds", report.rounds.len());
    Ok(report)
}
