//! The machine's releases, class lists and evaluation-only sites.

use fedge_wire::ClientUpdate;
use fedge_wire::{EdgeStatus, HeadConfig, ModelRelease, Role, SiteEvaluation, TensorF32};

use super::tests::{M, config, drain, machine, tasks, update};
use super::*;

pub(super) fn releases(outputs: &[Output]) -> Vec<ModelRelease> {
    (outputs.iter())
        .filter_map(|o| match o {
            Output::Release(r) => Some(r.as_ref().clone()),
            _ => None,
        })
        .collect()
}

fn named() -> RoundConfig {
    RoundConfig {
        classes: vec!["ok".into(), "scratch".into()],
        backbone: "digits-conv".into(),
        // 1·1 + 1 + 1·2 + 2 = 6 values.
        head: Some(HeadConfig::new(1, 2).with_hidden(1)),
        ..config()
    }
}

#[test]
fn every_task_carries_the_class_list_and_every_aggregation_a_verified_release() {
    let mut m = Rounds::new(named(), Box::new(crate::strategy::FedAvg), vec![0.0; 6]);
    for c in ["a", "b"] {
        m.handle_client_status(c, true, 0);
    }
    let task = tasks(&drain(&mut m)).remove(0);
    assert_eq!(task.classes, ["ok", "scratch"]);
    let six = |v: f32| TensorF32::from_slice(&[v; 6]);
    for (c, v) in [("a", 1.0), ("b", 3.0)] {
        let frame = ClientUpdate {
            features: None,
            run: 0,
            round: 1,
            client_id: c.into(),
            seq: 1,
            num_samples: 10,
            delta: six(v),
            metrics: Default::default(),
            class_stats: None,
            prototypes: None,
        };
        m.handle_packet(c, &fedge_wire::encode(&Message::ClientUpdate(frame)), 1);
    }
    let released = releases(&drain(&mut m));
    assert_eq!(released.len(), 1);
    let release = &released[0];
    assert_eq!((release.round, release.strategy.as_str()), (1, "fedavg"));
    assert_eq!(release.classes, ["ok", "scratch"]);
    assert_eq!(release.backbone, "digits-conv");
    assert_eq!(release.verify().unwrap(), vec![2.0; 6]);
}

#[test]
fn an_abandoned_round_releases_nothing_and_a_machine_without_a_head_never_does() {
    let mut m = machine(&["a", "b"], config());
    drain(&mut m);
    m.handle_packet("a", &update("a", 1, [1.0; M], 1), 1);
    m.handle_packet("b", &update("b", 1, [1.0; M], 1), 1);
    assert!(releases(&drain(&mut m)).is_empty(), "no head configured");
    let mut m = Rounds::new(named(), Box::new(crate::strategy::FedAvg), vec![0.0; 6]);
    for c in ["a", "b"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    // The deadline passes twice below quorum: the round is abandoned.
    m.handle_timeout(10_000);
    m.handle_timeout(100_000);
    assert!(releases(&drain(&mut m)).is_empty());
}

/// A machine of `named()` with trainers `a` and `b` that released round 1, and that release.
fn released_machine() -> (Rounds, ModelRelease) {
    let mut m = Rounds::new(named(), Box::new(crate::strategy::FedAvg), vec![0.0; 6]);
    for c in ["a", "b"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    for c in ["a", "b"] {
        let frame = ClientUpdate {
            features: None,
            run: 0,
            round: 1,
            client_id: c.into(),
            seq: 1,
            num_samples: 10,
            delta: TensorF32::from_slice(&[1.0; 6]),
            metrics: Default::default(),
            class_stats: None,
            prototypes: None,
        };
        m.handle_packet(c, &fedge_wire::encode(&Message::ClientUpdate(frame)), 1);
    }
    let release = releases(&drain(&mut m)).remove(0);
    (m, release)
}

fn status(client: &str, role: Role, accuracy: Option<f32>) -> EdgeStatus {
    EdgeStatus {
        client_id: client.into(),
        online: true,
        role,
        evaluation: accuracy.map(|accuracy| SiteEvaluation {
            model_round: 1,
            accuracy,
            class_accuracy: vec![Some(accuracy)],
            samples: 10,
        }),
        ..EdgeStatus::default()
    }
}

/// An evaluation-only site's status scoring the release with this SHA-256.
fn scoring(client: &str, sha256: &str, accuracy: f32) -> EdgeStatus {
    EdgeStatus {
        evaluated: Some(sha256.to_owned()),
        ..status(client, Role::Evaluate, Some(accuracy))
    }
}

#[test]
fn evaluation_only_devices_are_never_selected_and_their_accuracy_is_kept() {
    let mut m = machine(&[], config());
    m.handle_edge_status("site-75", &status("site-75", Role::Evaluate, None), 0);
    m.handle_edge_status("a", &status("a", Role::Train, None), 0);
    assert_eq!(
        m.phase(),
        Phase::Waiting,
        "one trainer is below min_clients"
    );
    m.handle_edge_status("b", &status("b", Role::Train, None), 0);
    let task = tasks(&drain(&mut m)).remove(0);
    assert_eq!(task.selected, ["a", "b"]);
    let (mut m, release) = released_machine();
    let sha = release.sha256_hex();
    m.handle_edge_status("site-75", &scoring("site-75", &sha, 0.5), 2);
    assert_eq!(m.site_accuracy().get("site-75"), Some(&0.5));
    // Nonsense is ignored; a new score replaces the old.
    m.handle_edge_status("site-75", &scoring("site-75", &sha, f32::NAN), 3);
    m.handle_edge_status("site-75", &scoring("site-75", &sha, 7.0), 3);
    assert_eq!(m.site_accuracy().get("site-75"), Some(&0.5));
    m.handle_edge_status("site-75", &scoring("site-75", &sha, 0.75), 3);
    assert_eq!(m.site_accuracy().get("site-75"), Some(&0.75));
    // A score of a release this coordinator never made (an earlier run's retained status, a
    // made-up one) or of none says nothing of this run.
    m.handle_edge_status("site-75", &scoring("site-75", &"ee".repeat(32), 0.99), 4);
    m.handle_edge_status("site-75", &status("site-75", Role::Evaluate, Some(0.98)), 4);
    assert_eq!(m.site_accuracy().get("site-75"), Some(&0.75));
}

#[test]
fn the_sites_kept_are_bounded() {
    let (mut m, release) = released_machine();
    let sha = release.sha256_hex();
    for i in 0..release::MAX_SITES + 10 {
        let c = format!("site-{i}");
        m.handle_edge_status(&c, &scoring(&c, &sha, 0.5), 2);
    }
    assert_eq!(m.site_accuracy().len(), release::MAX_SITES);
}
