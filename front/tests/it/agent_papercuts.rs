//! `fedge-edge run` as an operator meets it, each binary against mosquitto: a site folder with
//! a corrupt image starts with its loading in the log and the image counted in the status and
//! on `/metrics`; a restarted agent does not publish the error of its previous
//! life, which reached it through its persistent session while it was down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fedge_wire::{EdgeStatus, Topics};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

use crate::common::{self, KillOnDrop};
use crate::use_model::{edge_binary, write_site};

const FEDERATION: &str = "papercuts";

/// A profile of `id` on `data` (a `[data]` section's lines), with its cache and metrics.
fn write_profile(dir: &Path, id: &str, port: u16, data: &str, extra: &str) -> PathBuf {
    let profile = format!(
        "client_id = \"{id}\"\nfederation = \"{FEDERATION}\"\nhidden = 16\nseed = 1\n\
         cache_dir = \"cache-{id}\"\nbackbone = {:?}\n{extra}\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n[data]\n{data}\n",
        common::repo_root().join("models/assets/digits-conv.toml")
    );
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(&path, profile).unwrap();
    path
}

/// `fedge-edge run --config profile`, its log (at info, and the data's loading at debug, which
/// a quick one says only at debug; on standard output) and standard error in `log`, killed on
/// drop.
fn run(profile: &Path, log: &Path) -> KillOnDrop {
    let file = std::fs::File::create(log).unwrap();
    let child = Command::new(edge_binary())
        .args(["run", "--config"])
        .arg(profile)
        .env("RUST_LOG", "info,fedge_edge::data::progress=debug")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

/// Stops the agent as systemd does (SIGTERM: it says offline and disconnects) and waits.
fn stop(agent: &mut KillOnDrop) {
    let pid = agent.0.id().to_string();
    common::succeeded(Command::new("kill").args(["-TERM", &pid]));
    let end = Instant::now() + Duration::from_secs(20);
    while agent.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "the agent did not stop within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every status published on `client`'s topic, in order, as a background subscriber saw it;
/// also a client that publishes.
struct Watch {
    statuses: Arc<Mutex<Vec<EdgeStatus>>>,
    client: AsyncClient,
    acks: Arc<Mutex<u64>>,
}

impl Watch {
    async fn start(port: u16, client_id: &str) -> Self {
        let topics = Topics::new(FEDERATION).unwrap();
        let mut options = MqttOptions::new(format!("watch-{client_id}"), "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(5));
        let (client, mut events) = AsyncClient::new(options, 64);
        client
            .subscribe(topics.edge_status(client_id), QoS::AtLeastOnce)
            .await
            .unwrap();
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let acks = Arc::new(Mutex::new(0));
        let (seen, acked) = (Arc::clone(&statuses), Arc::clone(&acks));
        tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Ok(status) = serde_json::from_slice::<EdgeStatus>(&p.payload) {
                            seen.lock().unwrap().push(status);
                        }
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) => *acked.lock().unwrap() += 1,
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Self {
            statuses,
            client,
            acks,
        }
    }

    /// The first status seen from now on that satisfies `check`, within `within`.
    async fn until(&self, within: Duration, what: &str, check: impl Fn(&EdgeStatus) -> bool) {
        let end = Instant::now() + within;
        loop {
            if self.statuses.lock().unwrap().iter().any(&check) {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what} within {within:?}: {:#?}",
                self.statuses.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn take(&self) -> Vec<EdgeStatus> {
        std::mem::take(&mut *self.statuses.lock().unwrap())
    }

    /// Publishes the coordinator's metrics of `round` saying `client`'s update did not count,
    /// at QoS 1, and waits until the broker has it.
    async fn failed_round(&self, round: u64, client: &str) {
        let metrics = serde_json::json!({
            "round": round,
            "aggregated": true,
            "clients_selected": 2,
            "clients_reported": 1,
            "failures": {client: "no_report"},
            "time": fedge_mqtt::now_rfc3339(),
        });
        let acked = *self.acks.lock().unwrap();
        let topic = Topics::new(FEDERATION).unwrap().metrics();
        (self.client)
            .publish(topic, QoS::AtLeastOnce, false, metrics.to_string())
            .await
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while *self.acks.lock().unwrap() == acked {
            assert!(Instant::now() < end, "the broker did not take the metrics");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn metrics_text(addr: &str) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent.get(format!("http://{addr}/metrics")).call().unwrap();
    response.body_mut().read_to_string().unwrap()
}

/// A corrupt image in a site folder: the agent says so in its status (how many, the last one
/// relative to the site folder, and why) and in `fedge_edge_images_skipped_total`; and the
/// loading of the folder is in the log from its start, before the agent connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_image_is_counted_in_the_status_and_the_metrics() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let images = write_site(&dir.path().join("site"), 1, &[], 120);
    std::fs::write(
        dir.path().join("site/3/broken.png"),
        b"\x89PNG\r\n\x1a\n cut",
    )
    .unwrap();
    let metrics = fedge_coordinator::io::broker::free_loopback_addr().unwrap();
    let id = "cam-corrupt";
    let profile = write_profile(
        dir.path(),
        id,
        mosquitto.port(),
        "kind = \"imagefolder\"\nroot = \"site\"",
        &format!("metrics_listen = \"{metrics}\"\n"),
    );
    let watch = Watch::start(mosquitto.port(), id).await;
    let log = dir.path().join("agent.log");
    let mut agent = run(&profile, &log);
    watch
        .until(Duration::from_secs(60), "an online status", |s| s.online)
        .await;
    let online = (watch.take().into_iter()).find(|s| s.online).unwrap();
    assert_eq!(online.skipped_images, 1, "{online:#?}");
    assert_eq!(
        online.last_skipped_image.as_deref(),
        Some("3/broken.png"),
        "named relative to the site folder: {online:#?}"
    );
    let reason = online.last_skipped_reason.clone().unwrap_or_default();
    assert!(reason.contains("replace or remove"), "{online:#?}");
    assert_eq!(online.samples as usize + 12, images.len(), "{online:#?}");
    assert!(online.loading.is_none(), "loaded before it connected");

    let text = metrics_text(&metrics.to_string());
    assert!(
        text.lines()
            .any(|l| l == "fedge_edge_images_skipped_total 1"),
        "{text}"
    );
    stop(&mut agent);
    let log = std::fs::read_to_string(&log).unwrap();
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in the log:\n{log}"))
    };
    // The folder's reading is said at its start and at its end, with counts, before the agent
    // starts (a folder this small reads in milliseconds, so at debug only; one that takes a
    // second says how far it got at info every few seconds).
    let read = format!(
        "site folder read: {} files, {} images, 1 skipped",
        images.len() + 1,
        images.len()
    );
    assert!(at("reading the site folder") < at(&read), "{log}");
    assert!(at(&read) < at("edge starting"), "{log}");
}

/// The coordinator's word that an update did not count reaches a device that was down through
/// its persistent session when it comes back; that was its previous life's failure (or its
/// absence), not the restarted device's: its statuses stay clean. An error of the running
/// agent is still reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_does_not_publish_its_previous_error() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let id = "cam-restarted";
    let data = "kind = \"digits\"\ndomain = \"rot15\"";
    let profile = write_profile(dir.path(), id, mosquitto.port(), data, "");
    let watch = Watch::start(mosquitto.port(), id).await;
    let log = dir.path().join("first.log");
    let mut first = run(&profile, &log);
    watch
        .until(Duration::from_secs(60), "the first life online", |s| {
            s.online
        })
        .await;
    // The running agent reports its round's failure.
    watch.failed_round(3, id).await;
    watch
        .until(Duration::from_secs(10), "the failure reported", |s| {
            s.online && s.last_error.contains("no_report")
        })
        .await;
    stop(&mut first);
    watch
        .until(Duration::from_secs(10), "offline", |s| !s.online)
        .await;
    // While it is down, another round goes by without it: queued for its session.
    watch.failed_round(4, id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    watch.take();

    let log = dir.path().join("second.log");
    let mut second = run(&profile, &log);
    watch
        .until(Duration::from_secs(60), "the second life online", |s| {
            s.online
        })
        .await;
    // The queued metrics come right after the connection: give them time to.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = watch.take();
    let online: Vec<&EdgeStatus> = seen.iter().filter(|s| s.online).collect();
    assert!(!online.is_empty());
    for status in &online {
        assert_eq!(status.last_error, "", "{seen:#?}");
    }
    // A failure of this life is still its own.
    watch.failed_round(5, id).await;
    watch
        .until(Duration::from_secs(10), "the new failure reported", |s| {
            s.online && s.last_error.contains("round 5")
        })
        .await;
    stop(&mut second);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("before this agent connected"), "{log}");
}
