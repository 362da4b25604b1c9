//! A machine from its checkpoint and back: [`Rounds::resume`] checks a saved state against the
//! configuration (federation, strategy, head, the objectives' tensors, the accountant, the
//! pooled summary) before continuing from it; [`Rounds::checkpoint`] is the state to save after
//! an aggregation.

use super::saved::Checkpoint;
use super::{Output, Phase, RoundConfig, Rounds};
use crate::strategy::{StateError, Strategy};

/// A checkpoint that does not belong to this machine's configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResumeError {
    /// Written by another federation.
    #[error("the checkpoint belongs to federation {saved:?}, this configuration names {running:?}")]
    Federation {
        /// The checkpoint's federation.
        saved: String,
        /// The configured federation.
        running: String,
    },
    /// Written by another strategy.
    #[error("the checkpoint was written by strategy {saved:?}, this coordinator runs {running:?}")]
    Strategy {
        /// The checkpoint's strategy.
        saved: String,
        /// This coordinator's strategy.
        running: String,
    },
    /// Another head size.
    #[error("the checkpoint holds {saved} parameters, the configured head has {expected}")]
    Params {
        /// Parameters in the checkpoint.
        saved: usize,
        /// Parameters of the configured head.
        expected: usize,
    },
    /// The strategy's buffers do not fit it.
    #[error(transparent)]
    State(#[from] StateError),
    /// FedDIM's `Ī` of another shape, or without FedDIM configured.
    #[error("the checkpoint holds {0} insight values, which do not fit this configuration")]
    Insight(usize),
    /// FedDDL's `U_G` of another shape, or without FedDDL configured.
    #[error("the checkpoint holds {0} prototype values, which do not fit this configuration")]
    Prototypes(usize),
    /// The privacy accountant cannot continue under this configuration.
    #[error("{0}")]
    Privacy(String),
    /// The pooled feature summary does not fit the configured head.
    #[error("the checkpoint's pooled feature statistics: {0}")]
    Pooled(String),
}

impl Rounds {
    /// A machine continuing from a checkpoint: its parameters, run, next round and strategy
    /// buffers. Errors when the checkpoint belongs to another federation, strategy or head
    /// size, or holds values that are not finite.
    pub fn resume(
        mut config: RoundConfig,
        mut strategy: Box<dyn Strategy>,
        checkpoint: Checkpoint,
        expected_params: usize,
    ) -> Result<Self, ResumeError> {
        if checkpoint.federation != config.federation {
            return Err(ResumeError::Federation {
                saved: checkpoint.federation,
                running: config.federation,
            });
        }
        config.run = checkpoint.run;
        if checkpoint.strategy != strategy.name() {
            return Err(ResumeError::Strategy {
                saved: checkpoint.strategy,
                running: strategy.name().to_owned(),
            });
        }
        if checkpoint.params.len() != expected_params {
            return Err(ResumeError::Params {
                saved: checkpoint.params.len(),
                expected: expected_params,
            });
        }
        strategy.restore(&checkpoint.strategy_state)?;
        let mut rounds = Self::new(config, strategy, Vec::new());
        rounds.restore_privacy(checkpoint.privacy)?;
        rounds.restore_participation(checkpoint.participation);
        if !checkpoint.insight.is_empty() {
            match rounds.insight.as_mut() {
                Some(insight) if insight.fits(&checkpoint.insight) => {
                    insight.restore(checkpoint.insight);
                }
                _ => return Err(ResumeError::Insight(checkpoint.insight.len())),
            }
        }
        if !checkpoint.prototypes.is_empty() {
            match rounds.prototypes.as_mut() {
                Some(prototypes) if prototypes.fits(&checkpoint.prototypes) => {
                    prototypes.restore(checkpoint.prototypes);
                }
                _ => return Err(ResumeError::Prototypes(checkpoint.prototypes.len())),
            }
        }
        rounds.restore_pooled(checkpoint.pooled)?;
        rounds.in_flight = crate::buffer::InFlight::restored(checkpoint.in_flight, 0);
        rounds.contributed = checkpoint.contributed.into_iter().collect();
        rounds.params = checkpoint.params;
        rounds.next_round = checkpoint.next_round.max(1);
        rounds.last_closed = rounds.next_round - 1;
        rounds.aggregated_rounds = checkpoint.aggregated_rounds;
        if rounds.config.rounds > 0 && rounds.aggregated_rounds >= rounds.config.rounds {
            rounds.phase = Phase::Finished;
            rounds.outputs.push_back(Output::StatusChanged);
            rounds.outputs.push_back(Output::Finished);
        }
        Ok(rounds)
    }

    /// The state to save after an aggregation.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            federation: self.config.federation.clone(),
            run: self.config.run,
            strategy: self.strategy.name().to_owned(),
            // The round opened after the last close is redone after a restart.
            next_round: self.last_closed + 1,
            aggregated_rounds: self.aggregated_rounds,
            params: self.params.clone(),
            strategy_state: self.strategy.state(),
            insight: self.insight().map(<[f32]>::to_vec).unwrap_or_default(),
            prototypes: self.prototypes().map(<[f32]>::to_vec).unwrap_or_default(),
            privacy: self.saved_privacy(),
            participation: self.saved_participation(),
            pooled: self.pooled.clone(),
            in_flight: self.in_flight.saved(self.last_closed + 1),
            contributed: (self.contributed.iter())
                .filter(|(_, v)| **v <= self.last_closed)
                .map(|(c, v)| (c.clone(), *v))
                .collect(),
        }
    }
}
