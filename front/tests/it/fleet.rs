//! 60 lightweight devices, each its own MQTT connection with its own key, against a
//! coordinator over mosquitto for two rounds: every update is accounted for (the full-size
//! load figures come from `bench/fleet.sh` and are in BENCHMARKS.md).

use std::sync::Arc;
use std::time::Duration;

use fedge::bench::fleet::{FleetOptions, device_ids, run_fleet};
use fedge_coordinator::{FedAvg, RoundConfig, Rounds};

use crate::common::{self, Driver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_update_of_a_keyed_fleet_is_accounted_for() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    const DEVICES: usize = 60;
    let keys: fedge_coordinator::DeviceKeys = device_ids(DEVICES)
        .into_iter()
        .map(|id| (id, fedge_coordinator::store::keys::generate()))
        .collect();
    // Chunked at the default 128 KiB packet limit: tasks (f32, 320 KB) and updates (f16, 160 KB).
    let params = 80_000;
    let config = RoundConfig {
        rounds: 2,
        min_clients: DEVICES,
        min_updates: DEVICES,
        round_timeout_ms: 60_000,
        auth: Some(Arc::new(keys.clone())),
        ..RoundConfig::default()
    };
    let rounds = Rounds::new(config, Box::new(FedAvg), vec![0.0; params]);
    let options = common::driver_options(mosquitto.broker(), "fleet-test");
    let coordinator = Driver::spawn(rounds, options);
    let fleet = FleetOptions {
        broker: mosquitto.broker(),
        federation: "fleet-test".into(),
        devices: DEVICES,
        rounds: 2,
        timeout: Duration::from_secs(60),
        keys: keys.into_iter().collect(),
    };
    let report = run_fleet(&fleet).await.unwrap();
    assert_eq!(report.rounds.len(), 2, "{report:?}");
    for r in &report.rounds {
        assert_eq!((r.selected, r.reported, r.rejected), (60, 60, 0), "{r:?}");
        assert!(
            r.bytes_up > 60 * params as u64 * 2,
            "chunked updates counted: {r:?}"
        );
    }
    assert_eq!(report.updates_sent, 120);
    let rounds = coordinator.finished(Duration::from_secs(20)).await;
    // Every device sends 1e-3·((i mod 7) − 3) per round in the default codec (f16), with
    // equal weights.
    let sent = |i: usize| {
        fedge_wire::f16_to_f32(fedge_wire::f32_to_f16(1e-3 * ((i % 7) as f32 - 3.0))) as f64
    };
    let want: Vec<f32> = (0..params).map(|i| (2.0 * sent(i)) as f32).collect();
    for (got, want) in rounds.params().iter().zip(&want) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}

/// Raises this process's soft limit of open files to its hard limit (`prlimit`, util-linux)
/// when `wanted` descriptors do not fit (mosquitto, started after, inherits it); returns the
/// soft limit then.
fn open_files(wanted: u64) -> u64 {
    let soft = || {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let line = limits.lines().find(|l| l.starts_with("Max open files"));
        let fields: Vec<&str> = line.map_or(Vec::new(), |l| l.split_whitespace().collect());
        let parse = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        (parse(3).unwrap_or(1024), parse(4).unwrap_or(u64::MAX))
    };
    let (now, hard) = soft();
    if now < wanted {
        let _ = std::process::Command::new("prlimit")
            .arg(format!("--pid={}", std::process::id()))
            .arg(format!(
                "--nofile={}:{}",
                hard.min(1 << 20),
                hard.min(1 << 20)
            ))
            .status();
    }
    soft().0
}

