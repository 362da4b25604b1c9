//! The agent's decisions on which release to serve: the serving pointer (rollback, canary
//! stages, replays), releases kept for it, and candidates.

use super::release_tests::{kept, plain, publish_release, release};
use super::tests::{FED, drain, identity};
use super::*;
use fedge_wire::{ServingPointer, Stage};

fn agent(client: &str) -> Agent {
    Agent::new(identity(client, None), RoundState::default()).unwrap()
}

fn evaluator() -> Agent {
    let mut id = identity("cam-9", None);
    id.role = Role::Evaluate;
    Agent::new(id, RoundState::default()).unwrap()
}

/// A pointer with stage `all` naming `release`.
fn all(seq: u64, release: &ModelRelease) -> ServingPointer {
    ServingPointer {
        federation: FED.into(),
        seq,
        sha256: release.sha256_hex(),
        round: release.round,
        stage: Stage::All,
        canary: Vec::new(),
        previous: None,
        pinned: false,
    }
}

/// A canary pointer: `canary` serve `new`, the others `previous`.
fn canary(
    seq: u64,
    new: &ModelRelease,
    canary: &[&str],
    previous: &ModelRelease,
) -> ServingPointer {
    ServingPointer {
        stage: Stage::Canary,
        canary: canary.iter().map(|c| c.to_string()).collect(),
        previous: Some(previous.sha256_hex()),
        ..all(seq, new)
    }
}

/// What a pointer made the agent do, but for saving its round state (every pointer taken is
/// saved; `the_last_pointer_taken_is_kept_with_the_round_state_across_a_restart` checks it).
fn point(agent: &mut Agent, payload: Vec<u8>) -> Vec<Output> {
    let outputs = point_saving(agent, payload);
    (outputs.into_iter())
        .filter(|o| !matches!(o, Output::Save(_)))
        .collect()
}

fn point_saving(agent: &mut Agent, payload: Vec<u8>) -> Vec<Output> {
    let topic = Topics::new(FED).unwrap().model_serving();
    agent.handle_publish(&topic, &payload, 0);
    drain(agent)
}

fn candidate(agent: &mut Agent, frame: Vec<u8>) -> Vec<Output> {
    let topic = Topics::new(FED).unwrap().model_candidate();
    agent.handle_publish(&topic, &frame, 0);
    drain(agent)
}

/// The rounds of the releases served.
fn served(outputs: &[Output]) -> Vec<u64> {
    (kept(outputs).into_iter())
        .filter_map(|(round, score)| (!score).then_some(round))
        .collect()
}

/// The status published last.
fn last_status(outputs: &[Output]) -> &EdgeStatus {
    match outputs.iter().rev().find_map(|o| match o {
        Output::Status { status, .. } => Some(status),
        _ => None,
    }) {
        Some(status) => status,
        None => panic!("no status in {outputs:?}"),
    }
}

#[test]
fn a_pointer_naming_an_older_held_release_rolls_back_to_it() {
    let mut agent = agent("cam-1");
    assert_eq!(
        served(&publish_release(&mut agent, plain(release(7, 1)))),
        [1]
    );
    assert_eq!(
        served(&publish_release(&mut agent, plain(release(7, 2)))),
        [2]
    );
    let outputs = point(&mut agent, all(10, &release(7, 1)).to_payload());
    let [Output::Serve(back), Output::Status { status, .. }] = &outputs[..] else {
        panic!("{outputs:?}");
    };
    assert_eq!(back.sha256, release(7, 1).sha256);
    assert_eq!(status.serving, Some(release(7, 1).sha256_hex()));
    assert_eq!(status.model_round, Some(1));
    // The coordinator re-publishing the release it rolled back to changes nothing.
    assert!(publish_release(&mut agent, plain(release(7, 1))).is_empty());
}

