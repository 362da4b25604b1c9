//! The broker side against a hostile fleet: fedge's clients survive what a broker forwards
//! (a large retained message), send a login and say when it is refused, and the documented
//! mosquitto set-up (`deploy/mosquitto/`, run as shipped) keeps every device in its own lane:
//! no publishing into another device's or another federation's topics, no taking over the
//! coordinator's session by its client id, dashboards read-only. The Jetson unit can reach the
//! GPU; the docs show the shipped files.

pub(crate) mod mosquitto;

use std::time::Duration;

use fedge_mqtt::{BrokerConfig, Password, TlsSettings};
use rumqttc::{AsyncClient, Event, EventLoop, Packet, QoS};
use tokio::sync::mpsc;

use crate::common;
use mosquitto::Broker;

/// What a listening client saw.
#[derive(Debug)]
enum Seen {
    Message(String, Vec<u8>),
    Error(String),
}

/// Polls `events` in a task, reporting every message and every connection error (after which
/// rumqttc reconnects on the next poll).
fn listen(mut events: EventLoop) -> mpsc::UnboundedReceiver<Seen> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match events.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    Seen::Message(p.topic.clone(), p.payload.to_vec())
                }
                Ok(_) => continue,
                Err(e) => {
                    let seen = Seen::Error(fedge_mqtt::describe_error(&e));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    seen
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    rx
}

/// Connects and subscribes to `filters`, waiting for the broker's answers (10 s at most).
async fn connect(
    broker: &BrokerConfig,
    id: &str,
    clean: bool,
    filters: &[&str],
) -> (AsyncClient, EventLoop) {
    let mut options = broker.options(id, None);
    options.set_clean_session(clean);
    let (client, mut events) = AsyncClient::new(options, 64);
    for filter in filters {
        client.try_subscribe(*filter, QoS::AtLeastOnce).unwrap();
    }
    let mut acks = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while acks < filters.len() + 1 {
        match tokio::time::timeout_at(until, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_) | Packet::SubAck(_)))) => acks += 1,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("{id} cannot connect: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => panic!("{id}: no CONNACK/SUBACK within 10 s"),
        }
    }
    (client, events)
}

/// The messages `rx` receives until one on `until_topic` arrives (10 s at most), then for
/// another `linger`; panics on a connection error.
async fn messages_until(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    until_topic: &str,
    linger: Duration,
) -> Vec<(String, Vec<u8>)> {
    let mut seen = Vec::new();
    let mut deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut found = false;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Seen::Message(topic, payload))) => {
                if !found && topic == until_topic {
                    found = true;
                    deadline = tokio::time::Instant::now() + linger;
                }
                seen.push((topic, payload));
            }
            Ok(Some(Seen::Error(e))) => panic!("connection lost: {e}"),
            Ok(None) => panic!("listener stopped"),
            Err(_) if found => return seen,
            Err(_) => panic!("nothing on {until_topic} within 10 s; saw {seen:?}"),
        }
    }
}

