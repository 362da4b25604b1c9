//! A site aggregator's rounds: opened by the global task, answered upstream as one update.

use fedge_wire::{ClassStats, ClientUpdate, LocalMetrics, Message, ModelRelease, Objective};
use fedge_wire::{RoundTask, TensorF32, TrainParams};

use super::tests::{M, drain, tasks};
use super::*;
use crate::objectives::fedddl::PrototypeConfig;
use crate::strategy::FedAvg;

fn site_config() -> RoundConfig {
    RoundConfig {
        federation: "plant-7".into(),
        run: 77,
        rounds: 0,
        min_clients: 1,
        min_updates: 1,
        round_timeout_ms: 10_000,
        relay: Some(RelayConfig {
            site: "plant-7".into(),
            margin_ms: 1_000,
        }),
        ..RoundConfig::default()
    }
}

fn site(clients: &[&str], config: RoundConfig) -> Rounds {
    let mut m = Rounds::new(config, Box::new(FedAvg), vec![0.0; M]);
    for c in clients {
        m.handle_client_status(c, true, 0);
    }
    m
}

fn global_task(round: u64, params: [f32; M], objective: Objective) -> RoundTask {
    RoundTask {
        pooled: None,
        federation: "demo".into(),
        run: 9,
        round,
        selected: vec!["plant-7".into(), "plant-8".into()],
        classes: Vec::new(),
        params: TensorF32::from_slice(&params),
        train: TrainParams {
            objective,
            learning_rate: 0.125,
            ..TrainParams::default()
        },
        deadline_ms: 6_000,
        insight: None,
        prototypes: None,
        backbone: None,
    }
}

fn device_update(client: &str, round: u64, delta: [f32; M], n: u32) -> ClientUpdate {
    ClientUpdate {
        features: None,
        run: 77,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: n,
        delta: TensorF32::from_slice(&delta),
        metrics: LocalMetrics {
            train_loss: n as f32,
            val_accuracy: 0.5,
            val_samples: 10,
            train_seconds: n as f32,
        },
        class_stats: None,
        prototypes: None,
    }
}

fn send(m: &mut Rounds, update: ClientUpdate, now: u64) {
    let client = update.client_id.clone();
    m.handle_packet(
        &client,
        &fedge_wire::encode(&Message::ClientUpdate(update)),
        now,
    );
}

