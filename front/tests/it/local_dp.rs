//! Local differential privacy end to end: two real edge agents built from profiles, one with
//! `[privacy]`, a coordinator and the embedded broker. The private device's updates reach the
//! coordinator and count, and its retained status, its round state file and its Prometheus
//! metrics carry the ε its own accountant spent.

use std::path::Path;
use std::time::Duration;

use fedge_coordinator::{FedAvg, RoundConfig, Rounds};
use fedge_edge::config::EdgeConfig;
use fedge_models::HeadConfig;
use fedge_privacy::{Accountant, Sampling};
use fedge_wire::{EdgeStatus, Topics};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::watch;

use crate::common::{self, Driver};

const FEDERATION: &str = "ldp";
const ROUNDS: u64 = 2;
const SIGMA: f64 = 0.8;

/// A digits device's profile on the embedded broker at `port`, with `extra` appended.
fn profile(dir: &Path, client: &str, domain: &str, port: u16, extra: &str) -> EdgeConfig {
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let path = dir.join(format!("{client}.toml"));
    std::fs::write(
        &path,
        format!(
            "client_id = {client:?}\nfederation = {FEDERATION:?}\nhidden = 16\nseed = 1\n\
             cache_dir = \"cache\"\nbackbone = {card:?}\n\n[broker]\nhost = \"127.0.0.1\"\n\
             port = {port}\n\n[data]\nkind = \"digits\"\ndomain = {domain:?}\n\n{extra}"
        ),
    )
    .unwrap();
    EdgeConfig::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The retained status of `client` once `done` holds for it (at most 30 s).
async fn status_of(port: u16, client: &str, done: impl Fn(&EdgeStatus) -> bool) -> EdgeStatus {
    let (reader, mut events) = AsyncClient::new(
        MqttOptions::new(format!("ldp-reader-{client}"), "127.0.0.1", port),
        8,
    );
    let topic = Topics::new(FEDERATION).unwrap().edge_status(client);
    reader.subscribe(&topic, QoS::AtLeastOnce).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = None;
    loop {
        let Ok(event) = tokio::time::timeout_at(deadline, events.poll()).await else {
            panic!("{client}'s status never got there; last: {last:?}");
        };
        if let Ok(Event::Incoming(Packet::Publish(p))) = event
            && p.topic == topic
            && let Ok(status) = serde_json::from_slice::<EdgeStatus>(&p.payload)
        {
            if done(&status) {
                return status;
            }
            last = Some(status);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_with_local_dp_takes_part_and_reports_its_epsilon() {
    let broker = common::embedded_broker();
    let port = broker.port;
    let dir = tempfile::tempdir().unwrap();
    let privacy =
        format!("[privacy]\nlocal_noise_multiplier = {SIGMA}\nlocal_clip_norm = 0.05\nseed = 5\n");
    let private = profile(dir.path(), "private", "rot0", port, &privacy);
    let plain = profile(dir.path(), "plain", "rot15", port, "");
    assert!(private.privacy.is_some() && plain.privacy.is_none());

    let head = HeadConfig::new(512, 10).with_hidden(16);
    let initial = fedge_models::ModelLayout::new(head, false).init_flat(0);
    let rounds = Rounds::new(
        RoundConfig {
            rounds: ROUNDS,
            min_clients: 2,
            min_updates: 2,
            round_timeout_ms: 60_000,
            classes: fedge_wire::numbered_classes(10),
            // A noised delta's norm is about σ·C·√d, which with C near the honest deltas'
            // norms is many times theirs: the norm-ratio rule would drop it as an outlier
            // (docs/privacy.md, "Local DP").
            max_norm_ratio: 0.0,
            ..RoundConfig::default()
        },
        Box::new(FedAvg),
        initial.clone(),
    );
    let mut coordinator = Driver::spawn(rounds, common::driver_options(broker, FEDERATION));

    let (stop, stop_rx) = watch::channel(false);
    let mut metrics = None;
    let mut agents = Vec::new();
    for config in [&private, &plain] {
        let setup = config.setup().unwrap_or_else(|e| panic!("{e}"));
        if setup.privacy.is_some() {
            metrics = Some(std::sync::Arc::clone(&setup.serving.metrics));
        }
        agents.push(tokio::spawn(fedge_edge::run_agent(setup, stop_rx.clone())));
    }

    for round in 1..=ROUNDS {
        let report = coordinator.round_ended(Duration::from_secs(90)).await;
        assert_eq!(report.round, round);
        assert!(report.aggregated, "{report:?}");
        assert!(
            report.reported.iter().any(|c| c == "private"),
            "round {round}: the private device's update did not count: {report:?}"
        );
        assert!(report.rejected.is_empty(), "{report:?}");
    }
    let finished = coordinator.finished(Duration::from_secs(20)).await;
    assert_ne!(finished.params(), initial);

    // The device's own accountant: two rounds at sampling rate 1 and σ.
    let mut reference = Accountant::default();
    reference
        .compose(Sampling::Poisson { rate: 1.0 }, SIGMA, ROUNDS)
        .unwrap();
    let want = reference.epsilon(1e-5).unwrap().epsilon;
    let status = status_of(port, "private", |s| s.last_round == ROUNDS).await;
    let epsilon = status.epsilon.expect("the private device reports its ε");
    assert!(epsilon > 0.0);
    assert!((epsilon - want).abs() <= 1e-9 * want, "{epsilon} ≠ {want}");
    assert!(status.last_error.is_empty(), "{}", status.last_error);
    let other = status_of(port, "plain", |s| s.last_round == ROUNDS).await;
    assert_eq!(other.epsilon, None);

    // Prometheus and the round state file say the same.
    let text = metrics.unwrap().encode();
    let gauge: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("fedge_edge_privacy_epsilon "))
        .expect("the gauge is exposed")
        .parse()
        .unwrap();
    assert_eq!(gauge, epsilon);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("cache/private.round.json")).unwrap(),
    )
    .unwrap();
    let history = &state["accountant"]["history"];
    assert_eq!(history[0]["steps"], ROUNDS, "{state}");
    assert_eq!(history[0]["noise_multiplier"], SIGMA, "{state}");

    let _ = stop.send(true);
    for agent in agents {
        tokio::time::timeout(Duration::from_secs(10), agent)
            .await
            .expect("the agent stops")
            .unwrap()
            .unwrap();
    }
}
