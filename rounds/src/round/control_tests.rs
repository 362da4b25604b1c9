//! Operator commands at round boundaries: pause and resume, ban and unban, fewer rounds.

use fedge_wire::control::Command;

use super::tests::{config, drain, machine, reports, tasks, update};
use super::*;

fn answer(m: &mut Rounds, round: u64, clients: &[&str], t: u64) -> Vec<Output> {
    for c in clients {
        m.handle_packet(c, &update(c, round, [0.1, 0.0, 0.0, 0.0], 5), t);
    }
    drain(m)
}

/// A machine of `config` whose round 1 selects all of `a`, `b` and `c`: paused while the
/// three come online, then resumed.
fn three_online(config: RoundConfig) -> Rounds {
    let mut m = Rounds::new(config, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    m.apply_control(&Command::Pause, 0);
    for c in ["a", "b", "c"] {
        m.handle_client_status(c, true, 0);
    }
    m.apply_control(&Command::Resume, 1);
    m
}

#[test]
fn a_pause_lets_the_open_round_finish_and_opens_no_other_until_resume() {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 3,
            ..config()
        },
    );
    assert_eq!(tasks(&drain(&mut m))[0].round, 1);
    m.apply_control(&Command::Pause, 5);
    drain(&mut m);
    assert_eq!(m.phase(), Phase::Training, "round 1 stays open");
    let out = answer(&mut m, 1, &["a", "b"], 10);
    assert!(reports(&out)[0].aggregated);
    assert!(tasks(&out).is_empty(), "paused: no round 2");
    assert_eq!(m.phase(), Phase::Waiting);
    assert!(m.control().paused);
    m.handle_timeout(10_000);
    assert!(tasks(&drain(&mut m)).is_empty());
    m.apply_control(&Command::Resume, 20);
    assert_eq!(tasks(&drain(&mut m))[0].round, 2);
}

#[test]
fn a_banned_device_is_selected_for_no_round_until_unbanned() {
    let three = RoundConfig {
        rounds: 3,
        ..config()
    };
    let mut m = three_online(three);
    assert_eq!(tasks(&drain(&mut m))[0].selected, ["a", "b", "c"]);
    m.apply_control(&Command::Ban { client: "b".into() }, 5);
    let out = answer(&mut m, 1, &["a", "b", "c"], 10);
    assert_eq!(
        reports(&out)[0].reported.len(),
        3,
        "round 1 was open before the ban"
    );
    assert_eq!(tasks(&out)[0].selected, ["a", "c"]);
    // Its update for round 2 is not counted.
    let out = answer(&mut m, 2, &["b", "a", "c"], 20);
    assert_eq!(reports(&out)[0].reported, ["a", "c"]);
    assert_eq!(reports(&out)[0].rejected.get("not_selected"), Some(&1));
    m.apply_control(&Command::Unban { client: "b".into() }, 25);
    assert_eq!(tasks(&out)[0].selected, ["a", "c"], "round 3 opened before");
    let out = answer(&mut m, 3, &["a", "c"], 30);
    assert!(reports(&out)[0].aggregated);
    assert!(m.control().banned.is_empty());
}

#[test]
fn fewer_rounds_end_the_federation_at_the_next_boundary() {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 10,
            ..config()
        },
    );
    drain(&mut m);
    m.apply_control(&Command::SetRounds { rounds: 2 }, 5);
    answer(&mut m, 1, &["a", "b"], 10);
    let out = answer(&mut m, 2, &["a", "b"], 20);
    assert!(out.iter().any(|o| matches!(o, Output::Finished)));
    assert_eq!(m.phase(), Phase::Finished);
    // Set below what is done while waiting (paused): finished at once.
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 10,
            ..config()
        },
    );
    drain(&mut m);
    m.apply_control(&Command::Pause, 5);
    answer(&mut m, 1, &["a", "b"], 10);
    m.apply_control(&Command::SetRounds { rounds: 1 }, 15);
    assert!(drain(&mut m).iter().any(|o| matches!(o, Output::Finished)));
}

#[test]
fn a_command_that_does_not_verify_is_counted_as_bad_control() {
    let mut m = machine(&["a", "b"], config());
    drain(&mut m);
    m.reject_control("the command's tag does not verify".into());
    assert_eq!(m.rejected_total().get("bad_control"), Some(&1));
    assert!(!m.control().paused);
}