/// Publishes at QoS 1 and polls until the broker acknowledged (5 s at most).
async fn publish(
    client: &AsyncClient,
    events: &mut EventLoop,
    topic: &str,
    payload: &[u8],
    retain: bool,
) {
    client
        .try_publish(topic, QoS::AtLeastOnce, retain, payload.to_vec())
        .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(until, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => return,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("publishing on {topic}: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => panic!("no PUBACK for {topic} within 5 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_retained_message_reaches_our_client_which_stays_connected() {
    let broker = common::embedded_broker();
    let topic = "fedge/large/edge/cam-01/status";
    // A device's huge retained status, 200 KB, above the old 132 KiB incoming limit.
    let big = vec![b'x'; 200_000];
    let device = BrokerConfig {
        max_packet: 300_000,
        ..broker.clone()
    };
    let (writer, mut writer_events) = connect(&device, "big-writer", true, &[]).await;
    publish(&writer, &mut writer_events, topic, &big, true).await;
    let (_reader, reader_events) = connect(&broker, "reader", true, &["fedge/large/#"]).await;
    let mut seen = listen(reader_events);
    match tokio::time::timeout(Duration::from_secs(10), seen.recv()).await {
        Ok(Some(Seen::Message(t, payload))) => {
            assert_eq!(t, topic);
            assert_eq!(payload.len(), big.len());
        }
        other => panic!("the retained 200 KB message did not arrive: {other:?}"),
    }

    // Someone publishes above the broker's 1 MiB limit on the same topic: the broker drops
    // that connection, ours stays up and keeps receiving.
    let mut raw = rumqttc::MqttOptions::new("oversized", "127.0.0.1", broker.port);
    raw.set_max_packet_size(4 << 20, 4 << 20);
    let (oversized, mut oversized_events) = AsyncClient::new(raw, 8);
    oversized
        .try_publish(topic, QoS::AtLeastOnce, false, vec![b'y'; (1 << 20) + 1024])
        .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(e) = oversized_events.poll().await {
                return e;
            }
        }
    })
    .await
    .expect("the broker neither refused nor forwarded the oversized publish");
    eprintln!("the oversized publisher sees: {refused}");
    publish(&writer, &mut writer_events, topic, b"small", false).await;
    let after: Vec<_> = messages_until(&mut seen, topic, Duration::from_millis(200)).await;
    assert_eq!(
        after,
        vec![(topic.to_owned(), b"small".to_vec())],
        "only the small message after the oversized one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_login_is_sent_and_a_wrong_one_is_refused_with_an_error_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::with_passwords(dir.path(), &[("cam-01", "right horse")]) else {
        return;
    };
    // The device's password file, next to its profile, owner-only.
    let write_password = |name: &str, password: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{password}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    write_password("right.pw", "right horse");
    write_password("wrong.pw", "wrong horse");
    let profile = |file: &str| {
        let mut config = BrokerConfig {
            username: Some("cam-01".into()),
            password_file: Some(file.into()),
            ..BrokerConfig::at("127.0.0.1", broker.port())
        };
        // Relative to the profile's folder, as a loaded profile's are.
        config.load(dir.path()).unwrap();
        config
    };
    let right = profile("right.pw");
    assert!(!format!("{right:?}").contains("right horse"));
    connect(&right, "cam-01", true, &["fedge/login/#"]).await;

    for (name, config) in [
        ("a wrong password", profile("wrong.pw")),
        ("no login", BrokerConfig::at("127.0.0.1", broker.port())),
        (
            "an unknown user",
            BrokerConfig {
                username: Some("mallory".into()),
                password: Some(Password::new("right horse")),
                ..BrokerConfig::at("127.0.0.1", broker.port())
            },
        ),
    ] {
        let (_client, mut events) = AsyncClient::new(config.options("cam-01", None), 8);
        let text = match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Err(e)) => fedge_mqtt::describe_error(&e),
            Ok(Ok(event)) => panic!("{name} was accepted: {event:?}"),
            Err(_) => panic!("{name}: neither refused nor accepted within 10 s"),
        };
        eprintln!("{name}: {text}");
        assert!(
            text.contains("refused the login") && text.contains("username"),
            "{name}: {text}"
        );
    }
}