#[test]
fn during_a_canary_stage_only_the_canaries_serve_the_new_release() {
    let (old, new) = (release(7, 1), release(7, 2));
    let mut devices = [agent("cam-1"), agent("cam-2")];
    for device in &mut devices {
        assert_eq!(served(&publish_release(device, plain(old.clone()))), [1]);
        assert!(point(device, all(1, &old).to_payload()).is_empty());
        // Released, but no pointer names it yet.
        assert!(served(&publish_release(device, plain(new.clone()))).is_empty());
    }
    let stage = canary(2, &new, &["cam-1"], &old).to_payload();
    let [first, second] = &mut devices;
    assert_eq!(served(&point(first, stage.clone())), [2]);
    assert!(point(second, stage).is_empty());
    assert_eq!(second.status().serving, Some(old.sha256_hex()));
    // Promoted to every device.
    let everyone = all(3, &new).to_payload();
    assert!(point(first, everyone.clone()).is_empty());
    let outputs = point(second, everyone);
    assert_eq!(served(&outputs), [2]);
    assert_eq!(last_status(&outputs).serving, Some(new.sha256_hex()));
}

#[test]
fn a_pointer_not_above_the_last_one_taken_is_ignored() {
    let mut agent = agent("cam-1");
    publish_release(&mut agent, plain(release(7, 1)));
    publish_release(&mut agent, plain(release(7, 2)));
    assert!(point(&mut agent, all(5, &release(7, 2)).to_payload()).is_empty());
    // A replayed (equal) or older pointer cannot move the device back (an older one is said
    // in the status).
    assert!(point(&mut agent, all(5, &release(7, 1)).to_payload()).is_empty());
    assert!(served(&point(&mut agent, all(4, &release(7, 1)).to_payload())).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 2).sha256_hex()));
    assert_eq!(
        served(&point(&mut agent, all(6, &release(7, 1)).to_payload())),
        [1]
    );
    // Another federation's pointer is not this one's.
    let mut foreign = all(7, &release(7, 2));
    foreign.federation = "other".into();
    assert!(point(&mut agent, foreign.to_payload()).is_empty());
    // Garbage and a cleared topic change nothing.
    assert!(point(&mut agent, b"garbage".to_vec()).is_empty());
    assert!(point(&mut agent, Vec::new()).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 1).sha256_hex()));
}

#[test]
fn the_last_pointer_taken_is_kept_with_the_round_state_across_a_restart() {
    let mut agent = agent("cam-1");
    publish_release(&mut agent, plain(release(7, 1)));
    publish_release(&mut agent, plain(release(7, 2)));
    let outputs = point_saving(&mut agent, all(9, &release(7, 2)).to_payload());
    let saved = (outputs.iter())
        .find_map(|o| match o {
            Output::Save(state) => Some(state.clone()),
            _ => None,
        })
        .expect("the round state saved with the pointer's number");
    assert_eq!(saved.serving_seq, 9);
    // Restarted from that state: a captured older pointer replayed to it does not take.
    let mut restarted = Agent::new(identity("cam-1", None), saved).unwrap();
    publish_release(&mut restarted, plain(release(7, 1)));
    publish_release(&mut restarted, plain(release(7, 2)));
    assert!(served(&point(&mut restarted, all(8, &release(7, 1)).to_payload())).is_empty());
    assert_eq!(restarted.status().serving, Some(release(7, 2).sha256_hex()));
    assert_eq!(
        served(&point(&mut restarted, all(10, &release(7, 1)).to_payload())),
        [1]
    );
}

#[test]
fn a_device_with_a_key_takes_only_a_pointer_sealed_for_it() {
    let key = DeviceKey::from_bytes([3; 32]);
    let mut agent =
        Agent::new(identity("cam-1", Some(key.clone())), RoundState::default()).unwrap();
    for round in [1, 2] {
        let sealed = fedge_wire::seal(plain(release(7, round)), &[("cam-1", &key)]);
        assert_eq!(served(&publish_release(&mut agent, sealed)), [round]);
    }
    let back = all(1, &release(7, 1)).to_payload();
    assert!(point(&mut agent, back.clone()).is_empty());
    let forged = fedge_wire::seal(back.clone(), &[("cam-1", &DeviceKey::from_bytes([4; 32]))]);
    assert!(point(&mut agent, forged).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 2).sha256_hex()));
    let sealed = fedge_wire::seal(back, &[("cam-1", &key)]);
    assert_eq!(served(&point(&mut agent, sealed)), [1]);
}

