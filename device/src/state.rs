//! What a device remembers across restarts: the federation run and the last round it
//! answered, the runs it has left, its update sequence, how long its last training took, and,
//! with local DP, the accountant of the rounds it has sent (so its ε keeps counting: starting
//! from 0 after a restart would understate what its updates revealed).
//!
//! The state is kept as JSON ([`RoundState::to_json`]); the device daemon writes it to its
//! state file and reads it back at start. Deciding what to do with the state is the agent
//! machine's job, not this module's.

/// What a device remembers across restarts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RoundState {
    /// The federation run ([`fedge_wire::RoundTask::run`]) of the last task trained.
    pub run: u64,
    /// Runs the device answered before `run` (newest first, 0 = none): their tasks are stale.
    pub past_runs: [u64; PAST_RUNS],
    /// Last round the device trained and answered (in `run`).
    pub last_round: u64,
    /// Sequence number of its last update.
    pub seq: u64,
    /// Seconds its last local training took.
    pub last_train_seconds: f32,
    /// Local DP: every round whose privatised update was sent, composed (absent in files
    /// written before local DP, or by a device that never had it on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accountant: Option<fedge_privacy::Accountant>,
    /// The number of the last serving pointer taken (`fedge_wire::ServingPointer::seq`): after
    /// a restart no pointer numbered at or below it moves the device, so a captured one
    /// replayed to it cannot send it back (0 in files written before pointers).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub serving_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How many left runs a device remembers.
pub const PAST_RUNS: usize = 8;

impl RoundState {
    /// Whether a task of `run` and `round` is newer than everything answered: a later round of
    /// the same run, or a run never seen (a coordinator that started afresh). An earlier
    /// round, or a run the device has left, is a replayed task.
    pub fn is_fresh(&self, run: u64, round: u64) -> bool {
        if run == self.run {
            round > self.last_round
        } else {
            !self.past_runs.contains(&run)
        }
    }

    /// Whether a task of `run` and `round` is older than what was answered (an earlier round of
    /// the same run, or a left run): a replay, as opposed to a task delivered twice.
    pub fn is_stale(&self, run: u64, round: u64) -> bool {
        (run == self.run && round < self.last_round) || (run != 0 && self.past_runs.contains(&run))
    }

    /// Records that a task of `run` and `round` is being answered.
    pub fn answer(&mut self, run: u64, round: u64) {
        if run != self.run {
            if self.run != 0 {
                self.past_runs.rotate_right(1);
                self.past_runs[0] = self.run;
            }
            self.run = run;
        }
        self.last_round = round;
    }

    /// The state read back from its JSON form; a file written before a field existed reads
    /// with that field's default.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The JSON form the device keeps in its state file.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_form_reads_back_and_older_files_read_with_defaults() {
        let state = RoundState {
            run: 3,
            past_runs: [1, 2, 0, 0, 0, 0, 0, 0],
            last_round: 7,
            seq: 9,
            last_train_seconds: 1.5,
            accountant: None,
            serving_seq: 1_764_115_200_000,
        };
        assert_eq!(RoundState::from_json(&state.to_json()).unwrap(), state);
        // A file of the previous format (no accountant) reads as before.
        let old = RoundState::from_json(br#"{"run":3,"last_round":7,"seq":9}"#).unwrap();
        assert_eq!(
            (old.run, old.last_round, old.seq, old.accountant),
            (3, 7, 9, None)
        );
        // With local DP the accountant comes back, and its ε with it.
        let mut accountant = fedge_privacy::Accountant::default();
        accountant.compose_poisson(1.0, 1.3, 4).unwrap();
        let spent = RoundState {
            accountant: Some(accountant.clone()),
            ..state
        };
        let back = RoundState::from_json(&spent.to_json())
            .unwrap()
            .accountant
            .unwrap();
        assert_eq!(back.history(), accountant.history());
        let (a, b) = (
            back.epsilon(1e-5).unwrap().epsilon,
            accountant.epsilon(1e-5).unwrap().epsilon,
        );
        assert!((a - b).abs() <= 1e-12 * b, "{a} {b}");
        assert!(RoundState::from_json(b"{not json").is_err());
    }

    #[test]
    fn tasks_of_left_runs_and_earlier_rounds_are_stale() {
        let mut state = RoundState::default();
        assert!(state.is_fresh(11, 1));
        state.answer(11, 5);
        assert!(state.is_fresh(11, 6) && !state.is_fresh(11, 5) && !state.is_fresh(11, 4));
        assert!(state.is_stale(11, 4) && !state.is_stale(11, 5));
        // A coordinator started afresh: a new run, from round 1.
        assert!(state.is_fresh(22, 1));
        state.answer(22, 1);
        assert_eq!((state.run, state.past_runs[0]), (22, 11));
        // The old run's tasks are replays now, whatever their round.
        assert!(!state.is_fresh(11, 99) && state.is_stale(11, 99));
    }
}
