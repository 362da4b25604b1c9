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
