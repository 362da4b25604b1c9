//! The release pipeline's decisions, step by step.

use super::*;
use fedge_wire::{DriftStatus, EdgeStatus, HeadConfig, TensorF32};

fn release(round: u64) -> ModelRelease {
    let head = HeadConfig::new(2, 2).with_hidden(1);
    let params = head.init_flat(round);
    ModelRelease {
        pooled: None,
        federation: "plant".into(),
        run: 1,
        round,
        strategy: "fedavg".into(),
        classes: vec!["ok".into(), "scratch".into()],
        backbone: String::new(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    }
}

fn gated() -> ReleaseConfig {
    ReleaseConfig {
        mode: ReleaseMode::Gated,
        canary_share: 0.25,
        canary_window_s: 10.0,
        timeout_s: 60.0,
        evaluators: vec!["site".into()],
        ..ReleaseConfig::default()
    }
}

fn steps(flow: &mut ReleaseFlow) -> Vec<Step> {
    std::iter::from_fn(|| flow.poll_step()).collect()
}

fn released(steps: &[Step]) -> Vec<u64> {
    (steps.iter())
        .filter_map(|s| match s {
            Step::Release(r) => Some(r.round),
            _ => None,
        })
        .collect()
}

fn pointers(steps: &[Step]) -> Vec<&ServingPointer> {
    (steps.iter())
        .filter_map(|s| match s {
            Step::Pointer(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn online(flow: &mut ReleaseFlow, clients: &[&str]) {
    for client in clients {
        let status = EdgeStatus {
            client_id: (*client).into(),
            online: true,
            ..EdgeStatus::default()
        };
        flow.device_status(client, &status, true, 0).unwrap();
    }
}

/// Images an evaluation site scores in these tests.
const IMAGES: u32 = 100;

/// An evaluation site's status: its score of `scored` at `accuracy` (both classes alike),
/// with `paired` counts against the release it serves when given.
fn site_status(
    site: &str,
    scored: &ModelRelease,
    accuracy: f32,
    paired: Option<PairedScore>,
) -> EdgeStatus {
    EdgeStatus {
        client_id: site.into(),
        online: true,
        role: fedge_wire::Role::Evaluate,
        evaluation: Some(SiteEvaluation {
            model_round: scored.round,
            accuracy,
            class_accuracy: vec![Some(accuracy), Some(accuracy)],
            samples: IMAGES,
        }),
        evaluated: Some(scored.sha256_hex()),
        paired,
        ..EdgeStatus::default()
    }
}

/// `site` scores the release served at 50 %.
fn scores_served(flow: &mut ReleaseFlow, site: &str, now: u64) {
    let served = flow.serving().unwrap().clone();
    let status = site_status(site, &served, 0.5, None);
    flow.device_status(site, &status, true, now).unwrap();
}

/// `site` compares `candidate` with the release served (scored at 50 %): `gained` images
/// only the candidate gets right, `lost` only the served one.
fn compares(
    flow: &mut ReleaseFlow,
    site: &str,
    candidate: &ModelRelease,
    (gained, lost): (u32, u32),
    now: u64,
) -> Result<(), String> {
    let against = flow.serving().unwrap().sha256_hex();
    let accuracy = (50 + gained - lost) as f32 / IMAGES as f32;
    let paired = PairedScore {
        against,
        samples: IMAGES,
        gained,
        lost,
    };
    let status = site_status(site, candidate, accuracy, Some(paired));
    flow.device_status(site, &status, true, now)
}

#[test]
fn direct_mode_serves_every_aggregate_at_once_on_every_device() {
    let mut flow = ReleaseFlow::new(ReleaseConfig::default(), "plant");
    online(&mut flow, &["a", "b"]);
    flow.aggregated(release(1), 0);
    flow.aggregated(release(2), 10);
    let steps = steps(&mut flow);
    assert_eq!(released(&steps), [1, 2]);
    let stages: Vec<Stage> = pointers(&steps).iter().map(|p| p.stage).collect();
    assert_eq!(stages, [Stage::All, Stage::All]);
    assert!(!steps.iter().any(|s| matches!(s, Step::Candidate(_))));
    assert_eq!(flow.serving().map(|r| r.round), Some(2));
}

#[test]
fn a_regressed_candidate_is_held_and_a_good_one_goes_through_a_canary_to_everyone() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b", "c", "d", "e", "f", "g", "h"]);
    // Nothing served yet: the first aggregate is served by everyone at once.
    flow.aggregated(release(1), 0);
    assert_eq!(released(&steps(&mut flow)), [1]);
    scores_served(&mut flow, "site", 1);

    // A candidate 20 points worse: published for scoring, held.
    flow.aggregated(release(2), 100);
    let s = steps(&mut flow);
    assert!(
        matches!(&s[..], [Step::Event(ReleaseEvent::Candidate(_)), Step::Candidate(c)] if c.round == 2)
    );
    compares(&mut flow, "site", &release(2), (5, 25), 200).unwrap();
    let s = steps(&mut flow);
    assert!(released(&s).is_empty() && pointers(&s).is_empty(), "{s:?}");
    let verdict = flow.status(&|_| String::new()).unwrap().gate.unwrap();
    assert_eq!(verdict.outcome, GateOutcome::Held);
    assert_eq!(verdict.candidate_accuracy.map(|a| a.round()), Some(30.0));
    assert_eq!(verdict.serving_accuracy.map(|a| a.round()), Some(50.0));
    assert_eq!(flow.serving().map(|r| r.round), Some(1));

    // A good one: promoted to a canary of 3 of the 9 online devices (25 %, rounded up; the
    // evaluation-only site serves too), the others keep round 1.
    flow.aggregated(release(3), 300);
    steps(&mut flow);
    compares(&mut flow, "site", &release(3), (10, 9), 400).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [3]);
    let canary = pointers(&s)[0].clone();
    assert_eq!(canary.stage, Stage::Canary);
    assert_eq!(canary.canary.len(), 3);
    assert_eq!(canary.previous, Some(release(1).sha256_hex()));
    let outside = ["a", "b", "c", "d", "e", "f", "g", "h"]
        .into_iter()
        .find(|c| !canary.canary.iter().any(|k| k == c))
        .unwrap();
    assert_eq!(canary.release_for(outside), release(1).sha256_hex());
    assert_eq!(
        canary.release_for(&canary.canary[0]),
        release(3).sha256_hex()
    );
    // The window passes quietly: every device.
    assert_eq!(flow.next_deadline(), Some(400 + 10_000));
    flow.tick(10_399);
    assert!(pointers(&steps(&mut flow)).is_empty());
    flow.tick(10_400);
    let s = steps(&mut flow);
    assert_eq!(pointers(&s)[0].stage, Stage::All);
    assert_eq!(pointers(&s)[0].sha256, release(3).sha256_hex());
    assert_eq!(flow.serving().map(|r| r.round), Some(3));
}

fn alarmed(client: &str, serving: &ModelRelease, covered: bool) -> EdgeStatus {
    EdgeStatus {
        client_id: client.into(),
        online: true,
        serving: Some(serving.sha256_hex()),
        drift: Some(DriftStatus {
            level: 1.2,
            alarms: 1,
            last_alarm: None,
            requests: 40,
            reference: 100,
            adaptations: 0,
            last_adapted: None,
        }),
        tag_covers_all: covered,
        ..EdgeStatus::default()
    }
}

#[test]
fn a_canary_whose_devices_mostly_raise_a_drift_alarm_sends_every_device_back() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b", "c", "d"]);
    flow.aggregated(release(1), 0);
    scores_served(&mut flow, "site", 1);
    flow.aggregated(release(2), 10);
    compares(&mut flow, "site", &release(2), (1, 1), 20).unwrap();
    let s = steps(&mut flow);
    let canary = pointers(&s).last().unwrap().canary.clone();
    assert_eq!(
        canary.len(),
        MIN_CANARIES,
        "at least three canaries of five online"
    );
    // One canary's alarm (or one whose tag does not cover it) is not enough.
    flow.device_status(
        &canary[0],
        &alarmed(&canary[0], &release(2), true),
        true,
        30,
    )
    .unwrap();
    flow.device_status(
        &canary[1],
        &alarmed(&canary[1], &release(2), false),
        true,
        30,
    )
    .unwrap();
    assert!(released(&steps(&mut flow)).is_empty());
    // A majority is.
    flow.device_status(
        &canary[1],
        &alarmed(&canary[1], &release(2), true),
        true,
        31,
    )
    .unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [1]);
    assert_eq!(pointers(&s)[0].stage, Stage::All);
    assert_eq!(pointers(&s)[0].sha256, release(1).sha256_hex());
    assert!(s.iter().any(|e| matches!(e, Step::Event(ReleaseEvent::RolledBack { reason, .. }) if reason.contains(&canary[0]) && reason.contains("2 of 3"))));
    assert_eq!(flow.next_deadline(), None);
}

/// A canary's status: it serves `serving` and counted `changed` of `confident` answers of
/// the release `against` changed.
fn head_checked(
    client: &str,
    serving: &ModelRelease,
    against: &ModelRelease,
    confident: u64,
    changed: u64,
) -> EdgeStatus {
    EdgeStatus {
        client_id: client.into(),
        online: true,
        serving: Some(serving.sha256_hex()),
        head_check: Some(fedge_wire::HeadCheck {
            requests: confident * 2,
            confident,
            changed,
            ..fedge_wire::HeadCheck::new(serving.sha256_hex(), against.sha256_hex())
        }),
        ..EdgeStatus::default()
    }
}

#[test]
fn a_canary_whose_heads_mostly_change_the_confident_answers_sends_every_device_back() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b", "c", "d"]);
    flow.aggregated(release(1), 0);
    scores_served(&mut flow, "site", 1);
    flow.aggregated(release(2), 10);
    compares(&mut flow, "site", &release(2), (1, 1), 20).unwrap();
    let s = steps(&mut flow);
    let canary = pointers(&s).last().unwrap().canary.clone();
    let report = |flow: &mut ReleaseFlow, i: usize, status: EdgeStatus| {
        flow.device_status(&canary[i], &status, true, 30).unwrap();
    };
    // An honest successor changes a few; too few confident answers say nothing; a count
    // against another release than the one replaced is not this stage's.
    report(
        &mut flow,
        0,
        head_checked(&canary[0], &release(2), &release(1), 80, 70),
    );
    report(
        &mut flow,
        1,
        head_checked(&canary[1], &release(2), &release(1), 200, 9),
    );
    report(
        &mut flow,
        2,
        head_checked(&canary[2], &release(2), &release(1), 40, 40),
    );
    assert!(released(&steps(&mut flow)).is_empty());
    report(
        &mut flow,
        1,
        head_checked(&canary[1], &release(2), &release(3), 200, 190),
    );
    assert!(released(&steps(&mut flow)).is_empty());
    // A majority of canaries whose head changed most confident answers: back to release 1.
    report(
        &mut flow,
        2,
        head_checked(&canary[2], &release(2), &release(1), 60, 58),
    );
    let s = steps(&mut flow);
    assert_eq!(released(&s), [1]);
    assert_eq!(pointers(&s)[0].sha256, release(1).sha256_hex());
    assert!(s.iter().any(|e| matches!(e, Step::Event(ReleaseEvent::RolledBack { reason, .. }) if reason.contains("changed 58 of 60 confident answers") && reason.contains("2 of 3"))), "{s:?}");
}

