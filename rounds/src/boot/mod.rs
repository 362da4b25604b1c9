//! The one way a coordinator's round machine is made: `fedge-coordinator run`, `fedge demo`
//! (global and site aggregators) and the simulator (`fedge-sim`) all start from a [`Plan`].
//!
//! A plan holds the round settings and the strategy's settings together, and builds the
//! strategy with the round's own central DP settings, so the two cannot disagree (central DP
//! divides by the expected count the round machine draws with). Booting a plan starts a fresh
//! federation, or resumes one from its checkpoint and the open round its journal holds, as a
//! restarted daemon does.

use fedge_privacy::GaussianNoise;

use crate::release::ReleaseConfig;
use crate::round::{Checkpoint, OpenRoundLog, OperatorSettings, ResumeError, RoundConfig, Rounds};
use crate::strategy::{BuildError, Strategy, StrategyConfig};
use crate::updates::spill::SpillFile;

/// What a coordinator's round machine is made of.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The round settings (their `privacy` is also the strategy's).
    pub round: RoundConfig,
    /// The strategy's settings.
    pub strategy: StrategyConfig,
    /// Central DP's noise seed (tests and simulations); none draws it from the operating
    /// system.
    pub noise_seed: Option<u64>,
    /// The parameters a fresh federation starts from.
    pub initial: Vec<f32>,
}

/// A plan could not start.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The strategy cannot be built with these settings.
    #[error(transparent)]
    Strategy(#[from] BuildError),
    /// The checkpoint does not fit the plan.
    #[error(
        "cannot resume from the checkpoint: {0}; move the state directory away to start afresh"
    )]
    Resume(#[from] ResumeError),
    /// The operator settings kept across a restart cannot be put back.
    #[error(
        "the operator settings kept in state_dir/control.json: {0}; fix the file, or remove it \
         to go back to the configuration's settings"
    )]
    Settings(String),
}

/// What a machine starts from besides its plan: a daemon's state folder (the checkpoint, the
/// journal's open round, the spill file) and the time. The default is a fresh start at 0.
#[derive(Default)]
pub struct Start {
    /// The last checkpoint, if any.
    pub checkpoint: Option<Checkpoint>,
    /// The journal's open round, if any.
    pub journal: OpenRoundLog,
    /// The file rounds that outgrow `update_memory_bytes` spill to (given before the journal's
    /// round is restored, so that it spills too).
    pub spill: Option<SpillFile>,
    /// The release gate's settings (the default releases every round at once).
    pub release: Option<ReleaseConfig>,
    /// What the operator's commands set before the restart (`control.json`): put back before
    /// the journal's round, which may belong to a run `new-run` started or `set-rounds`
    /// extended after the checkpoint.
    pub settings: Option<OperatorSettings>,
    /// The driver's time.
    pub now_ms: u64,
}

/// A started machine and what it started from.
pub struct Booted {
    /// The machine, started.
    pub rounds: Rounds,
    /// The checkpoint's next round, when it resumed from one.
    pub resumed: Option<u64>,
    /// The journal's open round and the updates it holds, when it was restored.
    pub restored: Option<(u64, usize)>,
    /// The journal's round when the journal was there but not restored, and why (an earlier
    /// round, other parameters, another run, or central DP, which draws a fresh round).
    pub ignored: Option<(u64, &'static str)>,
}

impl Plan {
    /// The strategy, with the round's central DP settings when it has them.
    pub fn strategy(&self) -> Result<Box<dyn Strategy>, BuildError> {
        let noise = || match self.noise_seed {
            Some(seed) => GaussianNoise::from_seed(seed),
            None => GaussianNoise::from_os_rng(),
        };
        self.strategy
            .build_with(self.round.privacy.map(|dp| (dp, noise())))
    }

    /// Starts the machine: from the checkpoint when there is one, else fresh from the initial
    /// parameters; with the spill file, the release settings and the operator's settings; then
    /// the open round the journal holds (a site
    /// aggregator keeps it until its global task comes again); then `start`.
    pub fn boot(&self, from: Start) -> Result<Booted, BootError> {
        let Start {
            checkpoint,
            journal,
            spill,
            release,
            settings,
            now_ms,
        } = from;
        let strategy = self.strategy()?;
        let config = self.round.clone();
        let (mut rounds, resumed) = match checkpoint {
            Some(saved) => {
                let next = saved.next_round;
                let rounds = Rounds::resume(config, strategy, saved, self.initial.len())?;
                (rounds, Some(next))
            }
            None => (Rounds::new(config, strategy, self.initial.clone()), None),
        };
        if let Some(file) = spill {
            rounds.set_spill(file);
        }
        if let Some(release) = release {
            rounds.set_release_config(release);
        }
        if let Some(settings) = &settings {
            (rounds.restore_operator_settings(settings)).map_err(BootError::Settings)?;
        }
        let logged = (journal.opened.as_ref())
            .map(|o| (o.round, rounds.journal_misfit(o).unwrap_or_default()));
        let restored = match rounds.is_site() {
            true => {
                rounds.defer_restore(journal);
                None
            }
            false => rounds.restore_round(journal, now_ms),
        };
        rounds.start(now_ms);
        let ignored = logged.filter(|_| restored.is_none() && !rounds.is_site());
        Ok(Booted {
            rounds,
            resumed,
            restored,
            ignored,
        })
    }
}

#[cfg(test)]
mod tests;