#[test]
fn new_keys_take_a_revoked_device_offline_and_refuse_its_next_update() {
    let keys = |ids: &[&str]| -> DeviceKeys {
        ids.iter()
            .map(|id| {
                (
                    id.to_string(),
                    fedge_wire::DeviceKey::from_bytes([id.len() as u8; 32]),
                )
            })
            .collect()
    };
    let auth = RoundConfig {
        auth: Some(std::sync::Arc::new(keys(&["a", "bb", "ccc"]))),
        ..config()
    };
    let mut m = Rounds::new(auth, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    for c in ["a", "bb", "ccc"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    m.set_device_keys(keys(&["a", "ccc"]));
    assert!(!m.online().contains("bb"));
    assert!(m.online().contains("a") && m.online().contains("ccc"));
    // Its next update, even a well-formed one, is from an unknown device now.
    m.handle_packet("bb", &update("bb", 1, [0.1, 0.0, 0.0, 0.0], 5), 10);
    assert_eq!(m.rejected_total().get("unknown_device"), Some(&1));
    // Without authentication there are no keys to replace.
    let mut open = machine(&["a", "b"], config());
    open.set_device_keys(keys(&["a"]));
    assert!(open.online().contains("b"));
    // With keys, a ban names a device of the keys file: a typo is refused, not kept.
    m.apply_control(
        &Command::Ban {
            client: "no-such-device".into(),
        },
        20,
    );
    assert_eq!(m.rejected_total().get("bad_control"), Some(&1));
    assert!(m.control().banned.is_empty());
    m.apply_control(
        &Command::Ban {
            client: "ccc".into(),
        },
        21,
    );
    assert!(m.control().banned.contains("ccc"));
}

#[test]
fn set_backbone_names_the_backbone_in_the_next_task_and_bad_hex_is_refused() {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 3,
            ..config()
        },
    );
    assert_eq!(tasks(&drain(&mut m))[0].backbone, None);
    let sha256 = "8b".repeat(32);
    let set = Command::SetBackbone {
        name: "digits-conv-v2".into(),
        sha256: sha256.clone(),
    };
    m.apply_control(&set, 5);
    let out = answer(&mut m, 1, &["a", "b"], 10);
    let named = tasks(&out)[0].backbone.clone().unwrap();
    assert_eq!(
        (named.name.as_str(), named.sha256),
        ("digits-conv-v2", [0x8b; 32])
    );
    let bad = Command::SetBackbone {
        name: "x".into(),
        sha256: "zz".into(),
    };
    m.apply_control(&bad, 20);
    assert_eq!(m.rejected_total().get("bad_control"), Some(&1));
    let out = answer(&mut m, 2, &["a", "b"], 30);
    assert_eq!(
        tasks(&out)[0].backbone.as_ref().map(|b| b.sha256),
        Some([0x8b; 32])
    );
}