#[test]
fn only_named_unbanned_evaluation_sites_with_true_counts_score() {
    let config = ReleaseConfig {
        evaluators: vec!["site".into(), "other".into(), "third".into()],
        min_sites: 2,
        ..gated()
    };
    let mut flow = ReleaseFlow::new(config, "plant");
    online(&mut flow, &["a", "b", "c", "d"]);
    flow.aggregated(release(1), 0);
    flow.aggregated(release(2), 10);
    steps(&mut flow);
    // Not named; a release never made; 1e30; counts beyond the images; accuracies that do
    // not match the counts: each refused, none counts.
    let err = compares(&mut flow, "a", &release(2), (0, 40), 11).unwrap_err();
    assert!(err.contains("not an evaluation site"), "{err}");
    // A release never made: compared with the one served it is ignored, never counted (a
    // candidate from before a restart, which is not kept, looks the same); alone, refused.
    compares(&mut flow, "site", &release(9), (0, 40), 11).unwrap();
    let alone = site_status("site", &release(9), 0.5, None);
    let err = flow.device_status("site", &alone, true, 11).unwrap_err();
    assert!(err.contains("did not make"), "{err}");
    let mut lie = site_status("site", &release(2), 1e30, None);
    assert!(flow.device_status("site", &lie, true, 12).is_err());
    let evaluation = lie.evaluation.as_mut().unwrap();
    evaluation.accuracy = 0.5;
    evaluation.class_accuracy = vec![Some(0.5); 2];
    lie.paired = Some(PairedScore {
        against: release(1).sha256_hex(),
        samples: IMAGES,
        gained: 90,
        lost: 90,
    });
    assert!(flow.device_status("site", &lie, true, 12).is_err());
    scores_served(&mut flow, "site", 13);
    let err = compares(&mut flow, "site", &release(2), (0, 0), 14);
    assert!(err.is_ok());
    lie.paired = Some(PairedScore {
        against: release(1).sha256_hex(),
        samples: IMAGES,
        gained: 0,
        lost: 40,
    });
    let err = flow.device_status("site", &lie, true, 15).unwrap_err();
    assert!(err.contains("paired counts"), "{err}");
    // One site alone claims a regression: the gate waits for the others.
    compares(&mut flow, "site", &release(2), (0, 40), 16).unwrap();
    let gate = flow.status(&|_| String::new()).unwrap().gate.unwrap();
    assert_eq!(gate.outcome, GateOutcome::Waiting);
    // A banned site's score does not count; the two others find no regression: promoted.
    let banned: std::collections::BTreeSet<String> = ["site".to_owned()].into();
    flow.exclude(&banned);
    compares(&mut flow, "other", &release(2), (3, 2), 17).unwrap();
    compares(&mut flow, "third", &release(2), (2, 3), 18).unwrap();
    let gate = flow.status(&|_| String::new()).unwrap().gate.unwrap();
    assert_eq!(gate.outcome, GateOutcome::Promoted, "{gate:?}");
    assert_eq!(gate.sites, 2);
}