#[test]
fn a_pointer_naming_a_release_not_held_yet_switches_when_it_arrives() {
    let mut agent = agent("cam-1");
    publish_release(&mut agent, plain(release(7, 1)));
    assert!(point(&mut agent, all(1, &release(7, 3)).to_payload()).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 1).sha256_hex()));
    // A newer release the pointer does not name is kept, not served.
    assert!(served(&publish_release(&mut agent, plain(release(7, 4)))).is_empty());
    let outputs = publish_release(&mut agent, plain(release(7, 3)));
    assert_eq!(served(&outputs), [3]);
    assert_eq!(
        last_status(&outputs).serving,
        Some(release(7, 3).sha256_hex())
    );
    // The kept newer one serves once a pointer names it, with no new download.
    assert_eq!(
        served(&point(&mut agent, all(2, &release(7, 4)).to_payload())),
        [4]
    );
}

#[test]
fn only_the_last_releases_are_kept_and_always_the_one_served() {
    let mut agent = agent("cam-1");
    let total = KEPT_RELEASES as u64 + 2;
    for round in 1..=total {
        assert_eq!(
            served(&publish_release(&mut agent, plain(release(7, round)))),
            [round]
        );
    }
    // The oldest were dropped: a pointer naming one waits for it.
    assert!(point(&mut agent, all(1, &release(7, 2)).to_payload()).is_empty());
    let oldest_kept = total + 1 - KEPT_RELEASES as u64;
    assert_eq!(
        served(&point(
            &mut agent,
            all(2, &release(7, oldest_kept)).to_payload()
        )),
        [oldest_kept]
    );
    // New arrivals push out older ones, never the one served.
    for round in total + 1..=total + KEPT_RELEASES as u64 {
        assert!(served(&publish_release(&mut agent, plain(release(7, round)))).is_empty());
    }
    let dropped = release(7, oldest_kept + 1);
    assert!(point(&mut agent, all(3, &dropped).to_payload()).is_empty());
    assert_eq!(
        agent.status().serving,
        Some(release(7, oldest_kept).sha256_hex())
    );
}

#[test]
fn an_evaluation_only_device_scores_candidates_without_serving_them() {
    let mut agent = evaluator();
    agent.handle_connected();
    let Some(Output::Subscribe(filters)) = drain(&mut agent).into_iter().next() else {
        panic!("no subscription");
    };
    let topics = Topics::new(FED).unwrap();
    assert!(filters.contains(&topics.model_candidate()));
    assert!(filters.contains(&format!("{}/+", topics.model_candidate())));

    assert_eq!(
        kept(&publish_release(&mut agent, plain(release(7, 1)))),
        [(1, false), (1, true)]
    );
    assert_eq!(
        kept(&candidate(&mut agent, plain(release(7, 2)))),
        [(2, true)]
    );
    assert_eq!(agent.status().serving, Some(release(7, 1).sha256_hex()));
    // Delivered again: not scored twice, neither as a candidate nor once promoted (then it
    // serves, and says so at once since nothing is being scored).
    assert!(candidate(&mut agent, plain(release(7, 2))).is_empty());
    let outputs = publish_release(&mut agent, plain(release(7, 2)));
    assert_eq!(kept(&outputs), [(2, false)]);
    assert_eq!(
        last_status(&outputs).serving,
        Some(release(7, 2).sha256_hex())
    );
    // A candidate of another federation is not scored.
    let mut foreign = release(7, 3);
    foreign.federation = "other".into();
    assert!(candidate(&mut agent, plain(foreign)).is_empty());
}

#[test]
fn a_training_device_ignores_candidates() {
    let mut agent = agent("cam-1");
    agent.handle_connected();
    let Some(Output::Subscribe(filters)) = drain(&mut agent).into_iter().next() else {
        panic!("no subscription");
    };
    let topics = Topics::new(FED).unwrap();
    assert!(
        !filters
            .iter()
            .any(|f| f.starts_with(&topics.model_candidate()))
    );
    assert!(candidate(&mut agent, plain(release(7, 1))).is_empty());
    let mut tampered = release(7, 1);
    tampered.sha256[0] ^= 1;
    assert!(candidate(&mut agent, plain(tampered)).is_empty());
    assert!(agent.status().last_error.is_empty());
    assert_eq!(agent.status().serving, None);
}

