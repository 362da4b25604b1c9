//! The coordinator's metrics as Prometheus reads them: a gated federation of simulated devices
//! over mosquitto with `metrics_listen` set, one junk update, and an evaluation site that scores
//! the release served and a worse candidate, which the gate holds; the exposition read over
//! HTTP (a gauge whose value is unknown is absent), then a real Prometheus server scraping it
//! (OpenMetrics, negotiated by content type) and answering queries. Prometheus comes from Debian's `prometheus` package; without it that part skips,
//! unless `FEDGE_REQUIRE_PROMETHEUS=1` (as in CI).

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fedge::bench::fleet::{FleetOptions, run_fleet};
use fedge_coordinator::{FedAvg, RoundConfig, Rounds};
use rumqttc::{AsyncClient, MqttOptions, QoS};

use crate::common::{self, Driver};

/// The evaluation-only site of the gated federation.
pub const SITE: &str = "unseen";

fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn try_get(url: &str) -> Result<String, ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    agent.get(url).call()?.body_mut().read_to_string()
}

fn get(url: &str) -> String {
    try_get(url).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Debian's `prometheus`, or `None` (skip).
fn prometheus() -> Option<&'static str> {
    let found = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("prometheus");
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_PROMETHEUS").map_or(true, |v| v != "1"),
        "FEDGE_REQUIRE_PROMETHEUS=1 but prometheus is missing (apt-get install prometheus)"
    );
    eprintln!("no prometheus: skipping the Prometheus part");
    None
}