#[test]
fn a_rollback_serves_a_kept_release_everywhere_and_holds_it_until_promote() {
    let mut flow = ReleaseFlow::new(ReleaseConfig::default(), "plant");
    for round in 1..=3 {
        flow.aggregated(release(round), round);
    }
    steps(&mut flow);
    // The one before the served one.
    flow.rollback(None).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [2]);
    assert!(pointers(&s)[0].pinned);
    // Pinned: a new aggregate is not served.
    flow.aggregated(release(4), 10);
    assert!(released(&steps(&mut flow)).is_empty());
    // By round, and by a digest's start.
    flow.rollback(Some("1")).unwrap();
    assert_eq!(released(&steps(&mut flow)), [1]);
    let sha = release(3).sha256_hex();
    flow.rollback(Some(&sha[..8])).unwrap();
    assert_eq!(released(&steps(&mut flow)), [3]);
    let err = flow.rollback(Some("99")).unwrap_err();
    assert!(err.contains("kept: round"), "{err}");
    // Promote: the latest candidate is served, and releases go through again.
    flow.promote_now(20).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [4]);
    assert!(!pointers(&s)[0].pinned);
    flow.aggregated(release(5), 30);
    assert_eq!(released(&steps(&mut flow)), [5]);
    assert!(flow.promote_now(40).is_err());
}

