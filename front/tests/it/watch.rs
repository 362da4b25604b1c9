//! `fedge-coordinator watch --once`, the operator's terminal view, against a gated federation
//! over mosquitto: a fleet ran two rounds, the evaluation site scored the release served and a
//! worse candidate, which the gate held, and a device raised drift alarms. What the view shows
//! comes from the retained statuses alone (metrics are not retained, and `--once` sees no round
//! end): the run's progress in aggregated rounds, the accuracy of the release served apart
//! from the candidate's, the release, the gate's verdict, the drift alarms, and the last round
//! the status holds.

use rumqttc::{AsyncClient, MqttOptions, QoS};

use crate::common;
use crate::prometheus::{SITE, gated_federation, site_scores};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_once_shows_the_run_the_release_served_the_gate_and_drift_from_the_statuses() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let federation = "wt";
    let options = common::driver_options(mosquitto.broker(), federation);
    let (_coordinator, _) = gated_federation(options).await;
    let topics = fedge_wire::Topics::new(federation).unwrap();
    let port = mosquitto.port();
    let (client, mut events) =
        AsyncClient::new(MqttOptions::new("operator-test", "127.0.0.1", port), 16);
    client
        .subscribe(topics.coordinator_status(), QoS::AtLeastOnce)
        .await
        .unwrap();
    let status = common::wait_status(&mut events, &topics.coordinator_status(), |s| {
        s.release.as_ref().is_some_and(|r| r.candidate.is_some())
    })
    .await;
    let release = status.release.unwrap();
    let (served, candidate) = (release.serving.unwrap(), release.candidate.unwrap());
    site_scores(&client, federation, &served, &candidate).await;
    // A device that serves the release and whose drift alarm went off twice.
    let device = fedge_wire::EdgeStatus {
        client_id: "cam-drift".into(),
        online: true,
        serving: Some(served.sha256.clone()),
        drift: Some(fedge_wire::DriftStatus {
            level: 0.4,
            alarms: 2,
            last_alarm: Some("2026-11-23T09:58:00.000Z".into()),
            requests: 400,
            reference: 100,
            adaptations: 0,
            last_adapted: None,
        }),
        ..Default::default()
    };
    let json = serde_json::to_vec(&device).unwrap();
    client
        .publish(
            topics.edge_status("cam-drift"),
            QoS::AtLeastOnce,
            true,
            json,
        )
        .await
        .unwrap();
    // The coordinator took the scores: its retained status says the verdict.
    let status = common::wait_status(&mut events, &topics.coordinator_status(), |s| {
        let held = (s.release.as_ref().and_then(|r| r.gate.as_ref()))
            .is_some_and(|g| g.outcome == fedge_wire::GateOutcome::Held);
        held && !s.candidate_accuracy.is_empty()
    })
    .await;
    let k = status.aggregated_rounds.expect("the rounds aggregated");
    let url = format!("mqtt://127.0.0.1:{port}");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::coordinator_binary())
            .args([
                "watch",
                "--once",
                "2",
                "--federation",
                federation,
                "--broker",
            ])
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let view = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The round against the run's length, both counted in aggregated rounds.
    assert!(view.contains(&format!("aggregated {k}/50")), "{view}");
    assert!(
        !view.contains(&format!("round {}/", status.round)),
        "{view}"
    );
    for needle in [
        format!(
            "accuracy: target 90.0% (release served, by site: {SITE} 90.0%), candidate 88.0% \
             (by site: {SITE} 88.0%)"
        ),
        format!(
            "release: gated, serving round 1 ({}), candidate round {k} ({}); stage: candidate \
             held",
            &served.sha256[..12],
            &candidate.sha256[..12]
        ),
        format!("gate: held round {k} ({})", &candidate.sha256[..12]),
        "drift: 1 of 1 device(s) watching alarmed: cam-drift 2 alarm(s), last \
         2026-11-23T09:58:00.000Z"
            .to_owned(),
    ] {
        assert!(view.contains(&needle), "{needle:?} missing from\n{view}");
    }
    // The last rounds: none ended while watching, so the last one the status holds.
    let table = view
        .split("round  target")
        .nth(1)
        .expect("the rounds table");
    let row = table.lines().nth(1).unwrap_or_default();
    let closed = if status.state == "training" {
        status.round - 1
    } else {
        status.round
    };
    assert!(
        row.starts_with(&format!("{closed:5}   90.0%")),
        "no round in the table:\n{view}"
    );
    let cam = view.lines().find(|l| l.starts_with("cam-drift"));
    assert!(
        cam.is_some_and(|l| l.contains(&served.sha256[..12])),
        "{view}"
    );
}
