//! A simulated coordinator: the real round machine (`fedge_coordinator::Rounds`), global or a
//! site aggregator in relay mode, with what a restart reads back (the checkpoint and the
//! journal, kept as the bytes the daemon writes to its state folder).

use fedge_coordinator::Rounds;
use fedge_coordinator::boot::{Plan, Start};
use fedge_coordinator::store::{checkpoint, journal};
use fedge_wire::{DeviceKey, Reassembler, Topics};
use rand::RngCore;
use rand::rngs::StdRng;

use crate::broker::Message;
use crate::error::SimError;

/// What a simulated coordinator is.
#[derive(Debug, Clone)]
pub struct CoordinatorSpec {
    /// Its round machine, made as the daemon makes it (`round.journal` is turned on: a
    /// restart reads the journal back).
    pub plan: Plan,
    /// A site aggregator's link to the global federation (with `plan.round.relay` set).
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
    /// Serving pointers published so far (their numbers, as the driver's wall clock would
    /// keep them growing across a crash).
    pub(crate) pointers: u64,
}

impl CoordinatorNode {
    pub(crate) fn new(mut spec: CoordinatorSpec) -> Result<Self, fedge_wire::DecodeError> {
        spec.plan.round.journal = true;
        let topics = Topics::new(&spec.plan.round.federation)?;
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
            pointers: 0,
            tasks: reassembler(),
            models: reassembler(),
            lives: 0,
        })
    }

    /// Starts (or restarts) the machine as the daemon does: from the checkpoint when there is
    /// one (else fresh, with a new run after a restart), the open round from the journal.
    pub(crate) fn boot(&mut self, now_ms: u64, rng: &mut StdRng) -> Result<(), SimError> {
        let mut plan = self.spec.plan.clone();
        // The daemon draws a fresh federation's run at every start.
        if self.lives > 0 {
            plan.round.run = rng.next_u64();
        }
        let start = Start {
            checkpoint: (self.checkpoint.as_deref()).and_then(|b| checkpoint::decode(b).ok()),
            journal: journal::parse(&self.journal).0,
            now_ms,
            ..Start::default()
        };
        self.rounds = Some(plan.boot(start)?.rounds);
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