#[test]
fn before_any_pointer_an_older_round_is_kept_but_does_not_serve() {
    let mut agent = agent("cam-1");
    publish_release(&mut agent, plain(release(7, 2)));
    assert!(publish_release(&mut agent, plain(release(7, 1))).is_empty());
    assert_eq!(agent.status().serving, Some(release(7, 2).sha256_hex()));
    assert_eq!(agent.status().model_round, Some(2));
    // Kept: a pointer naming it needs no download.
    assert_eq!(
        served(&point(&mut agent, all(1, &release(7, 1)).to_payload())),
        [1]
    );
}

#[test]
fn the_release_kept_on_disk_counts_as_served_and_an_evaluator_scores_it_once() {
    let mut agent = evaluator();
    agent.hold_model(release(7, 3));
    assert_eq!(kept(&drain(&mut agent)), [(3, true)]);
    assert_eq!(agent.status().serving, Some(release(7, 3).sha256_hex()));
    assert_eq!(agent.status().model_round, Some(3));
    assert!(publish_release(&mut agent, plain(release(7, 3))).is_empty());
    // Served on: a pointer naming it changes nothing; after a newer one, it serves again.
    assert!(point(&mut agent, all(1, &release(7, 3)).to_payload()).is_empty());
    publish_release(&mut agent, plain(release(7, 4)));
    assert_eq!(
        served(&point(&mut agent, all(2, &release(7, 4)).to_payload())),
        [4]
    );
    assert_eq!(
        served(&point(&mut agent, all(3, &release(7, 3)).to_payload())),
        [3]
    );
}

#[test]
fn a_pointer_older_than_the_last_one_taken_is_refused_and_said_so() {
    let mut agent = agent("cam-1");
    publish_release(&mut agent, plain(release(7, 1)));
    publish_release(&mut agent, plain(release(7, 2)));
    assert!(point(&mut agent, all(1_000, &release(7, 2)).to_payload()).is_empty());
    // The same pointer again (retained, delivered at each reconnect) is nothing to report.
    assert!(point(&mut agent, all(1_000, &release(7, 2)).to_payload()).is_empty());
    assert!(agent.status().last_error.is_empty());
    // A coordinator whose clock went back numbers its next pointer below: refused, and the
    // status says why the device does not follow it.
    let outputs = point(&mut agent, all(500, &release(7, 1)).to_payload());
    let error = &last_status(&outputs).last_error;
    assert!(
        error.contains("serving pointer 500") && error.contains("1000"),
        "{error}"
    );
    assert_eq!(agent.status().serving, Some(release(7, 2).sha256_hex()));
    assert_eq!(agent.summary().pointers_refused, 1);
}

#[test]
fn a_release_too_large_for_the_device_is_refused_before_it_is_kept() {
    // A profile with memory_budget_mb = 1 reassembles frames of at most 1 MiB.
    let mut id = identity("cam-1", None);
    id.memory_budget_mb = 1;
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    assert_eq!(
        served(&publish_release(&mut agent, plain(release(7, 1)))),
        [1]
    );
    // 303,002 parameters (1.2 MB), sent whole in one message (no reassembly limit applies).
    let huge = super::release_tests::release_of(
        fedge_wire::HeadConfig::new(300, 2).with_hidden(1_000),
        7,
        2,
    );
    let outputs = publish_release(&mut agent, plain(huge.clone()));
    assert!(served(&outputs).is_empty(), "{outputs:?}");
    let error = &last_status(&outputs).last_error;
    assert!(error.contains("memory_budget_mb"), "{error}");
    // A projector wider than any a device fits, however few its bytes.
    let wide = super::release_tests::release_of(
        fedge_wire::HeadConfig::new(2, 2).with_hidden(fedge_wire::layout::MAX_FITTED_HIDDEN + 1),
        7,
        3,
    );
    let outputs = publish_release(&mut agent, plain(wide.clone()));
    assert!(served(&outputs).is_empty(), "{outputs:?}");
    let error = &last_status(&outputs).last_error;
    assert!(error.contains("projector"), "{error}");
    // Neither was kept: a pointer naming one has nothing to switch to.
    for (seq, refused) in [(1, &huge), (2, &wide)] {
        assert!(point(&mut agent, all(seq, refused).to_payload()).is_empty());
    }
    assert_eq!(agent.status().serving, Some(release(7, 1).sha256_hex()));
}

