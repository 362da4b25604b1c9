//! A machine killed mid-round and rebuilt from its checkpoint and journal ends where an
//! uninterrupted one does.

use super::saved::{OpenRoundLog, Record};
use super::tests::{M, config, drain, update};
use super::*;
use crate::strategy::{FedAvg, ServerMomentum};

fn journaled() -> RoundConfig {
    RoundConfig {
        rounds: 3,
        min_clients: 3,
        min_updates: 3,
        journal: true,
        ..config()
    }
}

fn strategy() -> Box<dyn Strategy> {
    Box::new(ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap())
}

fn delta(client: &str, round: u64) -> [f32; M] {
    let c = client.as_bytes()[0] as f32;
    std::array::from_fn(|i| (c * 0.01 + round as f32 * 0.1) * (i as f32 - 1.5))
}

fn online(m: &mut Rounds) {
    for c in ["a", "b", "c"] {
        m.handle_client_status(c, true, 0);
    }
}

/// What a driver does with the outputs: the journal in memory, a checkpoint after aggregation.
pub(super) fn keep(m: &mut Rounds, journal: &mut Vec<Record>, checkpoint: &mut Option<Checkpoint>) {
    for output in drain(m) {
        match output {
            Output::Journal(r @ Record::Opened { .. }) => *journal = vec![r],
            Output::Journal(r) => journal.push(r),
            Output::RoundEnded(report) if report.aggregated => {
                *checkpoint = Some(m.checkpoint());
            }
            _ => {}
        }
    }
}

/// The journal as a driver reads it back.
pub(super) fn log_of(journal: &[Record]) -> OpenRoundLog {
    let mut log = OpenRoundLog::default();
    for record in journal {
        log.take(record.clone());
    }
    log
}

#[test]
fn a_restart_mid_round_keeps_accepted_updates_and_ends_like_an_uninterrupted_run() {
    let mut reference = Rounds::new(journaled(), strategy(), vec![0.0; M]);
    online(&mut reference);
    for round in 1..=3 {
        for c in ["a", "b", "c"] {
            reference.handle_packet(c, &update(c, round, delta(c, round), 2), round * 10);
        }
    }
    assert_eq!(reference.phase(), Phase::Finished);

    let (mut journal, mut checkpoint) = (Vec::new(), None);
    let mut m = Rounds::new(journaled(), strategy(), vec![0.0; M]);
    online(&mut m);
    for c in ["a", "b", "c"] {
        m.handle_packet(c, &update(c, 1, delta(c, 1), 2), 10);
    }
    for c in ["a", "b"] {
        m.handle_packet(c, &update(c, 2, delta(c, 2), 2), 20);
    }
    keep(&mut m, &mut journal, &mut checkpoint);
    assert_eq!(m.reported(), 2);
    drop(m); // killed: only the checkpoint (after round 1) and the journal (round 2) remain

    let saved = checkpoint.clone().unwrap();
    assert_eq!(saved.next_round, 2);
    let mut m = Rounds::resume(journaled(), strategy(), saved, M).unwrap();
    assert_eq!(m.restore_round(log_of(&journal), 0), Some((2, 2)));
    assert_eq!(
        (m.round(), m.phase(), m.reported()),
        (2, Phase::Training, 2)
    );
    // The round's task goes out again; a device resending an accepted update is a duplicate.
    let out = drain(&mut m);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::PublishTask { round: 2, .. }))
    );
    m.handle_packet("a", &update("a", 2, delta("a", 2), 2), 5);
    m.handle_packet("c", &update("c", 2, delta("c", 2), 2), 6);
    online(&mut m);
    for c in ["a", "b", "c"] {
        m.handle_packet(c, &update(c, 3, delta(c, 3), 2), 30);
    }
    assert_eq!(m.phase(), Phase::Finished);
    assert_eq!(m.rejected_total().get("duplicate"), Some(&1));
    assert_eq!(m.params(), reference.params(), "bit for bit");
}

#[test]
fn a_stale_journal_is_ignored() {
    let mut m = Rounds::new(journaled(), strategy(), vec![0.0; M]);
    let mut resumed = Checkpoint {
        next_round: 5,
        ..m.checkpoint()
    };
    resumed.aggregated_rounds = 1;
    let mut m2 = Rounds::resume(journaled(), strategy(), resumed, M).unwrap();
    let log = OpenRoundLog {
        opened: Some(OpenedRound {
            round: 4,
            selected: vec!["a".into()],
            base: params_fingerprint(&[0.0; M]),
            run: 0,
        }),
        accepted: vec![("a".into(), update("a", 4, [1.0; M], 1))],
    };
    assert_eq!(m2.restore_round(log, 0), None);
    assert_eq!(m2.phase(), Phase::Waiting);
    assert_eq!(m.restore_round(OpenRoundLog::default(), 0), None);
}

#[test]
fn a_journal_beside_a_missing_checkpoint_resumes_only_onto_its_own_parameters() {
    // Killed in round 1, before any checkpoint: the journal holds the round and two updates.
    let (mut journal, mut checkpoint) = (Vec::new(), None);
    let mut m = Rounds::new(journaled(), strategy(), vec![0.0; M]);
    online(&mut m);
    for c in ["a", "b"] {
        m.handle_packet(c, &update(c, 1, delta(c, 1), 2), 10);
    }
    keep(&mut m, &mut journal, &mut checkpoint);
    assert!(checkpoint.is_none());
    drop(m);

    // Started again with other initial parameters (another seed or head): not its journal.
    let mut other = Rounds::new(journaled(), strategy(), vec![0.5; M]);
    assert_eq!(other.restore_round(log_of(&journal), 0), None);
    assert_eq!(other.phase(), Phase::Waiting);

    // Started again as it was, with the new run a fresh start draws: the journal's run is
    // taken back, so the two journaled updates and the third device's update (all answering
    // the task of the killed process) count.
    let fresh = RoundConfig {
        run: 0x77,
        ..journaled()
    };
    let mut m = Rounds::new(fresh, strategy(), vec![0.0; M]);
    assert_eq!(m.restore_round(log_of(&journal), 0), Some((1, 2)));
    online(&mut m);
    assert_eq!(m.config().run, 0, "the killed process's run");
    m.handle_packet("c", &update("c", 1, delta("c", 1), 2), 20);
    assert_eq!((m.round(), m.aggregated_rounds()), (2, 1));
    assert!(m.rejected_total().is_empty(), "{:?}", m.rejected_total());
}