#[test]
fn a_candidate_without_scores_is_held_or_promoted_at_its_timeout() {
    for (on_timeout, expect) in [(OnTimeout::Hold, vec![]), (OnTimeout::Promote, vec![2])] {
        let config = ReleaseConfig {
            on_timeout,
            canary_share: 0.0,
            ..gated()
        };
        let mut flow = ReleaseFlow::new(config, "plant");
        flow.aggregated(release(1), 0);
        flow.aggregated(release(2), 1_000);
        steps(&mut flow);
        assert_eq!(flow.next_deadline(), Some(61_000));
        flow.tick(61_000);
        assert_eq!(released(&steps(&mut flow)), expect);
        let gate = flow.status(&|_| String::new()).unwrap().gate.unwrap();
        assert!(gate.reason.contains("timeout_s"), "{}", gate.reason);
        assert_eq!(flow.next_deadline(), None);
    }
}

#[test]
fn settings_out_of_range_are_named() {
    let bad = [
        ReleaseConfig {
            canary_share: 1.5,
            ..ReleaseConfig::default()
        },
        ReleaseConfig {
            keep: 1,
            ..ReleaseConfig::default()
        },
        ReleaseConfig {
            significance: 0.0,
            ..ReleaseConfig::default()
        },
        ReleaseConfig {
            timeout_s: 0.0,
            ..ReleaseConfig::default()
        },
        ReleaseConfig {
            mode: ReleaseMode::Gated,
            ..ReleaseConfig::default()
        },
    ];
    for (config, name) in bad.iter().zip([
        "canary_share",
        "keep",
        "significance",
        "timeout_s",
        "evaluators",
    ]) {
        assert!(config.check().unwrap_err().contains(name));
    }
    assert_eq!(ReleaseConfig::default().check(), Ok(()));
}

