//! A rolling upgrade over mosquitto: a coordinator of this release, two devices of this
//! protocol version and one of the previous (9), driven by that release's frozen encoder and
//! decoder (`fedge_wire::previous`). While the window is open all three train in the same
//! rounds and the status counts the versions; once it is closed the old device can no longer
//! read the tasks, is selected for no round, and its update is rejected as `version`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fedge::bench::fleet::{FleetOptions, run_fleet};
use fedge_coordinator::config::PreviousProtocol;
use fedge_mqtt::BrokerConfig;
use fedge_wire::previous;
use fedge_wire::{ClientUpdate, DecodeError, EdgeStatus, LocalMetrics, Message, TensorF32, Topics};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

use crate::common;

const OLD: &str = "legacy-8";

/// What the old device read on the task topic: a round it could decode, or the error.
type Seen = Arc<Mutex<Vec<Result<u64, DecodeError>>>>;

fn old_update(run: u64, round: u64, params: usize) -> Vec<u8> {
    previous::encode(&Message::ClientUpdate(ClientUpdate {
        features: None,
        run,
        round,
        client_id: OLD.into(),
        seq: round,
        num_samples: 20,
        delta: TensorF32::from_slice(&vec![0.01; params]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }))
}

/// A device of the previous protocol: its status says so, it reads tasks with the release's decoder and
/// answers the rounds that select it with that release's encoder.
async fn old_device(broker: BrokerConfig, federation: &str, seen: Seen) {
    let topics = Topics::new(federation).unwrap();
    let options = MqttOptions::new(OLD, broker.host.clone(), broker.port);
    let (client, mut events) = AsyncClient::new(options, 16);
    let status = serde_json::to_vec(&EdgeStatus {
        client_id: OLD.into(),
        online: true,
        profile: "previous-release".into(),
        updated_at: fedge_mqtt::now_rfc3339(),
        protocol: Some(fedge_wire::PREVIOUS_PROTOCOL_VERSION),
        ..EdgeStatus::default()
    })
    .unwrap();
    loop {
        let Ok(event) = events.poll().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                for filter in [topics.round_task(), format!("{}/+", topics.round_task())] {
                    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
                }
                let topic = topics.edge_status(OLD);
                let payload = status.clone();
                client
                    .publish(topic, QoS::AtLeastOnce, true, payload)
                    .await
                    .unwrap();
            }
            Event::Incoming(Packet::Publish(p)) if !p.payload.is_empty() => {
                let task = match previous::decode(&p.payload) {
                    Ok(Message::RoundTask(task)) => task,
                    Ok(_) => continue,
                    Err(e) => {
                        seen.lock().unwrap().push(Err(e));
                        continue;
                    }
                };
                seen.lock().unwrap().push(Ok(task.round));
                if task.selected.iter().any(|c| c == OLD) {
                    let frame = old_update(task.run, task.round, task.params.len());
                    let topic = topics.update(OLD);
                    client
                        .publish(topic, QoS::AtLeastOnce, false, frame)
                        .await
                        .unwrap();
                }
            }
            _ => {}
        }
    }
}

fn coordinator(broker: BrokerConfig, federation: &str, window: PreviousProtocol) -> common::Driver {
    let config = fedge_coordinator::RoundConfig {
        rounds: 1_000,
        min_clients: 2,
        min_updates: 2,
        round_timeout_ms: 3_000,
        backbone: "digits-conv".into(),
        backbone_sha256: Some([0x42; 32]),
        // The old device sends no feature summary: a federation that does not pool.
        train: fedge_wire::TrainParams {
            feature_norm: fedge_wire::FeatureNorm::None,
            ..Default::default()
        },
        ..fedge_coordinator::RoundConfig::default()
    };
    let rounds =
        fedge_coordinator::Rounds::new(config, Box::new(fedge_coordinator::FedAvg), vec![0.0; 100]);
    let options = fedge_coordinator::DriverOptions {
        previous_protocol: window,
        ..common::driver_options(broker, federation)
    };
    common::Driver::spawn(rounds, options)
}