/// A Prometheus server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of the sample line starting with `name` (name, labels and a space) in an
/// exposition.
fn metric(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(name));
    let line = line.unwrap_or_else(|| panic!("{name} missing in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Prometheus's instant-query URL for `query`.
fn query_url(server: SocketAddr, query: &str) -> String {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("http://{server}/api/v1/query?query={encoded}")
}

/// Asks Prometheus for `query` until it answers `want` (within 30 s).
fn query_until(server: SocketAddr, query: &str, want: &str) {
    let url = query_url(server, query);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(body) = try_get(&url) {
            let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let value = &json["data"]["result"][0]["value"][1];
            if value.as_str() == Some(want) {
                return;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus never answered {want} to {query}; last answer: {last}");
}

/// Devices of the gated federation.
const DEVICES: usize = 3;

/// A gated coordinator driven with `options` (a head of 1042 values, so that each aggregate is
/// a release: round 1's is served, the later ones wait at the gate for [`SITE`]), and the
/// report of a fleet of [`DEVICES`] that ran two of its rounds and stopped. The coordinator
/// stays up (50 rounds), waiting for devices.
pub async fn gated_federation(
    options: fedge_coordinator::DriverOptions,
) -> (Driver, fedge::bench::fleet::FleetReport) {
    let head = fedge_wire::HeadConfig::new(32, 10).with_hidden(24);
    let config = RoundConfig {
        rounds: 50,
        min_clients: DEVICES,
        min_updates: DEVICES,
        round_timeout_ms: 60_000,
        classes: (0..10).map(|c| c.to_string()).collect(),
        head: Some(head.clone()),
        ..RoundConfig::default()
    };
    let mut rounds = Rounds::new(config, Box::new(FedAvg), vec![0.0; head.num_params()]);
    rounds.set_release_config(fedge_coordinator::release::ReleaseConfig {
        mode: fedge_coordinator::release::ReleaseMode::Gated,
        evaluators: vec![SITE.into()],
        timeout_s: 600.0,
        canary_share: 0.0,
        ..Default::default()
    });
    let fleet = FleetOptions {
        broker: options.broker.clone(),
        federation: options.federation.clone(),
        devices: DEVICES,
        rounds: 2,
        timeout: Duration::from_secs(60),
        keys: Default::default(),
    };
    let coordinator = Driver::spawn(rounds, options);
    let report = run_fleet(&fleet).await.unwrap();
    // The coordinator goes on to round 3: when its devices answer that task before they stop,
    // the report lists it too (rounds that end while the fleet stops are counted).
    assert!(matches!(report.rounds.len(), 2 | 3), "{report:?}");
    // Whatever the devices sent before they stopped has arrived.
    tokio::time::sleep(Duration::from_secs(1)).await;
    (coordinator, report)
}

/// [`SITE`] scores the release `served` right on 900 of its 1000 images, then the `candidate`
/// on 880 against it (20 lost, none gained): the gate holds it. Published retained, as a
/// device's status is, through `client` (whose event loop the caller polls).
pub async fn site_scores(
    client: &AsyncClient,
    federation: &str,
    served: &fedge_wire::ReleaseRef,
    candidate: &fedge_wire::ReleaseRef,
) {
    let topic = fedge_wire::Topics::new(federation)
        .unwrap()
        .edge_status(SITE);
    for (scored, right, against) in [(served, 900, None), (candidate, 880, Some(served))] {
        let status = fedge_wire::EdgeStatus {
            client_id: SITE.into(),
            online: true,
            role: fedge_wire::Role::Evaluate,
            evaluation: Some(fedge_wire::SiteEvaluation {
                model_round: scored.round,
                accuracy: right as f32 / 1000.0,
                class_accuracy: Vec::new(),
                samples: 1000,
            }),
            evaluated: Some(scored.sha256.clone()),
            paired: against.map(|served| fedge_wire::PairedScore {
                against: served.sha256.clone(),
                samples: 1000,
                gained: 0,
                lost: 900 - right,
            }),
            ..Default::default()
        };
        let json = serde_json::to_vec(&status).unwrap();
        client
            .publish(&topic, QoS::AtLeastOnce, true, json)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_coordinator_s_rounds_updates_and_rejections() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let metrics = free_addr();
    let options = fedge_coordinator::DriverOptions {
        metrics_listen: Some(metrics),
        ..common::driver_options(mosquitto.broker(), "prom")
    };
    let (_coordinator, report) = gated_federation(options).await;
    // One junk update from a device the federation never selected.
    let topic = fedge_wire::Topics::new("prom").unwrap().update("mallory");
    let broker = mosquitto.broker();
    let (junk, mut junk_loop) =
        AsyncClient::new(MqttOptions::new("mallory", "127.0.0.1", broker.port), 8);
    junk.publish(topic, QoS::AtLeastOnce, false, b"not a frame".to_vec())
        .await
        .unwrap();
    let url = format!("http://{metrics}/metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let _ = tokio::time::timeout(Duration::from_millis(50), junk_loop.poll()).await;
        let url = url.clone();
        let text = tokio::task::spawn_blocking(move || get(&url))
            .await
            .unwrap();
        if text.contains("reason=\"malformed\"") || Instant::now() > deadline {
            break text;
        }
    };
    let number = |name: &str| metric(&text, name);
    // The fleet stops once it has seen two rounds end; its devices may have answered round 3's
    // task by then, so the counts follow k, the rounds aggregated.
    let k = number("fedge_rounds_aggregated_total ") as u64;
    assert!(k == 2 || k == 3, "{text}");
    assert!(k >= report.rounds.len() as u64, "{text}\n{report:?}");
    // Round k + 1 opened unless the devices had gone when round k closed.
    let opened = number("fedge_rounds_opened_total ") as u64;
    assert!(opened == k || opened == k + 1, "{text}");
    for (name, want) in [
        ("fedge_round ", opened),
        (
            "fedge_updates_total{outcome=\"accepted\",reason=\"\"} ",
            3 * k,
        ),
        (
            "fedge_updates_total{outcome=\"rejected\",reason=\"malformed\"} ",
            1,
        ),
        ("fedge_round_duration_seconds_count ", k),
        ("fedge_aggregation_duration_seconds_count ", k),
    ] {
        assert_eq!(number(name), want as f64, "{name} in\n{text}");
    }
    assert!(number("fedge_received_bytes_total") > (6 * 1_000 * 2) as f64);
    assert!(number("fedge_sent_bytes_total") > (3 * 1_000 * 2) as f64);
    assert!(number("fedge_resident_memory_bytes") > 1e6);
    // Round 1's release is served, round k's waits at the gate; nothing is judged or scored
    // yet: those gauges are absent, not 0.
    assert_eq!(number("fedge_release_serving_round "), 1.0, "{text}");
    assert_eq!(number("fedge_release_candidate_round "), k as f64, "{text}");
    for unknown in [
        "fedge_gate_candidate_accuracy_points",
        "fedge_gate_serving_accuracy_points",
        "fedge_site_accuracy",
        "fedge_candidate_site_accuracy",
    ] {
        assert!(!text.contains(unknown), "{unknown} in\n{text}");
    }
    let states: Vec<&str> = (text.lines())
        .filter(|l| l.starts_with("fedge_federation_state{"))
        .collect();
    assert_eq!(states.len(), 4, "{text}");
    assert_eq!(
        states.iter().filter(|l| l.ends_with("} 1")).count(),
        1,
        "{text}"
    );

    // The evaluation site scores the release served (90 %), then the candidate against it
    // (88 %: 20 images lost, none gained): the gate holds it.
    let status_topic = fedge_wire::Topics::new("prom")
        .unwrap()
        .coordinator_status();
    junk.subscribe(&status_topic, QoS::AtLeastOnce)
        .await
        .unwrap();
    let status = common::wait_status(&mut junk_loop, &status_topic, |s| {
        s.release.as_ref().is_some_and(|r| r.candidate.is_some())
    })
    .await;
    let release = status.release.unwrap();
    let (served, candidate) = (release.serving.unwrap(), release.candidate.unwrap());
    assert_eq!((served.round, candidate.round), (1, k));
    site_scores(&junk, "prom", &served, &candidate).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let _ = tokio::time::timeout(Duration::from_millis(50), junk_loop.poll()).await;
        let url = url.clone();
        let text = tokio::task::spawn_blocking(move || get(&url))
            .await
            .unwrap();
        let held = text.contains("fedge_gate_verdicts_total{outcome=\"held\"} 1");
        if (held && text.contains("fedge_candidate_site_accuracy{")) || Instant::now() > deadline {
            break text;
        }
    };
    let number = |name: &str| metric(&text, name);
    // What devices serve scored 90 %; the held candidate's 88 % is apart.
    let site = format!("{{site=\"{SITE}\"}} ");
    assert_eq!(number(&format!("fedge_site_accuracy{site}")), 0.9, "{text}");
    assert_eq!(
        number(&format!("fedge_candidate_site_accuracy{site}")),
        0.88,
        "{text}"
    );
    let judged = number("fedge_gate_candidate_accuracy_points ");
    assert!((judged - 88.0).abs() < 1e-3, "{text}");
    let against = number("fedge_gate_serving_accuracy_points ");
    assert!((against - 90.0).abs() < 1e-3, "{text}");

    let Some(prometheus) = prometheus() else {
        return;
    };
    // The alerting rules as docs/prometheus.md ships them, checked and loaded.
    let alerts = common::repo_root().join("docs/prometheus-alerts.yml");
    let checked = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&alerts)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "promtool check rules: {}",
        String::from_utf8_lossy(&checked.stdout)
    );
    // And they fire on the series fedge exports (docs/prometheus-alerts.test.yml: a hung
    // round raises FedgeFederationStalled, a working or an abandoning federation does not).
    let tests = common::repo_root().join("docs/prometheus-alerts.test.yml");
    let tested = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&tests)
        .output()
        .unwrap();
    assert!(
        tested.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );
    // A real server scraping every second.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: fedge\n    static_configs:\n      - targets: ['{metrics}']\n",
            alerts.display()
        ),
    )
    .unwrap();
    let web = free_addr();
    let _server = Server(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let q = |query: &'static str, want: String| {
        tokio::task::spawn_blocking(move || query_until(web, query, &want))
    };
    q("up{job=\"fedge\"}", "1".into()).await.unwrap();
    q("fedge_rounds_aggregated_total", k.to_string())
        .await
        .unwrap();
    q("fedge_updates_total{reason=\"malformed\"}", "1".into())
        .await
        .unwrap();
    let accepted = (3 * k).to_string();
    q("fedge_updates_total{outcome=\"accepted\"}", accepted)
        .await
        .unwrap();
    q("fedge_round_duration_seconds_count", k.to_string())
        .await
        .unwrap();
    q("fedge_site_accuracy{site=\"unseen\"}", "0.9".into())
        .await
        .unwrap();
    q("sum(fedge_federation_state)", "1".into()).await.unwrap();
    // Every query of the Grafana dashboard runs and finds its series (rates need three scrapes).
    q(
        "count_over_time(up{job=\"fedge\"}[1m]) > bool 2",
        "1".into(),
    )
    .await
    .unwrap();
    let dashboard = common::repo_root().join("docs/grafana-prometheus-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10);
    let answers = tokio::task::spawn_blocking(move || {
        exprs
            .into_iter()
            .map(|e| (e.clone(), get(&query_url(web, &e))))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (expr, body) in answers {
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["status"], "success", "{expr}: {body}");
        let result = json["data"]["result"].as_array().unwrap();
        assert!(!result.is_empty(), "{expr} finds nothing: {body}");
    }
    // The rules are loaded and evaluate without error.
    let shipped = std::fs::read_to_string(&alerts).unwrap();
    let shipped = shipped.matches("- alert:").count();
    let rules = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = get(&format!("http://{web}/api/v1/rules"));
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            let rules = json["data"]["groups"][0]["rules"].clone();
            let evaluated = rules.as_array().is_some_and(|r| {
                r.len() == shipped
                    && r.iter()
                        .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z")
            });
            if evaluated || Instant::now() > deadline {
                return rules;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    })
    .await
    .unwrap();
    let rules = rules.as_array().expect("the alerting rules are loaded");
    assert_eq!(rules.len(), shipped, "{rules:?}");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
}

