//! The agent's decisions on class lists, evaluation-only devices and released models.

use super::tests::{FED, drain, identity, send, task, trains};
use super::*;

pub(super) fn release(run: u64, round: u64) -> ModelRelease {
    release_of(fedge_wire::HeadConfig::new(2, 2).with_hidden(1), run, round)
}

pub(super) fn release_of(head: fedge_wire::HeadConfig, run: u64, round: u64) -> ModelRelease {
    let params = head.init_flat(round);
    ModelRelease {
        pooled: None,
        federation: FED.into(),
        run,
        round,
        strategy: "fedavg".into(),
        classes: fedge_wire::numbered_classes(2),
        backbone: String::new(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    }
}

pub(super) fn publish_release(agent: &mut Agent, frame: Vec<u8>) -> Vec<Output> {
    let topic = Topics::new(FED).unwrap().model_current();
    agent.handle_publish(&topic, &frame, 0);
    drain(agent)
}

/// The rounds of the releases the outputs serve (`false`) and score (`true`), in order.
pub(super) fn kept(outputs: &[Output]) -> Vec<(u64, bool)> {
    (outputs.iter())
        .filter_map(|o| match o {
            Output::Serve(release) => Some((release.round, false)),
            Output::Score(release, _) => Some((release.round, true)),
            _ => None,
        })
        .collect()
}

pub(super) fn plain(release: ModelRelease) -> Vec<u8> {
    fedge_wire::encode(&Message::Model(release))
}

#[test]
fn a_task_whose_class_list_lacks_a_class_of_the_device_is_refused_by_name() {
    let mut id = identity("cam-1", None);
    id.classes = vec!["0".into(), "wolf".into()];
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    let outputs = send(&mut agent, task(1, &["cam-1"], 60_000), 0);
    assert!(trains(&outputs).is_empty());
    let error = &agent.status().last_error;
    assert!(
        error.contains("\"wolf\"") && error.contains("0, 1"),
        "{error}"
    );
    // A list that has every class of the device (and more) trains.
    let mut wider = task(2, &["cam-1"], 60_000);
    wider.classes = vec!["wolf".into(), "fox".into(), "0".into()];
    assert_eq!(trains(&send(&mut agent, wider, 0)), [2]);
}

#[test]
fn an_evaluation_only_device_never_trains_and_scores_each_new_release_once() {
    let mut id = identity("cam-1", None);
    id.role = Role::Evaluate;
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    assert!(trains(&send(&mut agent, task(1, &["cam-1"], 60_000), 0)).is_empty());
    assert_eq!(agent.status().role, Role::Evaluate);
    // It serves each new release and scores it, and says so once the score is in.
    let outputs = publish_release(&mut agent, plain(release(7, 1)));
    assert_eq!(kept(&outputs), [(1, false), (1, true)]);
    assert!(!outputs.iter().any(|o| matches!(o, Output::Status { .. })));
    // The same release again (retained, reconnect) and an older one are not scored again.
    assert!(kept(&publish_release(&mut agent, plain(release(7, 1)))).is_empty());
    assert_eq!(
        kept(&publish_release(&mut agent, plain(release(7, 2)))),
        [(2, false), (2, true)]
    );
    assert!(kept(&publish_release(&mut agent, plain(release(7, 1)))).is_empty());
    agent.handle_evaluated(Scored {
        sha256: release(7, 2).sha256_hex(),
        result: Ok(fedge_wire::SiteEvaluation {
            model_round: 2,
            accuracy: 0.75,
            class_accuracy: vec![Some(1.0), Some(0.5)],
            samples: 8,
        }),
        paired: None,
    });
    let outputs = drain(&mut agent);
    let Some(Output::Status { status, .. }) = outputs.last() else {
        panic!("{outputs:?}");
    };
    let evaluation = status.evaluation.as_ref().unwrap();
    assert_eq!((evaluation.model_round, evaluation.accuracy), (2, 0.75));
    assert_eq!(status.evaluated, Some(release(7, 2).sha256_hex()));
    assert_eq!(status.model_round, Some(2));
    assert_eq!(status.serving, Some(release(7, 2).sha256_hex()));
    // A failed scoring says why and keeps the last score and what it was of.
    agent.handle_evaluated(Scored {
        sha256: release(7, 1).sha256_hex(),
        result: Err("no rows".into()),
        paired: None,
    });
    assert_eq!(agent.status().last_error, "no rows");
    assert_eq!(agent.status().evaluated, Some(release(7, 2).sha256_hex()));
}

#[test]
fn a_training_device_keeps_new_releases_without_scoring_them() {
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    agent.hold_model(release(7, 3));
    assert!(drain(&mut agent).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 3).sha256_hex()));
    assert!(kept(&publish_release(&mut agent, plain(release(7, 3)))).is_empty());
    let outputs = publish_release(&mut agent, plain(release(7, 4)));
    assert_eq!(kept(&outputs), [(4, false)]);
    let Some(Output::Status { status, .. }) = outputs.last() else {
        panic!("{outputs:?}");
    };
    assert_eq!(status.serving, Some(release(7, 4).sha256_hex()));
    assert_eq!(status.model_round, Some(4));
    // A coordinator started afresh (another run) counts from 1 again.
    assert_eq!(
        kept(&publish_release(&mut agent, plain(release(8, 1)))),
        [(1, false)]
    );
    // The demo's and tests' coordinators run with run 0.
    let mut fresh = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    assert_eq!(
        kept(&publish_release(&mut fresh, plain(release(0, 1)))),
        [(1, false)]
    );
    let mut foreign = release(9, 5);
    foreign.federation = "other".into();
    assert!(kept(&publish_release(&mut agent, plain(foreign))).is_empty());
}

