//! Booting from a state folder around operator commands that change the run: a run number is never drawn again,
//! and a journal of a run `new-run` started or `set-rounds` extended after the checkpoint is
//! resumed, not dropped (issue: a fleet that survives its own operations).

use fedge_wire::Message;
use fedge_wire::control::Command;

use super::{Plan, Start};
use crate::round::{
    Checkpoint, OpenRoundLog, OperatorSettings, Output, Phase, Record, RoundConfig, Rounds,
};
use crate::strategy::StrategyConfig;

const M: usize = 4;

fn config() -> RoundConfig {
    RoundConfig {
        round_timeout_ms: 1_000,
        ..RoundConfig::default()
    }
}

/// What a driver does with the outputs: the journal in memory, a checkpoint after aggregation.
fn keep(m: &mut Rounds, journal: &mut Vec<Record>, checkpoint: &mut Option<Checkpoint>) {
    while let Some(output) = m.poll_output() {
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
fn log_of(journal: &[Record]) -> OpenRoundLog {
    let mut log = OpenRoundLog::default();
    for record in journal {
        log.take(record.clone());
    }
    log
}

fn plan(rounds: u64) -> Plan {
    Plan {
        round: RoundConfig {
            rounds,
            min_clients: 2,
            min_updates: 2,
            journal: true,
            run: 0x5eed,
            ..config()
        },
        strategy: StrategyConfig::default(),
        noise_seed: None,
        initial: vec![0.0; M],
    }
}

/// `client`'s update of `round` in `run`.
fn answer(client: &str, run: u64, round: u64) -> Vec<u8> {
    let c = client.as_bytes()[0] as f32 * 0.01;
    fedge_wire::encode(&Message::ClientUpdate(fedge_wire::ClientUpdate {
        features: None,
        run,
        round,
        client_id: client.into(),
        seq: round,
        num_samples: 3,
        delta: fedge_wire::TensorF32::from_slice(&[c, -c, round as f32 * 0.1, 0.0]),
        metrics: fedge_wire::LocalMetrics {
            val_accuracy: 0.5,
            val_samples: 10,
            ..Default::default()
        },
        class_stats: None,
        prototypes: None,
    }))
}

fn online(m: &mut Rounds, now: u64) {
    for c in ["a", "b"] {
        m.handle_client_status(c, true, now);
    }
}

/// A coordinator's life between restarts: the journal, the last checkpoint and the operator
/// settings it keeps, as the daemon keeps them in its state folder.
#[derive(Default)]
struct Kept {
    journal: Vec<Record>,
    checkpoint: Option<Checkpoint>,
    settings: Option<OperatorSettings>,
}

impl Kept {
    fn boot(&self, plan: &Plan) -> crate::boot::Booted {
        let start = Start {
            checkpoint: self.checkpoint.clone(),
            journal: log_of(&self.journal),
            settings: self.settings.clone(),
            ..Start::default()
        };
        plan.boot(start).expect("boots")
    }

    /// An operator command, kept before it is applied (as the driver does).
    fn command(&mut self, m: &mut Rounds, command: Command, seq: u64) {
        self.settings = Some(m.settings_after(&command, seq).expect("applicable"));
        m.try_control(&command, seq).expect("applied");
        keep(m, &mut self.journal, &mut self.checkpoint);
    }

    fn both_answer(&mut self, m: &mut Rounds, round: u64) {
        let run = m.config().run;
        for c in ["a", "b"] {
            m.handle_packet(c, &answer(c, run, round), round * 10);
        }
        keep(m, &mut self.journal, &mut self.checkpoint);
    }
}

#[test]
fn a_new_run_after_a_restart_never_takes_an_earlier_run_s_number() {
    let plan = plan(1);
    let mut kept = Kept::default();
    let mut m = kept.boot(&plan).rounds;
    online(&mut m, 0);
    kept.both_answer(&mut m, 1);
    assert_eq!(m.phase(), Phase::Finished);
    let first = m.config().run;
    kept.command(&mut m, Command::NewRun { rounds: 1 }, 1);
    let second = m.config().run;
    kept.both_answer(&mut m, 2);
    assert_eq!(m.phase(), Phase::Finished);
    // SIGTERM: started again from the state folder, then another run.
    let mut m = kept.boot(&plan).rounds;
    assert_eq!((m.config().run, m.phase()), (second, Phase::Finished));
    online(&mut m, 0);
    kept.command(&mut m, Command::NewRun { rounds: 1 }, 2);
    let third = m.config().run;
    assert!(
        third != first && third != second,
        "runs {first:016x}, {second:016x}, then {third:016x}"
    );
    let opened = match kept.journal.first() {
        Some(Record::Opened { run, round, .. }) => (*run, *round),
        other => panic!("run 3's first round is journaled: {other:?}"),
    };
    assert_eq!(opened, (third, 3));
    // The settings kept name the run that was started.
    assert_eq!(
        kept.settings.as_ref().and_then(|s| s.run.clone()),
        Some(format!("{third:016x}"))
    );
}

#[test]
fn a_kill_between_new_run_and_its_first_aggregation_resumes_the_new_run_s_round() {
    let plan = plan(1);
    let mut kept = Kept::default();
    let mut m = kept.boot(&plan).rounds;
    online(&mut m, 0);
    kept.both_answer(&mut m, 1);
    kept.command(&mut m, Command::NewRun { rounds: 2 }, 1);
    let run = m.config().run;
    // Round 2 of the new run opens; a's update is journaled, then kill -9.
    m.handle_packet("a", &answer("a", run, 2), 20);
    keep(&mut m, &mut kept.journal, &mut kept.checkpoint);
    assert_eq!(kept.checkpoint.as_ref().map(|c| c.run), Some(0x5eed));
    drop(m);

    let booted = kept.boot(&plan);
    assert_eq!(booted.restored, Some((2, 1)), "the journaled round resumes");
    assert_eq!(booted.ignored, None);
    let mut m = booted.rounds;
    assert_eq!(m.config().run, run, "the new run, not the checkpoint's");
    online(&mut m, 30);
    // a's update was kept; b's late update closes the round.
    m.handle_packet("b", &answer("b", run, 2), 40);
    assert_eq!(m.aggregated_rounds(), 2);
    assert!(m.rejected_total().is_empty(), "{:?}", m.rejected_total());
    // A resend of a's is a duplicate of a kept update, never a second count.
    m.handle_packet("a", &answer("a", run, 2), 41);
    assert_eq!(m.aggregated_rounds(), 2);
}

#[test]
fn a_restart_of_a_run_extended_by_set_rounds_keeps_its_journaled_round() {
    let plan = plan(2);
    let mut kept = Kept::default();
    let mut m = kept.boot(&plan).rounds;
    online(&mut m, 0);
    kept.both_answer(&mut m, 1);
    kept.command(&mut m, Command::SetRounds { rounds: 3 }, 1);
    kept.both_answer(&mut m, 2);
    let run = m.config().run;
    // Round 3, beyond the configuration's 2: a's update is journaled, then kill -9.
    m.handle_packet("a", &answer("a", run, 3), 30);
    keep(&mut m, &mut kept.journal, &mut kept.checkpoint);
    assert_eq!(
        kept.checkpoint.as_ref().map(|c| c.aggregated_rounds),
        Some(2)
    );
    drop(m);

    let booted = kept.boot(&plan);
    assert_eq!(booted.restored, Some((3, 1)), "not marked finished first");
    let mut m = booted.rounds;
    online(&mut m, 40);
    m.handle_packet("b", &answer("b", run, 3), 50);
    assert_eq!((m.aggregated_rounds(), m.phase()), (3, Phase::Finished));
    assert!(m.rejected_total().is_empty(), "{:?}", m.rejected_total());
}

#[test]
fn damaged_operator_settings_stop_the_boot_with_what_to_fix() {
    let kept = Kept {
        settings: Some(OperatorSettings {
            run: Some("xyz".into()),
            ..OperatorSettings::default()
        }),
        ..Kept::default()
    };
    let error = plan(1).boot(Start {
        settings: kept.settings.clone(),
        ..Start::default()
    });
    let message = error.err().expect("refused").to_string();
    assert!(
        message.contains("control.json") && message.contains("16 hex"),
        "{message}"
    );
}