/// The identities of the documented set-up: certificate common names.
const COORDINATOR: &str = "fedge-coordinator-site-1";
const DASHBOARD: &str = "fedge-dashboard";
const PUBLISHER: &str = "fedge-publisher";
const OPERATOR: &str = "fedge-operator";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_mosquitto_setup_keeps_devices_and_dashboards_in_their_lane() {
    if !crate::tls::has_openssl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    crate::tls::make_certificates(dir.path());
    for cn in [
        COORDINATOR,
        DASHBOARD,
        PUBLISHER,
        OPERATOR,
        "cam-01",
        "cam-02",
        "observer",
    ] {
        crate::tls::client_certificate(dir.path(), cn);
    }
    let Some(broker) = Broker::documented(dir.path()) else {
        return;
    };
    let identity = |cn: &str| BrokerConfig {
        tls: Some(
            TlsSettings::with_files(
                dir.path().join("ca.pem"),
                Some((
                    dir.path().join(format!("{cn}.pem")),
                    dir.path().join(format!("{cn}.key")),
                )),
            )
            .unwrap(),
        ),
        ..BrokerConfig::at("127.0.0.1", broker.port())
    };
    // A key that does not belong to the certificate is refused when the settings load.
    let mismatch = TlsSettings::with_files(
        dir.path().join("ca.pem"),
        Some((dir.path().join("cam-01.pem"), dir.path().join("cam-02.key"))),
    )
    .unwrap_err()
    .to_string();
    assert!(
        mismatch.contains("client_cert and client_key"),
        "{mismatch}"
    );
    let t = fedge_wire::Topics::new("site-1").unwrap();
    let other = fedge_wire::Topics::new("site-2").unwrap();

    // The coordinator as its driver connects: persistent session, its client id, the update
    // and status filters. The observer (a test-only user that may read everything) sees what
    // the broker lets through anywhere.
    let (coordinator, coordinator_events) = connect(
        &identity(COORDINATOR),
        COORDINATOR,
        false,
        &[&t.update_filter(), &t.edge_status_filter(), &t.control()],
    )
    .await;
    let mut coordinator_seen = listen(coordinator_events);
    let (_observer, observer_events) =
        connect(&identity("observer"), "observer", true, &["#"]).await;
    let mut observer_seen = listen(observer_events);

    // (a) cam-01 publishes as cam-02, into the other federation and a round task: all
    // dropped. Its own update, published last, arrives; nothing before it did.
    let (cam, mut cam_events) = connect(&identity("cam-01"), "cam-01", true, &[]).await;
    for topic in [
        t.update("cam-02"),
        t.edge_status("cam-02"),
        other.update("cam-01"),
        other.round_task(),
        t.round_task(),
        t.metrics(),
    ] {
        publish(&cam, &mut cam_events, &topic, b"forged", false).await;
    }
    publish(&cam, &mut cam_events, &t.update("cam-01"), b"mine", false).await;
    let expected = vec![(t.update("cam-01"), b"mine".to_vec())];
    let linger = Duration::from_millis(500);
    assert_eq!(
        messages_until(&mut coordinator_seen, &t.update("cam-01"), linger).await,
        expected
    );
    assert_eq!(
        messages_until(&mut observer_seen, &t.update("cam-01"), linger).await,
        expected
    );

    // (b) cam-02 connects with the coordinator's client id: the broker gives it its own id,
    // so the coordinator is not disconnected and keeps receiving.
    let (impostor, mut impostor_events) =
        connect(&identity("cam-02"), COORDINATOR, true, &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    match coordinator_seen.try_recv() {
        Err(mpsc::error::TryRecvError::Empty) => {}
        Ok(Seen::Error(e)) => {
            panic!("a device using the coordinator's client id disconnected the coordinator: {e}")
        }
        other => panic!("unexpected at the coordinator: {other:?}"),
    }
    publish(
        &impostor,
        &mut impostor_events,
        &t.update("cam-02"),
        b"as cam-02",
        false,
    )
    .await;
    publish(&cam, &mut cam_events, &t.edge_status("cam-01"), b"{}", true).await;
    let seen = messages_until(&mut coordinator_seen, &t.edge_status("cam-01"), linger).await;
    assert_eq!(
        seen,
        vec![
            (t.update("cam-02"), b"as cam-02".to_vec()),
            (t.edge_status("cam-01"), b"{}".to_vec()),
        ],
        "the coordinator lost its connection or missed a message"
    );
    messages_until(&mut observer_seen, &t.edge_status("cam-01"), Duration::ZERO).await;

    // (c) The dashboard reads the coordinator's status and metrics and the devices' statuses;
    // its publishes (a task, an update under its own name) go nowhere.
    let (dashboard, dashboard_events) = connect(
        &identity(DASHBOARD),
        "grafana",
        true,
        &[
            &t.coordinator_status(),
            &t.metrics(),
            &t.edge_status_filter(),
        ],
    )
    .await;
    let mut dashboard_seen = listen(dashboard_events);
    for topic in [
        t.round_task(),
        t.update(DASHBOARD),
        t.edge_status(DASHBOARD),
    ] {
        dashboard
            .try_publish(
                topic,
                QoS::AtLeastOnce,
                false,
                b"from the dashboard".to_vec(),
            )
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The coordinator publishes through the connection it has (a second connection with its
    // certificate would take its session over).
    let status = br#"{"state":"training"}"#.to_vec();
    coordinator
        .try_publish(t.coordinator_status(), QoS::AtLeastOnce, true, status)
        .unwrap();
    coordinator
        .try_publish(
            t.metrics(),
            QoS::AtLeastOnce,
            false,
            br#"{"round":1}"#.to_vec(),
        )
        .unwrap();
    let seen = messages_until(&mut dashboard_seen, &t.metrics(), linger).await;
    let topics: Vec<&str> = seen.iter().map(|(topic, _)| topic.as_str()).collect();
    assert!(
        topics.contains(&t.edge_status("cam-01").as_str()),
        "{topics:?}"
    );
    assert!(
        topics.contains(&t.coordinator_status().as_str()),
        "{topics:?}"
    );
    let seen = messages_until(&mut observer_seen, &t.metrics(), linger).await;
    assert!(
        seen.iter()
            .all(|(_, payload)| payload != b"from the dashboard"),
        "a dashboard's publish got through: {seen:?}"
    );

    // (d) `publish-backbone` with the publisher's certificate, as documented, while the
    // coordinator runs: the backbone is retained where devices read it, and the coordinator
    // keeps its connection and its messages (with the coordinator's certificate, the broker
    // gives the publisher the coordinator's client id and the coordinator is pushed off).
    let config = dir.path().join("publisher.toml");
    let tls = |file: &str| dir.path().join(file).display().to_string();
    let text = format!(
        "federation = \"site-1\"\n[broker]\nhost = \"127.0.0.1\"\nport = {}\n\
         [broker.tls]\nca_file = {:?}\nclient_cert = {:?}\nclient_key = {:?}\n\
         [head]\nfeatures = 512\nhidden = 8\nclasses = 10\n",
        broker.port(),
        tls("ca.pem"),
        tls(&format!("{PUBLISHER}.pem")),
        tls(&format!("{PUBLISHER}.key")),
    );
    std::fs::write(&config, text).unwrap();
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::coordinator_binary())
            .args(["publish-backbone", "--config"])
            .arg(&config)
            .arg("--card")
            .arg(&card)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = messages_until(&mut observer_seen, &t.backbone_current(), Duration::ZERO).await;
    assert!(
        seen.iter()
            .any(|(topic, _)| topic.starts_with(&t.backbone("")))
    );
    publish(&cam, &mut cam_events, &t.update("cam-01"), b"after", false).await;
    let seen = messages_until(&mut coordinator_seen, &t.update("cam-01"), Duration::ZERO).await;
    assert_eq!(
        seen,
        vec![(t.update("cam-01"), b"after".to_vec())],
        "the coordinator lost its connection or a message while the backbone was published"
    );

    // (e) `ctl` with the operator's own certificate (--broker, --cert, --key) and the
    // coordinator's configuration file: the command reaches the coordinator, which keeps its
    // connection. (No coordinator answers here, so ctl gives up waiting for the status.)
    let config = dir.path().join("coordinator-view.toml");
    std::fs::write(
        &config,
        "federation = \"site-1\"\n[head]\nfeatures = 8\nhidden = 4\nclasses = 2\n\
         [auth]\noperator_key_file = \"operator.key\"\n",
    )
    .unwrap();
    let ctl = move |args: &[&str]| {
        std::process::Command::new(common::coordinator_binary())
            .arg("ctl")
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(ctl(&["keygen"]).status.success());
    let url = format!("mqtts://127.0.0.1:{}", broker.port());
    let (ca, cert, key) = (
        tls("ca.pem"),
        tls(&format!("{OPERATOR}.pem")),
        tls(&format!("{OPERATOR}.key")),
    );
    let out = tokio::task::spawn_blocking(move || {
        let login = [
            "--broker",
            &url,
            "--ca-file",
            &ca,
            "--cert",
            &cert,
            "--key",
            &key,
        ];
        let args: Vec<&str> = ["--wait", "1"]
            .into_iter()
            .chain(login)
            .chain(["pause"])
            .collect();
        ctl(&args)
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("cannot connect"), "{said}");
    let seen = messages_until(&mut coordinator_seen, &t.control(), Duration::ZERO).await;
    assert!(
        seen.iter().any(|(topic, _)| *topic == t.control()),
        "{seen:?}"
    );

    // The operator's terminal view, with the dashboard's certificate.
    drop(dashboard);
    let out = std::process::Command::new(common::coordinator_binary())
        .args(["watch", "--once", "2", "--federation", "site-1", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{}", broker.port()))
        .arg("--ca-file")
        .arg(dir.path().join("ca.pem"))
        .arg("--cert")
        .arg(dir.path().join(format!("{DASHBOARD}.pem")))
        .arg("--key")
        .arg(dir.path().join(format!("{DASHBOARD}.key")))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("coordinator: training"), "{text}");
}

#[test]
fn the_jetson_unit_reaches_the_gpu_and_the_generic_unit_keeps_a_private_dev() {
    let deploy = common::repo_root().join("deploy");
    let settings = |name: &str| -> Vec<(String, String)> {
        std::fs::read_to_string(deploy.join(name))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains('='))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.trim().to_owned(), v.trim().to_owned())
            })
            .collect()
    };
    let value = |s: &[(String, String)], key: &str| {
        s.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    let generic = settings("fedge-edge.service");
    let jetson = settings("fedge-edge-jetson.service");
    assert_eq!(value(&generic, "PrivateDevices"), ["true"]);
    assert_eq!(value(&jetson, "PrivateDevices"), ["false"]);
    assert_eq!(value(&jetson, "SupplementaryGroups"), ["video"]);
    assert!(
        value(&jetson, "DevicePolicy")
            .iter()
            .all(|v| v != "closed" && v != "strict")
    );
    // Everything else the generic unit hardens, the Jetson unit hardens too.
    for (key, v) in &generic {
        if ["PrivateDevices", "MemoryMax", "Description"].contains(&key.as_str()) {
            continue;
        }
        assert!(
            value(&jetson, key).contains(v),
            "fedge-edge-jetson.service lacks {key}={v}"
        );
    }
}

#[test]
fn the_mosquitto_doc_shows_the_shipped_files() {
    let root = common::repo_root();
    let doc = std::fs::read_to_string(root.join("docs/mosquitto.md")).unwrap();
    for file in ["deploy/mosquitto/fedge.conf", "deploy/mosquitto/fedge.acl"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            doc.contains(&format!("```\n{text}```")),
            "docs/mosquitto.md must show {file} as it is"
        );
    }
}