#[test]
fn a_release_of_another_head_than_the_device_s_is_refused_before_it_is_kept() {
    use super::release_tests::release_of;
    use fedge_wire::HeadConfig;
    // The device's own head: the backbone's 2 features, its profile's width 1.
    let own = HeadConfig::new(2, 2).with_hidden(1);
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default())
        .unwrap()
        .with_head(own);
    assert_eq!(
        served(&publish_release(&mut agent, plain(release(7, 1)))),
        [1]
    );
    // Another backbone's head: refused, and said.
    let other = release_of(HeadConfig::new(3, 2).with_hidden(1), 7, 2);
    let outputs = publish_release(&mut agent, plain(other.clone()));
    assert!(served(&outputs).is_empty(), "{outputs:?}");
    let error = &last_status(&outputs).last_error;
    assert!(error.contains("3 features"), "{error}");
    assert!(point(&mut agent, all(1, &other).to_payload()).is_empty());
    // The federation's width, another than the profile's, is the federation's to choose.
    let wider = release_of(HeadConfig::new(2, 2).with_hidden(8), 7, 3);
    assert_eq!(
        served(&point(&mut agent, all(2, &wider).to_payload())),
        Vec::<u64>::new()
    );
    assert_eq!(served(&publish_release(&mut agent, plain(wider))), [3]);
}

#[test]
fn the_releases_kept_take_no_more_than_the_device_reassembles_in_one_frame() {
    use super::release_tests::release_of;
    use super::serving::footprint;
    // memory_budget_mb = 1: frames of 1 MiB; each release below takes 247 KB, four fit.
    let mut id = identity("cam-1", None);
    id.memory_budget_mb = 1;
    let mut agent = Agent::new(id, RoundState::default()).unwrap();
    let head = fedge_wire::HeadConfig::new(100, 2).with_hidden(600);
    let r = |round| release_of(head.clone(), 7, round);
    let each = footprint(&r(1));
    assert!(4 * each < 1 << 20 && 5 * each > 1 << 20, "{each}");
    for round in 1..=5 {
        assert_eq!(
            served(&publish_release(&mut agent, plain(r(round)))),
            [round]
        );
    }
    // Fewer than KEPT_RELEASES, for the bytes: the oldest went.
    assert!(point(&mut agent, all(1, &r(1)).to_payload()).is_empty());
    assert_eq!(agent.status().serving, Some(r(5).sha256_hex()));
    assert_eq!(served(&point(&mut agent, all(2, &r(2)).to_payload())), [2]);
}

#[test]
fn a_rollback_to_a_release_of_a_run_the_device_left_reaches_a_device_that_restarted_since() {
    // Restarted in run 9 (it left run 7): it holds only what it serves, from its disk.
    let mut state = RoundState {
        run: 9,
        ..RoundState::default()
    };
    state.past_runs[0] = 7;
    let mut agent = Agent::new(identity("cam-1", None), state).unwrap();
    agent.hold_model(release(9, 3));
    drain(&mut agent);
    // `ctl rollback` to run 7's release: sent again on model/current, then the pointer.
    let old = release(7, 1);
    assert!(served(&publish_release(&mut agent, plain(old.clone()))).is_empty());
    let outputs = point(&mut agent, all(10, &old).to_payload());
    assert_eq!(served(&outputs), [1]);
    assert_eq!(last_status(&outputs).serving, Some(old.sha256_hex()));
    // An evaluation site does not score a release of a run it left.
    let mut state = RoundState {
        run: 9,
        ..RoundState::default()
    };
    state.past_runs[0] = 7;
    let mut id = identity("cam-9", None);
    id.role = Role::Evaluate;
    let mut judge = Agent::new(id, state).unwrap();
    judge.hold_model(release(9, 3));
    drain(&mut judge);
    let outputs = publish_release(&mut judge, plain(old));
    assert!(
        !outputs.iter().any(|o| matches!(o, Output::Score(..))),
        "{outputs:?}"
    );
}
