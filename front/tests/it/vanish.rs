//! Three of ten devices vanish without a goodbye, against mosquitto: the broker's Last Wills
//! flip the vanished devices' retained status to offline, and the round closes with the quorum
//! of the seven that reported as soon as nothing is left to wait for, not at its deadline; the
//! three count as failing it `offline`.

use std::collections::BTreeMap;
use std::time::Duration;

use fedge_coordinator::{FedAvg, RoundConfig, Rounds};
use fedge_wire::{EdgeStatus, Topics};
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};

use crate::common::{self, Driver, edge_status_json as status};

const PARAMS: usize = 8;
const FEDERATION: &str = "vanish";

/// A lightweight device: its own MQTT connection with a Last Will, announcing itself online.
fn device(port: u16, id: String, topics: &Topics) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let topic = topics.edge_status(&id);
    let mut options = MqttOptions::new(format!("dev-{id}"), "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    options.set_last_will(LastWill::new(
        &topic,
        status(&id, false),
        QoS::AtLeastOnce,
        true,
    ));
    let (client, mut events) = AsyncClient::new(options, 16);
    let announcer = client.clone();
    let task = tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ =
                        announcer.try_publish(&topic, QoS::AtLeastOnce, true, status(&id, true));
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    (client, task)
}

/// Keeps the latest online flag per device from a status publish.
fn record(online: &mut BTreeMap<String, bool>, topics: &Topics, p: &rumqttc::Publish) {
    if let Some(id) = topics.client_of_edge_status(&p.topic)
        && let Ok(s) = serde_json::from_slice::<EdgeStatus>(&p.payload)
    {
        online.insert(id.to_owned(), s.online);
    }
}

fn update(id: &str) -> Vec<u8> {
    common::update_frame(common::client_update(1, id, 1, 10, &[1.0; PARAMS]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_closes_with_quorum_once_the_devices_that_vanished_are_offline() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let topics = Topics::new(FEDERATION).unwrap();
    let ids: Vec<String> = (0..10).map(|i| format!("dev{i}")).collect();
    let config = RoundConfig {
        rounds: 1,
        min_clients: 10,
        min_updates: 7,
        round_timeout_ms: 15_000,
        ..RoundConfig::default()
    };
    let rounds = Rounds::new(config, Box::new(FedAvg), vec![0.0; PARAMS]);
    let options = common::driver_options(mosquitto.broker(), FEDERATION);
    let mut coordinator = Driver::spawn(rounds, options);

    // An observer follows the retained device statuses and the round task.
    let mut observer = MqttOptions::new("observer", "127.0.0.1", mosquitto.port());
    observer.set_max_packet_size(1 << 20, 1 << 20);
    let (watch, mut watch_events) = AsyncClient::new(observer, 64);
    watch
        .subscribe(topics.edge_status_filter(), QoS::AtLeastOnce)
        .await
        .unwrap();
    watch
        .subscribe(topics.round_task(), QoS::AtLeastOnce)
        .await
        .unwrap();
    let devices: Vec<_> = ids
        .iter()
        .map(|id| device(mosquitto.port(), id.clone(), &topics))
        .collect();

    let mut online: BTreeMap<String, bool> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut task_seen = false;
    while !task_seen {
        let event = tokio::time::timeout_at(deadline, watch_events.poll())
            .await
            .expect("no round task within 20 s");
        if let Ok(Event::Incoming(Packet::Publish(p))) = event {
            task_seen |= p.topic == topics.round_task();
            record(&mut online, &topics, &p);
        }
    }
    // Three devices vanish: their connections close without DISCONNECT.
    for (_, task) in &devices[7..] {
        task.abort();
    }
    let started = tokio::time::Instant::now();
    for (id, (client, _)) in ids.iter().zip(&devices).take(7) {
        client
            .publish(topics.update(id), QoS::AtLeastOnce, false, update(id))
            .await
            .unwrap();
    }
    let report = coordinator.round_ended(Duration::from_secs(20)).await;
    assert!(report.aggregated, "quorum of 7 reached: {report:?}");
    assert_eq!(report.selected.len(), 10);
    assert_eq!(report.reported, ids[..7].to_vec());
    let vanished: BTreeMap<String, String> = (ids[7..].iter())
        .map(|id| (id.clone(), "offline".to_owned()))
        .collect();
    assert_eq!(
        report.failures, vanished,
        "their Last Wills, not the deadline"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "it waited out its deadline"
    );
    let rounds = coordinator.finished(Duration::from_secs(10)).await;
    assert_eq!(rounds.params(), &[1.0; PARAMS]);

    // The Last Wills mark exactly the vanished devices offline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let expected: BTreeMap<String, bool> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), i < 7))
        .collect();
    while online != expected {
        let Ok(event) = tokio::time::timeout_at(deadline, watch_events.poll()).await else {
            panic!("statuses never matched; last: {online:?}");
        };
        if let Ok(Event::Incoming(Packet::Publish(p))) = event {
            record(&mut online, &topics, &p);
        }
    }
}