#[test]
fn a_ban_below_min_clients_says_why_no_round_opens() {
    let two = RoundConfig {
        rounds: 3,
        min_clients: 2,
        ..config()
    };
    let mut m = Rounds::new(two, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    m.apply_control(&Command::Pause, 0);
    assert!(m.waiting_reason().unwrap().contains("paused"));
    m.handle_client_status("a", true, 0);
    m.handle_client_status("b", true, 0);
    m.apply_control(&Command::Resume, 1);
    assert_eq!(m.phase(), Phase::Training);
    assert_eq!(m.waiting_reason(), None);
    answer(&mut m, 1, &["a", "b"], 2);
    m.apply_control(&Command::Ban { client: "b".into() }, 3);
    // Round 1 ended, round 2 opened before the ban; it ends, and no round 3 can open.
    answer(&mut m, 2, &["a", "b"], 4);
    assert_eq!(m.phase(), Phase::Waiting);
    let why = m.waiting_reason().unwrap();
    assert!(
        why.contains("1 device(s) can be selected") && why.contains("min_clients is 2"),
        "{why}"
    );
    assert!(why.contains("2 online, 1 of them banned"), "{why}");
}

#[test]
fn a_finished_federation_runs_again_under_a_new_run_when_the_operator_says() {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 1,
            ..config()
        },
    );
    let first = tasks(&drain(&mut m)).pop().unwrap();
    // Not while a run is on.
    m.apply_control(&Command::NewRun { rounds: 2 }, 1);
    assert_eq!(rejected_reasons(&drain(&mut m)), ["bad_control"]);
    let out = answer(&mut m, 1, &["a", "b"], 2);
    assert!(out.iter().any(|o| matches!(o, Output::Finished)));
    assert_eq!(m.phase(), Phase::Finished);
    m.apply_control(&Command::NewRun { rounds: 2 }, 3);
    let task = tasks(&drain(&mut m))
        .pop()
        .expect("the new run's first task");
    assert_eq!(task.round, 2, "round numbers carry on");
    assert_ne!(task.run, first.run, "a new run");
    // An update answering the old run is a replay of it.
    let mut old = update("a", 2, [0.1, 0.0, 0.0, 0.0], 5);
    old = {
        let mut u = match fedge_wire::decode(&old).unwrap() {
            fedge_wire::Message::ClientUpdate(u) => u,
            _ => unreachable!(),
        };
        u.run = first.run;
        fedge_wire::encode(&fedge_wire::Message::ClientUpdate(u))
    };
    m.handle_packet("a", &old, 4);
    assert_eq!(rejected_reasons(&drain(&mut m)), ["replay"]);
    let runs = &m.control().runs;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].first_round, runs[0].last_round, runs[0].aggregated),
        (1, 1, 1)
    );
    let settings = m.operator_settings(0);
    assert_eq!(settings.rounds, Some(3));
    assert_eq!(settings.run_start, Some((2, 1)));
}

#[test]
fn a_new_run_too_long_to_count_is_refused_as_bad_control() {
    let mut m = finished_one_round();
    let run = m.config().run;
    m.apply_control(&Command::NewRun { rounds: u64::MAX }, 3);
    assert_eq!(rejected_reasons(&drain(&mut m)), ["bad_control"]);
    let refused = m.control().refused.clone().unwrap_or_default();
    assert!(
        refused.contains("new-run") && refused.contains("at most"),
        "{refused}"
    );
    // Nothing changed: still finished, the same run, no run ended.
    assert_eq!((m.phase(), m.config().run), (Phase::Finished, run));
    assert!(m.control().runs.is_empty());
    m.apply_control(&Command::NewRun { rounds: 2 }, 4);
    assert_eq!(m.phase(), Phase::Training);
}

/// Endless rounds of every online device, a quorum of two; a device that fails two in a
/// row rests.
fn resting_after_two() -> RoundConfig {
    RoundConfig {
        rounds: 0,
        min_clients: 2,
        min_updates: 2,
        fraction: 1.0,
        max_missed_rounds: 2,
        ..config()
    }
}

/// `a` and `b` ran a one-round federation to its end.
fn finished_one_round() -> Rounds {
    let mut m = machine(
        &["a", "b"],
        RoundConfig {
            rounds: 1,
            ..config()
        },
    );
    drain(&mut m);
    answer(&mut m, 1, &["a", "b"], 2);
    assert_eq!(m.phase(), Phase::Finished);
    m
}