#[test]
fn a_candidate_that_comes_during_a_canary_waits_for_its_end() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b", "c", "d"]);
    flow.aggregated(release(1), 0);
    scores_served(&mut flow, "site", 1);
    flow.aggregated(release(2), 10);
    compares(&mut flow, "site", &release(2), (2, 0), 20).unwrap();
    steps(&mut flow);
    // Round 3 passes on its scores, but round 2's canary is under way: it waits.
    flow.aggregated(release(3), 30);
    compares(&mut flow, "site", &release(3), (1, 0), 40).unwrap();
    let s = steps(&mut flow);
    assert!(released(&s).is_empty(), "{s:?}");
    let gate = flow.status(&|_| String::new()).unwrap().gate.unwrap();
    assert_eq!(
        (gate.candidate.round, gate.outcome),
        (3, GateOutcome::Waiting)
    );
    // No timeout runs meanwhile: the canary's window is the next deadline.
    assert_eq!(flow.next_deadline(), Some(20 + 10_000));
    // The window ends: round 2 goes to everyone; round 3, compared with round 1, waits for
    // the site's comparison with round 2, then is canaried.
    flow.tick(20 + 10_000);
    let s = steps(&mut flow);
    assert!(released(&s).is_empty(), "{s:?}");
    let stages: Vec<(Stage, u64)> = pointers(&s).iter().map(|p| (p.stage, p.round)).collect();
    assert_eq!(stages, [(Stage::All, 2)]);
    assert_eq!(flow.serving().map(|r| r.round), Some(2));
    scores_served(&mut flow, "site", 10_021);
    compares(&mut flow, "site", &release(3), (1, 0), 10_022).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [3]);
    assert_eq!(pointers(&s)[0].stage, Stage::Canary);
}

#[test]
fn banned_and_revoked_devices_are_never_canaries() {
    let config = ReleaseConfig {
        canary_share: 1.0,
        ..gated()
    };
    let mut flow = ReleaseFlow::new(config, "plant");
    online(&mut flow, &["a", "b", "c", "d", "e"]);
    let banned: std::collections::BTreeSet<String> = ["a".to_owned()].into();
    flow.exclude(&banned);
    flow.forget_unless(|c| c != "b");
    flow.aggregated(release(1), 0);
    scores_served(&mut flow, "site", 1);
    flow.aggregated(release(2), 10);
    compares(&mut flow, "site", &release(2), (1, 1), 20).unwrap();
    let s = steps(&mut flow);
    let canary = &pointers(&s).last().unwrap().canary;
    assert!(!canary.iter().any(|c| c == "a" || c == "b"), "{canary:?}");
    assert_eq!(
        canary.len(),
        4,
        "every allowed online device at a share of 1: {canary:?}"
    );
}