fn upstream(outputs: &[Output]) -> Vec<ClientUpdate> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Upstream(u) => Some(u.as_ref().clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_site_waits_for_the_global_task_and_passes_its_settings_on() {
    let mut m = site(&["a", "b"], site_config());
    assert!(
        tasks(&drain(&mut m)).is_empty(),
        "a site opens no round of its own"
    );
    let opened = m.relay_task(
        global_task(3, [1.0, 2.0, 3.0, 4.0], Objective::FedProx),
        100,
    );
    assert_eq!(opened, Ok(true));
    let t = tasks(&drain(&mut m));
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!((t.round, t.run, t.federation.as_str()), (3, 77, "plant-7"));
    assert_eq!(t.selected, ["a", "b"]);
    assert_eq!(t.params.to_vec(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        (t.train.objective, t.train.learning_rate),
        (Objective::FedProx, 0.125)
    );
    // 6 s global minus the 1 s margin.
    assert_eq!(t.deadline_ms, 5_000);
    // The same task again (a reconnect's retained copy) changes nothing.
    let again = m.relay_task(
        global_task(3, [1.0, 2.0, 3.0, 4.0], Objective::FedProx),
        200,
    );
    assert_eq!(again, Ok(false));
    assert!(tasks(&drain(&mut m)).is_empty());
}

#[test]
fn the_site_answers_with_the_sample_weighted_step_and_its_total_samples() {
    let mut m = site(&["a", "b"], site_config());
    m.relay_task(
        global_task(3, [1.0, 1.0, 1.0, 1.0], Objective::CrossEntropy),
        0,
    )
    .unwrap();
    drain(&mut m);
    send(&mut m, device_update("a", 3, [4.0, 0.0, 0.0, 0.0], 1), 10);
    send(&mut m, device_update("b", 3, [0.0, 4.0, 0.0, 0.0], 3), 20);
    let out = drain(&mut m);
    let up = upstream(&out);
    assert_eq!(up.len(), 1);
    let u = &up[0];
    assert_eq!((u.client_id.as_str(), u.run, u.round), ("plant-7", 9, 3));
    assert_eq!(u.num_samples, 4);
    assert_eq!(u.delta.to_vec(), [1.0, 3.0, 0.0, 0.0]);
    // Loss weighted by samples: (1·1 + 3·3) / 4; the longest training.
    assert_eq!((u.metrics.train_loss, u.metrics.train_seconds), (2.5, 3.0));
    assert_eq!(u.metrics.val_samples, 20);
    // The site's aggregate is not the global model: no release of its own, no next round.
    assert!(!out.iter().any(|o| matches!(o, Output::Release(_))));
    assert!(tasks(&out).is_empty());
    assert_eq!(m.phase(), Phase::Waiting);
    // An answered round's task is ignored; the next global round opens the next site round.
    assert_eq!(
        m.relay_task(global_task(3, [0.0; M], Objective::CrossEntropy), 30),
        Ok(false)
    );
    m.relay_task(global_task(4, [2.0; M], Objective::CrossEntropy), 40)
        .unwrap();
    assert_eq!(tasks(&drain(&mut m))[0].round, 4);
}

#[test]
fn prototypes_are_merged_by_count_and_feddim_is_refused() {
    let config = RoundConfig {
        prototypes: Some(PrototypeConfig {
            hidden: 1,
            classes: 2,
        }),
        ..site_config()
    };
    let mut m = site(&["a", "b"], config);
    m.relay_task(global_task(1, [0.0; M], Objective::FedDdl), 0)
        .unwrap();
    drain(&mut m);
    for (client, counts, means) in [("a", [1, 0], [2.0, 9.0]), ("b", [3, 2], [6.0, 1.0])] {
        let mut u = device_update(client, 1, [0.0; M], 5);
        u.prototypes = Some(ClassStats {
            counts: counts.to_vec(),
            means: TensorF32::from_slice(&means),
        });
        send(&mut m, u, 5);
    }
    let out = drain(&mut m);
    let up = upstream(&out);
    assert_eq!(up.len(), 1, "{out:?}");
    let p = up[0].prototypes.clone().unwrap();
    assert_eq!(p.counts, [4, 2]);
    // Class 0: (1·2 + 3·6) / 4; class 1: b's alone (a has none).
    assert_eq!(p.means.to_vec(), [5.0, 1.0]);
    assert_eq!(
        m.relay_task(global_task(2, [0.0; M], Objective::FedDim), 10),
        Err(RelayError::FedDim)
    );
    // A site not configured for FedDDL refuses rather than pass unchecked prototypes up.
    let mut plain = site(&["a"], site_config());
    assert_eq!(
        plain.relay_task(global_task(1, [0.0; M], Objective::FedDdl), 0),
        Err(RelayError::Objective(Objective::FedDdl))
    );
}

#[test]
fn a_newer_global_round_closes_the_open_one_and_a_quiet_site_ends_at_its_share() {
    let mut m = site(&["a", "b"], site_config());
    m.relay_task(global_task(1, [0.0; M], Objective::CrossEntropy), 0)
        .unwrap();
    drain(&mut m);
    send(&mut m, device_update("a", 1, [2.0; M], 1), 10);
    // The global round moved on: the site's round 1 closes with what it has.
    m.relay_task(global_task(2, [0.0; M], Objective::CrossEntropy), 20)
        .unwrap();
    let out = drain(&mut m);
    assert_eq!(upstream(&out)[0].round, 1);
    assert_eq!(tasks(&out)[0].round, 2);
    // Nobody answers round 2: it ends at 20 + 5,000 ms without extension or answer.
    assert_eq!(m.poll_timeout(), Some(5_020));
    m.handle_timeout(5_020);
    let out = drain(&mut m);
    assert!(upstream(&out).is_empty());
    assert_eq!(m.phase(), Phase::Waiting);
}

#[test]
fn the_global_release_reaches_the_site_under_its_own_name() {
    let mut m = site(&["a"], site_config());
    let head = fedge_wire::HeadConfig::new(1, 2).with_hidden(1);
    let params = vec![0.5; head.num_params()];
    let release = ModelRelease {
        pooled: None,
        federation: "demo".into(),
        run: 9,
        round: 4,
        strategy: "fedomg".into(),
        classes: vec!["x".into(), "y".into()],
        backbone: "b".into(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    };
    m.relay_release(release.clone());
    let out = drain(&mut m);
    let Some(r) = out.iter().find_map(|o| match o {
        Output::Release(r) => Some(r),
        _ => None,
    }) else {
        panic!("no release: {out:?}");
    };
    assert_eq!((r.federation.as_str(), r.run, r.round), ("plant-7", 77, 4));
    assert_eq!((&r.params, &r.sha256), (&release.params, &release.sha256));
    assert!(r.verify().is_ok());
}

#[test]
fn the_global_serving_pointer_reaches_the_sites_devices_as_one_of_its_own() {
    let mut m = site(&["cam-1"], site_config());
    drain(&mut m);
    let global = |stage, canary: &[&str]| fedge_wire::ServingPointer {
        federation: "demo".into(),
        seq: 41,
        sha256: "ab".repeat(32),
        round: 6,
        stage,
        canary: canary.iter().map(|c| c.to_string()).collect(),
        previous: Some("cd".repeat(32)),
        pinned: true,
    };
    let relayed = |m: &mut Rounds| -> Vec<fedge_wire::ServingPointer> {
        (drain(m).into_iter())
            .filter_map(|o| match o {
                Output::Serving(p) => Some(p),
                _ => None,
            })
            .collect()
    };
    // A rollback (stage all): every device of the site, under the site's federation.
    m.relay_serving(&global(fedge_wire::Stage::All, &[]));
    let out = relayed(&mut m);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (
            out[0].federation.as_str(),
            out[0].sha256.as_str(),
            out[0].round
        ),
        ("plant-7", "ab".repeat(32).as_str(), 6)
    );
    assert_eq!(
        (out[0].stage, out[0].pinned),
        (fedge_wire::Stage::All, true)
    );
    // A canary stage with the site in it: every device of the site serves the new release.
    m.relay_serving(&global(fedge_wire::Stage::Canary, &["plant-7"]));
    assert_eq!(relayed(&mut m)[0].stage, fedge_wire::Stage::All);
    // One without the site: nothing changes at the site.
    m.relay_serving(&global(fedge_wire::Stage::Canary, &["elsewhere"]));
    assert!(relayed(&mut m).is_empty());
}

#[test]
fn a_buffered_global_task_without_deadline_gives_the_site_its_own_round_timeout() {
    let mut m = site(&["cam-1", "cam-2"], site_config());
    let task = RoundTask {
        deadline_ms: 0,
        ..global_task(4, [0.0; M], Objective::CrossEntropy)
    };
    assert_eq!(m.relay_task(task, 100), Ok(true));
    let sent = tasks(&drain(&mut m));
    assert_eq!(sent[0].round, 4);
    assert_eq!(
        sent[0].deadline_ms, 10_000,
        "the site's own round_timeout_ms"
    );
    assert_eq!(m.deadline_ms(), Some(10_100));
}