fn rejected_reasons(out: &[Output]) -> Vec<&'static str> {
    out.iter()
        .filter_map(|o| match o {
            Output::Rejected { reason, .. } => Some(reason.name()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_device_failing_rounds_in_a_row_rests_until_it_reports_healthy() {
    let three = resting_after_two();
    let mut m = three_online(three);
    let mut t = 0;
    // c never answers: each round waits out its deadline for it.
    for round in 1..=2 {
        let task = tasks(&drain(&mut m)).pop().unwrap();
        assert_eq!(task.selected.len(), 3, "round {round} selects c");
        answer(&mut m, round, &["a", "b"], t + 1);
        t += 100_000;
        m.handle_timeout(t);
    }
    let task = tasks(&drain(&mut m)).pop().unwrap();
    assert_eq!(task.selected, ["a", "b"], "c rests");
    assert_eq!(m.resting(), ["c"]);
    // Its answer closes the round at once: nobody waits for c.
    let out = answer(&mut m, 3, &["a", "b"], t + 1);
    assert!(reports(&out)[0].aggregated);
    assert!(reports(&out)[0].failures.is_empty());
    // Back online after being away: selected again.
    m.handle_client_status("c", false, t + 2);
    m.handle_client_status("c", true, t + 3);
    assert!(m.resting().is_empty());
    // Round 4 was drawn before c came back; round 5 selects it again.
    let out = answer(&mut m, 4, &["a", "b"], t + 4);
    let task = tasks(&out).pop().unwrap();
    assert_eq!((task.round, task.selected.len()), (5, 3));
}

fn declining(client: &str, run: u64, round: u64, at: &str) -> fedge_wire::EdgeStatus {
    fedge_wire::EdgeStatus {
        client_id: client.into(),
        online: true,
        last_error: "flat parameter vector has 8 values, the layout needs 4".into(),
        updated_at: at.into(),
        declined: Some(fedge_wire::Declined {
            run: format!("{run:016x}"),
            round,
            reason: "flat parameter vector has 8 values, the layout needs 4".into(),
        }),
        ..fedge_wire::EdgeStatus::default()
    }
}

#[test]
fn a_device_that_declines_is_not_waited_for_and_rests_after_declining_in_a_row() {
    let three = resting_after_two();
    let run = three.run;
    let mut m = three_online(three);
    let task = tasks(&drain(&mut m)).pop().unwrap();
    assert_eq!((task.round, task.selected.len()), (1, 3));
    // Another run's round, or another round, changes nothing: the round still waits for c.
    m.handle_edge_status("c", &declining("c", run ^ 1, 1, "t1"), 5);
    m.handle_edge_status("c", &declining("c", run, 2, "t2"), 5);
    let out = answer(&mut m, 1, &["a", "b"], 10);
    assert!(
        reports(&out).is_empty(),
        "c has neither reported nor declined"
    );
    // Its decline of this round closes it before its deadline, c's failure `declined`.
    m.handle_edge_status("c", &declining("c", run, 1, "t3"), 20);
    let out = drain(&mut m);
    let report = reports(&out).pop().expect("closed at once");
    assert!(report.aggregated);
    assert_eq!(report.failures["c"], "declined");
    assert!(report.duration_ms < 1_000);
    // Declining first, then the others' updates: closed by the last update.
    let task = tasks(&out).pop().unwrap();
    assert_eq!(task.round, 2);
    m.handle_edge_status("c", &declining("c", run, 2, "t4"), 30);
    assert!(reports(&drain(&mut m)).is_empty());
    let out = answer(&mut m, 2, &["a", "b"], 40);
    assert_eq!(reports(&out)[0].failures["c"], "declined");
    // Two declines in a row: c rests.
    assert_eq!(m.resting(), ["c"]);
    assert_eq!(tasks(&out).pop().unwrap().selected, ["a", "b"]);
}

#[test]
fn reset_pool_forgets_the_pooled_summary_and_a_restart_does_not_bring_it_back() {
    let mut pooling = RoundConfig {
        rounds: 3,
        ..config()
    };
    pooling.train.feature_norm = fedge_wire::FeatureNorm::Balanced;
    let rows = [[0.0f32, 1.0], [1.0, 0.0], [2.0, 1.0]];
    let pool =
        fedge_wire::FeatureSummary::of_rows(2, 2, rows.iter().map(|r| &r[..]), &[0, 1, 1]).unwrap();
    // Paused while the two come online: no round opens before the reset.
    let mut m = Rounds::new(
        pooling.clone(),
        Box::new(crate::strategy::FedAvg),
        vec![0.0; 4],
    );
    m.restore_pooled(Some(pool.clone())).unwrap();
    m.apply_control(&Command::Pause, 0);
    for c in ["a", "b"] {
        m.handle_client_status(c, true, 0);
    }
    drain(&mut m);
    let planned = m.settings_after(&Command::ResetPool, 9).unwrap();
    m.apply_control(&Command::ResetPool, 5);
    assert_eq!(m.pooled(), None);
    assert!(m.rejected_total().get("bad_control").is_none());
    // Kept with the other operator settings, as planned before it was applied.
    let settings = m.operator_settings(9);
    assert_eq!(settings.pool_reset, Some(0));
    assert_eq!(settings, planned);
    let json = serde_json::to_string(&settings).unwrap();
    assert!(json.contains("\"pool_reset\":0"), "{json}");
    // The next task carries no pool (without the reset it would carry the one above).
    m.apply_control(&Command::Resume, 6);
    let task = tasks(&drain(&mut m)).pop().expect("round 1");
    assert_eq!(task.pooled, None);
    // Restarted from a checkpoint saved before the reset: its pool is forgotten again.
    let mut restarted = Rounds::new(
        pooling.clone(),
        Box::new(crate::strategy::FedAvg),
        vec![0.0; 4],
    );
    restarted.restore_pooled(Some(pool.clone())).unwrap();
    restarted.restore_operator_settings(&settings).unwrap();
    assert_eq!(restarted.pooled(), None);
    // From one saved after a round aggregated since: the pool built again stays.
    let mut later = machine(&["a", "b"], pooling);
    drain(&mut later);
    answer(&mut later, 1, &["a", "b"], 10);
    assert_eq!(later.aggregated_rounds(), 1);
    later.restore_pooled(Some(pool.clone())).unwrap();
    later.restore_operator_settings(&settings).unwrap();
    assert_eq!(later.pooled(), Some(&pool));
}

#[test]
fn a_site_aggregator_refuses_reset_pool_and_names_where_to_send_it() {
    let mut site = Rounds::new(
        RoundConfig {
            relay: Some(crate::round::RelayConfig {
                site: "plant-7".into(),
                margin_ms: 1_000,
            }),
            ..config()
        },
        Box::new(crate::strategy::FedAvg),
        vec![0.0; 4],
    );
    assert!(site.settings_after(&Command::ResetPool, 1).is_err());
    site.apply_control(&Command::ResetPool, 0);
    assert_eq!(site.rejected_total().get("bad_control"), Some(&1));
    let refused = site.control().refused.clone().unwrap_or_default();
    assert!(refused.contains("global coordinator"), "{refused}");
}

#[test]
fn every_command_s_planned_settings_are_the_ones_it_leaves() {
    let mut m = finished_one_round();
    let commands = [
        Command::Pause,
        Command::Ban { client: "b".into() },
        Command::SetRounds { rounds: 4 },
        Command::SetBackbone {
            name: "m".into(),
            sha256: "AB".repeat(32),
        },
        Command::ResetPool,
        Command::Unban { client: "b".into() },
        Command::Resume,
        Command::SetRounds { rounds: 1 },
        Command::NewRun { rounds: 2 },
        Command::Promote,
        Command::Status,
    ];
    for (seq, command) in (10..).zip(commands) {
        let planned = m.settings_after(&command, seq);
        m.apply_control(&command, seq);
        assert_eq!(planned, Ok(m.operator_settings(seq)), "{command:?}");
    }
    // Only `promote` was refused (no candidate waits), unpinning as planned.
    assert_eq!(m.rejected_total().get("bad_control"), Some(&1));
    assert_eq!(m.control().runs.len(), 1);
}

#[test]
fn a_restart_from_a_checkpoint_before_a_new_run_goes_on_with_the_new_run() {
    let one = RoundConfig {
        rounds: 1,
        ..config()
    };
    let mut m = machine(&["a", "b"], one.clone());
    drain(&mut m);
    answer(&mut m, 1, &["a", "b"], 2);
    let old = m.config().run;
    let planned = m.settings_after(&Command::NewRun { rounds: 2 }, 7).unwrap();
    m.apply_control(&Command::NewRun { rounds: 2 }, 3);
    let new = m.config().run;
    assert_ne!(new, old);
    assert_eq!(planned.run, Some(format!("{new:016x}")), "drawn as planned");
    assert_eq!(planned, m.operator_settings(7));
    // Killed before the new run's first aggregation: the checkpoint is of the old run.
    let mut restarted = Rounds::new(one.clone(), Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    assert_eq!(restarted.config().run, old);
    restarted.restore_operator_settings(&planned).unwrap();
    assert_eq!(restarted.config().run, new);
    // A coordinator started afresh (another run, no checkpoint) keeps its own.
    let fresh = RoundConfig {
        run: old ^ 0xff,
        ..one
    };
    let mut afresh = Rounds::new(fresh, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    afresh.restore_operator_settings(&planned).unwrap();
    assert_eq!(afresh.config().run, old ^ 0xff);
    // A damaged run number is refused with what is wrong.
    let damaged = OperatorSettings {
        run: Some("xyz".into()),
        ..planned
    };
    let error = afresh.restore_operator_settings(&damaged).unwrap_err();
    assert!(error.contains("16 hex digits"), "{error}");
}

#[test]
fn a_resting_device_is_tried_again_when_its_rest_ends_and_rests_longer_if_it_fails_again() {
    // Three devices, all needed: a resting c stops the federation, which must not wait for
    // ever for a status without an error that a declining device never sends.
    let all = RoundConfig {
        min_clients: 3,
        ..resting_after_two()
    };
    let run = all.run;
    let mut m = three_online(all);
    for round in 1..=2 {
        drain(&mut m);
        m.handle_edge_status("c", &declining("c", run, round, &format!("t{round}")), 10);
        answer(&mut m, round, &["a", "b"], round * 100);
    }
    assert_eq!(m.resting(), ["c"]);
    assert!(
        tasks(&drain(&mut m)).is_empty(),
        "2 of 3 devices can be selected"
    );
    let why = m.waiting_reason().unwrap_or_default();
    assert!(why.contains("1 resting"), "{why}");
    // Its rest is twice the round timeout (1 s here): the machine asks to be woken then.
    let rest_end = 200 + 2_000;
    assert_eq!(m.poll_timeout(), Some(rest_end));
    m.handle_timeout(rest_end - 1);
    assert!(tasks(&drain(&mut m)).is_empty());
    m.handle_timeout(rest_end);
    let task = tasks(&drain(&mut m)).pop().expect("a probe round");
    assert_eq!((task.round, task.selected.len()), (3, 3));
    // It declines the probe too: it rests again, twice as long.
    m.handle_edge_status("c", &declining("c", run, 3, "t3"), rest_end + 5);
    answer(&mut m, 3, &["a", "b"], rest_end + 10);
    assert_eq!(m.resting(), ["c"]);
    assert_eq!(m.poll_timeout(), Some(rest_end + 10 + 4_000));
    m.handle_timeout(rest_end + 10 + 4_000);
    let task = tasks(&drain(&mut m)).pop().expect("the second probe");
    assert_eq!(task.round, 4);
    // Its cause fixed, it trains: no longer counted as failing.
    let out = answer(&mut m, 4, &["a", "b", "c"], rest_end + 5_000);
    assert!(m.resting().is_empty());
    let task = tasks(&out).pop().expect("round 5");
    assert_eq!(task.selected.len(), 3);
}

#[test]
fn a_round_closes_when_its_only_missing_device_goes_offline_with_a_quorum_in() {
    let three = RoundConfig {
        rounds: 0,
        min_clients: 2,
        min_updates: 2,
        fraction: 1.0,
        round_timeout_ms: 60_000,
        ..config()
    };
    let mut m = three_online(three.clone());
    assert_eq!(tasks(&drain(&mut m)).pop().unwrap().selected.len(), 3);
    assert!(
        reports(&answer(&mut m, 1, &["a", "b"], 10)).is_empty(),
        "c awaited"
    );
    // c's Last Will: nothing left to wait for.
    m.handle_client_status("c", false, 20);
    let out = drain(&mut m);
    let report = reports(&out).pop().expect("closed at once, not at 60 s");
    assert!(report.aggregated);
    assert_eq!(report.failures["c"], "offline");
    // Without a quorum in, the round waits for its deadline: c may come back with its update.
    let all = RoundConfig {
        min_updates: 3,
        ..three
    };
    let mut m = three_online(all);
    drain(&mut m);
    answer(&mut m, 1, &["a"], 10);
    m.handle_client_status("c", false, 20);
    assert!(reports(&drain(&mut m)).is_empty());
    m.handle_client_status("c", true, 30);
    let out = answer(&mut m, 1, &["b", "c"], 40);
    let report = reports(&out).pop().expect("closed by c's update");
    assert!(
        report.aggregated && report.failures.is_empty(),
        "{report:?}"
    );
}