/// The metrics of `use_model`'s agents once the federation is over and the unseen site has
/// answered its HTTP and MQTT predictions: the training site trained every round, the
/// evaluation-only site trained none, serves the last model and counted its predictions.
pub async fn check_edge_metrics(training: SocketAddr, evaluating: SocketAddr, rounds: u64) {
    let read = |addr: SocketAddr| {
        tokio::task::spawn_blocking(move || get(&format!("http://{addr}/metrics")))
    };
    let (a, unseen) = (
        read(training).await.unwrap(),
        read(evaluating).await.unwrap(),
    );
    let number = metric;
    assert_eq!(
        number(&a, "fedge_edge_rounds_trained_total "),
        rounds as f64
    );
    assert_eq!(
        number(&a, "fedge_edge_train_duration_seconds_count "),
        rounds as f64
    );
    assert!(number(&a, "fedge_edge_samples ") > 100.0, "{a}");
    // A training device that serves no predictions still says which model it holds.
    assert_eq!(number(&a, "fedge_edge_model_round "), rounds as f64, "{a}");
    assert!(
        number(&a, "fedge_edge_peak_resident_memory_bytes ") > 1e6,
        "{a}"
    );
    assert_eq!(number(&unseen, "fedge_edge_rounds_trained_total "), 0.0);
    assert_eq!(number(&unseen, "fedge_edge_model_round "), rounds as f64);
    assert!(
        unseen.contains("fedge_edge_serving_release{sha256=\""),
        "{unseen}"
    );
    // One variant of the release serves at the site, and the gauge says which.
    let variants = ["release", "prior-em", "correction"].map(|v| {
        number(
            &unseen,
            &format!("fedge_edge_site_variant{{variant=\"{v}\"}} "),
        )
    });
    assert_eq!(variants.iter().sum::<f64>(), 1.0, "{unseen}");
    let http = "fedge_edge_inference_requests_total{via=\"http\",outcome=";
    assert!(
        number(&unseen, &format!("{http}\"ok\"}} ")) >= 1.0,
        "{unseen}"
    );
    assert!(
        number(&unseen, &format!("{http}\"error\"}} ")) >= 1.0,
        "{unseen}"
    );
    let mqtt = "fedge_edge_inference_requests_total{via=\"mqtt\",outcome=\"ok\"} ";
    assert!(number(&unseen, mqtt) >= 1.0, "{unseen}");
    // The site that serves watches what it serves for drift.
    let level = number(&unseen, "fedge_edge_drift_level ");
    assert!((0.0..=1.0).contains(&level), "{unseen}");
    assert!(
        unseen.contains("fedge_edge_drift_alarms_total "),
        "{unseen}"
    );
}