#[test]
fn the_devices_followed_are_bounded_and_an_offline_one_is_forgotten() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    let ids: Vec<String> = (0..MAX_FOLLOWED + 50)
        .map(|i| format!("made-up-{i}"))
        .collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    online(&mut flow, &names);
    assert_eq!(flow.devices.len(), MAX_FOLLOWED);
    let gone = EdgeStatus {
        client_id: "made-up-0".into(),
        online: false,
        ..EdgeStatus::default()
    };
    flow.device_status("made-up-0", &gone, true, 1).unwrap();
    assert_eq!(flow.devices.len(), MAX_FOLLOWED - 1);
    assert!(!flow.devices.contains_key("made-up-0"));
}

#[test]
fn ctl_promote_serves_the_candidate_on_every_device_at_once_past_the_canary() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b", "c", "d"]);
    flow.aggregated(release(1), 0);
    flow.aggregated(release(2), 10);
    steps(&mut flow);
    flow.promote_now(20).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [2]);
    let stages: Vec<Stage> = pointers(&s).iter().map(|p| p.stage).collect();
    assert_eq!(stages, [Stage::All], "{s:?}");
    assert_eq!(flow.serving().map(|r| r.round), Some(2));
    assert_eq!(flow.next_deadline(), None, "no canary window runs");
}

#[test]
fn after_a_restart_the_next_candidate_is_judged_on_its_paired_scores_without_waiting() {
    // Before the restart: round 1 served, its score known; round 2 held.
    let mut before = ReleaseFlow::new(gated(), "plant");
    online(&mut before, &["a", "b", "c"]);
    before.aggregated(release(1), 0);
    scores_served(&mut before, "site", 1);
    before.aggregated(release(2), 100);
    compares(&mut before, "site", &release(2), (5, 25), 200).unwrap();
    let kept: Vec<ModelRelease> = before.kept().cloned().collect();
    // Restarted: the releases kept come back, no score of any (the site has not restarted).
    let mut flow = ReleaseFlow::new(gated(), "plant");
    flow.restore(kept);
    online(&mut flow, &["a", "b", "c"]);
    assert_eq!(flow.serving().map(|r| r.round), Some(1));
    flow.aggregated(release(3), 1_000);
    steps(&mut flow);
    // The site compares the new candidate with what it serves: judged at once, no timeout.
    compares(&mut flow, "site", &release(3), (12, 4), 1_100).unwrap();
    let s = steps(&mut flow);
    assert_eq!(released(&s), [3], "{s:?}");
    let verdict = flow.status(&|_| String::new()).unwrap().gate.unwrap();
    assert_eq!(verdict.outcome, GateOutcome::Promoted);
    assert!(flow.next_deadline() < Some(1_000 + 60_000));
}

#[test]
fn promote_with_nothing_to_promote_is_refused_and_after_a_rollback_it_unpins() {
    let mut flow = ReleaseFlow::new(gated(), "plant");
    online(&mut flow, &["a", "b"]);
    flow.aggregated(release(1), 0);
    steps(&mut flow);
    let refused = flow.promote_now(5).unwrap_err();
    assert!(refused.contains("nothing to promote"), "{refused}");
    // Pinned by a rollback, no candidate: promote unpins, and says so by succeeding.
    flow.aggregated(release(2), 10);
    steps(&mut flow);
    flow.promote_now(20).unwrap();
    flow.rollback(None).unwrap();
    assert!(flow.pinned());
    flow.promote_now(30).unwrap();
    assert!(!flow.pinned());
    assert_eq!(
        flow.serving().map(|r| r.round),
        Some(1),
        "what the rollback served stays"
    );
}