#[test]
fn a_tampered_or_unsealed_release_is_refused_and_said_so() {
    let mut tampered = release(7, 1);
    tampered.sha256[0] ^= 1;
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    assert!(kept(&publish_release(&mut agent, plain(tampered))).is_empty());
    assert!(
        agent.status().last_error.contains("SHA-256"),
        "{:?}",
        agent.status().last_error
    );

    let key = DeviceKey::from_bytes([3; 32]);
    let mut keyed =
        Agent::new(identity("cam-1", Some(key.clone())), RoundState::default()).unwrap();
    assert!(kept(&publish_release(&mut keyed, plain(release(7, 1)))).is_empty());
    let forged = fedge_wire::seal(
        plain(release(7, 1)),
        &[("cam-1", &DeviceKey::from_bytes([4; 32]))],
    );
    assert!(kept(&publish_release(&mut keyed, forged)).is_empty());
    let sealed = fedge_wire::seal(plain(release(7, 2)), &[("cam-1", &key)]);
    assert_eq!(kept(&publish_release(&mut keyed, sealed)), [(2, false)]);
}

#[test]
fn a_chunked_release_is_reassembled() {
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    let topic = Topics::new(FED).unwrap().model_current();
    let big = release_of(fedge_wire::HeadConfig::new(64, 2).with_hidden(4), 7, 1);
    let chunks = fedge_wire::split_into_chunks(plain(big), 1, 200);
    assert!(chunks.len() > 1);
    let mut outputs = Vec::new();
    for (i, chunk) in chunks.into_iter().enumerate() {
        agent.handle_publish(&format!("{topic}/{i}"), &chunk, 0);
        outputs.extend(drain(&mut agent));
    }
    assert_eq!(kept(&outputs), [(1, false)]);
}

#[test]
fn after_a_rescan_the_update_weighs_and_the_status_counts_the_new_samples() {
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    assert_eq!(
        trains(&send(&mut agent, task(1, &["cam-1"], 60_000), 0)),
        [1]
    );
    let mut done = super::tests::trained(1, 0.5);
    done.data = Some(DataSummary {
        samples: 14,
        val_samples: 2,
        new_samples: 4,
        classes: fedge_wire::numbered_classes(2),
    });
    agent.handle_trained(done);
    let outputs = drain(&mut agent);
    let Some(Output::Update { frame, .. }) = outputs.first() else {
        panic!("{outputs:?}");
    };
    let Ok(Message::ClientUpdate(update)) = fedge_wire::decode(frame) else {
        panic!("not an update");
    };
    assert_eq!((update.num_samples, update.metrics.val_samples), (14, 2));
    agent.handle_update_sent(Ok(100));
    drain(&mut agent);
    assert_eq!(
        (agent.status().samples, agent.status().new_samples),
        (14, 4)
    );
}

#[test]
fn an_evaluation_device_scores_a_candidate_against_the_release_it_serves() {
    let mut id = identity("eval-1", None);
    id.role = Role::Evaluate;
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    publish_release(&mut agent, plain(release(7, 1)));
    let topic = Topics::new(FED).unwrap().model_candidate();
    agent.handle_publish(&topic, &plain(release(7, 2)), 0);
    let outputs = drain(&mut agent);
    let compared = outputs.iter().find_map(|o| match o {
        Output::Score(candidate, Some(served)) => Some((candidate.round, served.round)),
        _ => None,
    });
    assert_eq!(compared, Some((2, 1)), "{outputs:?}");
    let paired = fedge_wire::PairedScore {
        against: release(7, 1).sha256_hex(),
        samples: 8,
        gained: 2,
        lost: 1,
    };
    agent.handle_evaluated(Scored {
        sha256: release(7, 2).sha256_hex(),
        result: Ok(fedge_wire::SiteEvaluation::default()),
        paired: Some(paired.clone()),
    });
    assert_eq!(agent.status().paired, Some(paired));
    assert_eq!(agent.status().evaluated, Some(release(7, 2).sha256_hex()));
}
