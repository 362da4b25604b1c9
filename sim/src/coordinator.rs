//! A simulated coordinator: the real round machine (`fedge_coordinator::Rounds`), global or a
//! site aggregator in relay mode, with what a restart reads back (the checkpoint and the
//! journal, kept as the bytes the daemon writes to its state folder).

use std::sync::Arc;

use fedge_coordinator::round::OpenRoundLog;
use fedge_coordinator::store::{checkpoint, journal};
use fedge_coordinator::{RoundConfig, Rounds, Strategy};
use fedge_wire::{DeviceKey, Reassembler, Topics};
use rand::RngCore;
use rand::rngs::StdRng;

use crate::broker::Message;
use crate::error::SimError;

/// Builds the strategy a coordinator runs (at its first start and at every restart).
pub type StrategyFactory = Arc<dyn Fn() -> Result<Box<dyn Strategy>, String> + Send + Sync>;

/// What a simulated coordinator is.
#[derive(Clone)]
pub struct CoordinatorSpec {
    /// The round machine's settings (`journal` is turned on: a restart reads it back).
    pub config: RoundConfig,
    /// Its strategy, built the same way at every start.
    pub strategy: StrategyFactory,
    /// The initial parameters of a fresh federation.
    pub initial: Vec<f32>,
    /// A site aggregator's link to the global federation (with `config.relay` set).
    pub upstream: Option<Upstream>,
}

/// A site aggregator's side of the global federation.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The global federation's name.
    pub federation: String,
    /// The site's key in the global federation.
    pub key: Option<DeviceKey>,
}

/// A coordinator in the simulation.
pub(crate) struct CoordinatorNode {
    pub(crate) spec: CoordinatorSpec,
    /// The running machine; none while crashed.
    pub(crate) rounds: Option<Rounds>,
    pub(crate) topics: Topics,
    pub(crate) upstream_topics: Option<Topics>,
    /// `state_dir/checkpoint.bin`, written after every aggregation.
    pub(crate) checkpoint: Option<Vec<u8>>,
    /// `state_dir/journal.bin`.
    pub(crate) journal: Vec<u8>,
    pub(crate) online: bool,
    pub(crate) inbox: Vec<Message>,
    pub(crate) finished: bool,
    /// A site's reassemblers of the global task and release.
    pub(crate) tasks: Reassembler,
    pub(crate) models: Reassembler,
    /// Starts so far.
    pub(crate) lives: u64,
}

impl CoordinatorNode {
    pub(crate) fn new(mut spec: CoordinatorSpec) -> Result<Self, fedge_wire::DecodeError> {
        spec.config.journal = true;
        let topics = Topics::new(&spec.config.federation)?;
        let upstream_topics = match &spec.upstream {
            Some(up) => Some(Topics::new(&up.federation)?),
            None => None,
        };
        let reassembler = || {
            Reassembler::new(
                fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
                fedge_wire::MAX_MESSAGE_BYTES,
            )
        };
        Ok(Self {
            spec,
            rounds: None,
            topics,
            upstream_topics,
            checkpoint: None,
            journal: Vec::new(),
            online: false,
            inbox: Vec::new(),
            finished: false,
            tasks: reassembler(),
            models: reassembler(),
            lives: 0,
        })
    }

    /// Starts (or restarts) the machine as the daemon does: from the checkpoint when there is
    /// one (else fresh, with a new run after a restart), the open round from the journal.
    pub(crate) fn boot(&mut self, now_ms: u64, rng: &mut StdRng) -> Result<(), SimError> {
        let mut config = self.spec.config.clone();
        let strategy = (self.spec.strategy)().map_err(SimError::Strategy)?;
        let saved = (self.checkpoint.as_deref()).and_then(|b| checkpoint::decode(b).ok());
        let mut rounds = match saved {
            Some(saved) => Rounds::resume(config, strategy, saved, self.spec.initial.len())?,
            None => {
                // The daemon draws a fresh federation's run at every start.
                if self.lives > 0 {
                    config.run = rng.next_u64();
                }
                Rounds::new(config, strategy, self.spec.initial.clone())
            }
        };
        let (log, _) = journal::parse(&self.journal);
        restore(&mut rounds, log, now_ms);
        rounds.start(now_ms);
        self.rounds = Some(rounds);
        self.lives += 1;
        Ok(())
    }

    /// Keeps a journal record as the journal file would: `Opened` starts it afresh.
    pub(crate) fn write_journal(&mut self, record: &fedge_coordinator::round::Record) {
        let bytes = journal::encode(record);
        if let fedge_coordinator::round::Record::Opened { .. } = record {
            self.journal = bytes;
        } else {
            self.journal.extend_from_slice(&bytes);
        }
    }
}

/// The open round a journal holds, restored as `fedge-coordinator run` does.
fn restore(rounds: &mut Rounds, log: OpenRoundLog, now_ms: u64) {
    if rounds.is_site() {
        rounds.defer_restore(log);
    } else {
        rounds.restore_round(log, now_ms);
    }
}
