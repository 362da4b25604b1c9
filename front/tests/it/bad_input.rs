//! Bad input on an update topic, against a running coordinator over the embedded broker
//! (garbage, stale round, wrong shape, NaN, an oversized chunk stream, a chunk stream that never
//! completes): each is logged, counted by reason in the retained status JSON, and the model is
//! untouched. Forged, unknown and replayed updates are in the `restart` module and the round
//! machine's guard tests.

use std::time::Duration;

use fedge_coordinator::{DriverOptions, FedAvg, RoundConfig, Rounds};
use fedge_wire::{Message, Topics};
use rumqttc::{AsyncClient, MqttOptions, QoS};

use crate::common::{self, Driver};

const PARAMS: usize = 8;

fn update(round: u64, client: &str, delta: &[f32]) -> Vec<u8> {
    common::update_frame(common::client_update(round, client, 1, 10, delta))
}

fn chunk(message_id: u64, index: u32, count: u32, total_len: u32, data: Vec<u8>) -> Vec<u8> {
    fedge_wire::encode(&Message::Chunk(fedge_wire::Chunk {
        message_id,
        index,
        count,
        total_len,
        data,
        tag: None,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_updates_are_counted_by_reason_and_the_round_goes_on() {
    let broker = common::embedded_broker();
    let topics = Topics::new("bad-input").unwrap();
    let initial = vec![0.5f32; PARAMS];
    let config = RoundConfig {
        rounds: 1,
        min_clients: 1,
        min_updates: 1,
        round_timeout_ms: 60_000,
        reassembly_timeout_ms: 300,
        journal: true,
        ..RoundConfig::default()
    };
    let rounds = Rounds::new(config, Box::new(FedAvg), initial.clone());
    let state = tempfile::tempdir().unwrap();
    let checkpoint_path = state.path().join("checkpoint.bin");
    let options = DriverOptions {
        client_id: "coord".into(),
        checkpoint: Some(checkpoint_path.clone()),
        journal: Some(state.path().join("journal.bin")),
        ..common::driver_options(broker.clone(), "bad-input")
    };
    let coordinator = Driver::spawn(rounds, options);

    // A raw MQTT client plays a device called mallory.
    let mut mqtt = MqttOptions::new("mallory", "127.0.0.1", broker.port);
    mqtt.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(mqtt, 64);
    client
        .subscribe(topics.coordinator_status(), QoS::AtLeastOnce)
        .await
        .unwrap();
    client
        .publish(
            topics.edge_status("mallory"),
            QoS::AtLeastOnce,
            true,
            common::edge_status_json("mallory", true),
        )
        .await
        .unwrap();
    let status_topic = topics.coordinator_status();
    let status =
        common::wait_status(&mut eventloop, &status_topic, |s| s.state == "training").await;
    assert_eq!((status.round, status.clients_selected), (1, 1));

    let update_topic = topics.update("mallory");
    let mut nan = vec![0.1f32; PARAMS];
    nan[3] = f32::NAN;
    let bad: Vec<Vec<u8>> = vec![
        b"\x00\x01garbage that is not a fedge frame".to_vec(),
        update(9, "mallory", &[0.1; PARAMS]),
        update(1, "mallory", &[0.1; PARAMS - 1]),
        update(1, "mallory", &nan),
        // A chunk stream announcing more than any message may hold.
        chunk(1, 0, 2, u32::MAX, vec![0; 16]),
        // The first half of a stream whose second half never comes.
        chunk(2, 0, 2, 32, vec![0; 16]),
    ];
    for payload in bad {
        client
            .publish(&update_topic, QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
    let status =
        common::wait_status(&mut eventloop, &status_topic, |s| s.rejected_total == 6).await;
    let reasons: Vec<(&str, u64)> = status
        .rejected_updates
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("incomplete", 1),
            ("malformed", 1),
            ("non_finite", 1),
            ("oversized", 1),
            ("shape", 1),
            ("wrong_round", 1)
        ]
    );
    assert_eq!(status.state, "training", "the round is still open");
    assert_eq!(status.clients_reported, 0);
    assert!(
        !checkpoint_path.exists(),
        "nothing aggregated, nothing saved"
    );
    assert!(
        (status.params_norm - common::norm(&initial)).abs() < 1e-6,
        "model untouched"
    );

    // A valid update still closes the round.
    client
        .publish(
            &update_topic,
            QoS::AtLeastOnce,
            false,
            update(1, "mallory", &[0.25; PARAMS]),
        )
        .await
        .unwrap();
    let status =
        common::wait_status(&mut eventloop, &status_topic, |s| s.state == "finished").await;
    assert_eq!(status.rejected_total, 6);
    let rounds = coordinator.finished(Duration::from_secs(10)).await;
    assert_eq!(rounds.params(), &[0.75; PARAMS]);
    let saved = fedge_coordinator::store::checkpoint::load(&checkpoint_path)
        .unwrap()
        .expect("checkpoint written after the aggregation");
    assert_eq!(saved.params, vec![0.75; PARAMS]);
    assert_eq!((saved.next_round, saved.aggregated_rounds), (2, 1));
}