/// 1,000 unkeyed devices with the straggler mix (20 ms nominal: stragglers 100 and 400 ms)
/// and 30 % of them going away in random windows (Last Will, persistent session, updates
/// finished while away sent on return), against a buffered coordinator (versions of 50
/// updates, every online device training, max_staleness 10) for 20 versions: every update a
/// device sent (acknowledged by the broker) is applied, rejected with a named reason or in the
/// open buffer; none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_update_of_a_buffered_fleet_of_stragglers_and_absentees_is_accounted_for() {
    use fedge::bench::fleet::{FleetLoad, run_fleet_with};
    use fedge_coordinator::buffer::AggregationConfig;
    const WANTED: usize = 1_000;
    // Each device holds a socket here and one in mosquitto, which inherits this limit.
    let limit = open_files(WANTED as u64 + 512);
    let devices = WANTED.min(limit.saturating_sub(512) as usize).max(60);
    if devices < WANTED {
        eprintln!("open files limited to {limit}: {devices} devices instead of {WANTED}");
    }
    // As bench/fleet.sh configures it: past its default queue of 1,000 QoS 1 messages per
    // client, mosquitto would drop updates of a burst that outruns the coordinator.
    let Some(mosquitto) = common::Mosquitto::start_with("max_queued_messages 100000") else {
        return;
    };
    const VERSIONS: u64 = 20;
    const BUFFER: usize = 50;
    // Small enough that neither tasks nor updates are chunked.
    let params = 1_000;
    let config = RoundConfig {
        rounds: 0,
        // Version 1 opens with the first device online, the others are given its task as they
        // come (min_clients also gates every later version: below it, no version is open and
        // updates are refused as wrong_round).
        min_clients: 1,
        round_timeout_ms: 60_000,
        aggregation: AggregationConfig::buffered(BUFFER, 0, 10),
        ..RoundConfig::default()
    };
    let rounds = Rounds::new(config, Box::new(FedAvg), vec![0.0; params]);
    let options = common::driver_options(mosquitto.broker(), "fleet-buffered");
    let _coordinator = Driver::spawn(rounds, options);
    let fleet = FleetOptions {
        broker: mosquitto.broker(),
        federation: "fleet-buffered".into(),
        devices,
        rounds: VERSIONS,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    };
    let load = FleetLoad {
        train_ms: 20,
        stragglers: true,
        offline: true,
        seed: 1,
    };
    let started = std::time::Instant::now();
    let report = run_fleet_with(&fleet, &load, Duration::from_secs(10))
        .await
        .unwrap();
    let a = &report.accounting;
    eprintln!(
        "{devices} devices, {VERSIONS} versions in {:.1} s ({:.1} s with the settling); \
         {a:?}; staleness {:?}; {} absences, {} updates held, {} tasks queued",
        report.seconds,
        started.elapsed().as_secs_f64(),
        report.staleness,
        report.absences,
        report.held,
        report.queued
    );
    eprintln!(
        "DEBUG rounds {:?}",
        report
            .rounds
            .iter()
            .map(|r| (r.round, r.reported, r.rejected, r.seconds))
            .collect::<Vec<_>>()
    );
    assert!(report.buffered, "{report:?}");
    assert!(report.rounds.len() as u64 >= VERSIONS, "{report:?}");
    assert!(a.applied >= VERSIONS * BUFFER as u64, "{a:?}");
    // None lost: every update applied, rejected with a reason, or in the open buffer.
    assert!(
        a.status_seen && a.difference == 0 && a.unconfirmed == 0,
        "{a:?}"
    );
    assert_eq!(a.abandoned, 0, "{a:?}");
    for reason in a.rejected.keys() {
        assert!(
            ["stale", "not_selected"].contains(&reason.as_str()),
            "unexpected rejection {reason}: {a:?}"
        );
    }
    // What the status says of the staleness of the updates used agrees, within max_staleness.
    if !report.staleness.is_empty() {
        assert!(report.staleness.len() <= 11, "{:?}", report.staleness);
        assert_eq!(
            report.staleness.iter().sum::<u64>(),
            a.applied,
            "{report:?}"
        );
    }
    // The absences happened (Last Will, persistent session), with updates finished while away.
    assert!(report.absences > 0 && report.held > 0, "{report:?}");
    assert!(report.seconds < 60.0, "{report:?}");
}