fn fleet(broker: BrokerConfig, federation: &str) -> FleetOptions {
    FleetOptions {
        broker,
        federation: federation.into(),
        devices: 2,
        rounds: 1_000,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_of_two_protocol_versions_share_rounds_until_the_window_closes() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    // The window open: one round trains all three devices.
    let mut open = coordinator(mosquitto.broker(), "upgrade", PreviousProtocol::Accepted);
    let seen = Seen::default();
    let old = tokio::spawn(old_device(mosquitto.broker(), "upgrade", Arc::clone(&seen)));
    let two = fleet(mosquitto.broker(), "upgrade");
    let new = tokio::spawn(async move { run_fleet(&two).await });
    let mut mixed = None;
    for _ in 0..20 {
        let report = open.round_ended(Duration::from_secs(30)).await;
        if report.reported.len() == 3 {
            mixed = Some(report);
            break;
        }
    }
    let report = mixed.expect("no round used the three devices");
    assert!(report.aggregated, "{report:?}");
    assert!(report.reported.contains(&OLD.to_string()));
    let (client, mut events) = AsyncClient::new(
        MqttOptions::new("watcher", "127.0.0.1", mosquitto.port()),
        16,
    );
    let status_topic = Topics::new("upgrade").unwrap().coordinator_status();
    client
        .subscribe(&status_topic, QoS::AtLeastOnce)
        .await
        .unwrap();
    let status = common::wait_status(&mut events, &status_topic, |s| {
        let count = |v: u8| s.device_protocols.get(&v.to_string()).copied();
        count(fedge_wire::PREVIOUS_PROTOCOL_VERSION) == Some(1)
            && count(fedge_wire::PROTOCOL_VERSION) == Some(2)
    })
    .await;
    assert_eq!(
        status.protocol,
        Some(fedge_wire::PREVIOUS_PROTOCOL_VERSION),
        "tasks in the old device's version"
    );
    assert!(status.previous_protocol_accepted);
    assert!(seen.lock().unwrap().iter().all(Result::is_ok));
    old.abort();
    new.abort();
    drop(open);

    // The window closed an hour ago: the old device cannot read a task, trains in no round,
    // and an update it sends anyway is refused as `version`. On a broker of its own: the
    // simulated fleet's devices outlive its aborted task and keep their client ids.
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let (client, mut events) = AsyncClient::new(
        MqttOptions::new("sender", "127.0.0.1", mosquitto.port()),
        16,
    );
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let closed = PreviousProtocol::Until(an_hour_ago);
    let mut closed = coordinator(mosquitto.broker(), "upgrade-2", closed);
    let seen = Seen::default();
    let old = tokio::spawn(old_device(
        mosquitto.broker(),
        "upgrade-2",
        Arc::clone(&seen),
    ));
    let two = fleet(mosquitto.broker(), "upgrade-2");
    let new = tokio::spawn(async move { run_fleet(&two).await });
    let mut aggregated = 0;
    for _ in 0..10 {
        let report = closed.round_ended(Duration::from_secs(30)).await;
        assert_eq!(report.selected, ["fleet-00000", "fleet-00001"]);
        aggregated += u32::from(report.aggregated);
        if aggregated == 2 {
            break;
        }
    }
    assert_eq!(aggregated, 2, "rounds of the two new devices aggregate");
    let refusals = seen.lock().unwrap().clone();
    assert!(
        !refusals.is_empty()
            && refusals.iter().all(|r| *r
                == Err(DecodeError::UnsupportedVersion(
                    fedge_wire::PROTOCOL_VERSION
                ))),
        "{refusals:?}"
    );
    let topic = Topics::new("upgrade-2").unwrap().update(OLD);
    client
        .publish(topic, QoS::AtLeastOnce, false, old_update(1, 4, 100))
        .await
        .unwrap();
    let poll = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    assert_eq!(
        closed.rejected("version", Duration::from_secs(10)).await,
        OLD
    );
    poll.abort();
    old.abort();
    new.abort();
}
