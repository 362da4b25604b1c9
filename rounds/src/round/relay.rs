//! A site aggregator's rounds (`RoundConfig::relay`): the machine opens a round only when the
//! global federation's task names the site, re-issues that task (its parameters, training
//! settings and global tensors) to the site's devices under the site's own federation, run and
//! keys, aggregates their updates with the site's strategy, guards and rules like any round,
//! and hands the result upstream as one update ([`Output::Upstream`]): the aggregate's delta
//! from the global parameters, weighted by the samples the site's accepted devices trained on,
//! with their FedDDL prototypes merged by count (docs/algorithms.md §4, the global
//! coordinator's own formula). No I/O, like the rest of the machine.

use fedge_wire::TensorF32;
use fedge_wire::{ClassStats, ClientUpdate, LocalMetrics, ModelRelease, Objective, RoundTask};

use super::open::{OpenRound, weighted_mean};
use super::saved::OpenRoundLog;
use super::types::{Output, RelayError, Relayed};
use super::{Phase, Rounds};
use crate::objectives::fedddl::{PrototypeConfig, average_prototypes};

impl Rounds {
    /// Whether this machine is a site aggregator.
    pub fn is_site(&self) -> bool {
        self.config.relay.is_some()
    }

    /// A site aggregator keeps the round a journal says was open until the global task it
    /// answered arrives again (its parameters are the round's base); then it is restored as
    /// [`Rounds::restore_round`] restores one.
    pub fn defer_restore(&mut self, log: OpenRoundLog) {
        self.deferred_log = log.opened.is_some().then_some(log);
    }

    /// The global federation's task for this site (already opened with the site's key, if it
    /// has one). A task the site answered already, or whose round is open, changes nothing;
    /// a newer one closes the open round first (its update will be stale upstream). Then the
    /// site's round opens now if enough devices are online, else when they come, within the
    /// global round's time. `Ok(false)`: nothing to do. Without `RoundConfig::relay` nothing
    /// happens.
    pub fn relay_task(&mut self, task: RoundTask, now_ms: u64) -> Result<bool, RelayError> {
        let Some(margin_ms) = self.config.relay.as_ref().map(|r| r.margin_ms) else {
            return Ok(false);
        };
        if task.round < self.next_round || self.open.as_ref().is_some_and(|o| o.round == task.round)
        {
            return Ok(false);
        }
        if task.params.len() != self.params.len() {
            return Err(RelayError::Params {
                got: task.params.len(),
                expected: self.params.len(),
            });
        }
        match task.train.objective {
            Objective::FedDim => return Err(RelayError::FedDim),
            Objective::FedDdl if self.prototypes.is_none() => {
                return Err(RelayError::Objective(Objective::FedDdl));
            }
            _ => {}
        }
        if self.open.is_some() {
            self.close_round(now_ms);
        }
        let deadline = task.deadline_ms;
        // A global coordinator aggregating buffered gives no deadline: the site's round takes
        // its own `round_timeout_ms`, and its update counts with its staleness upstream.
        let budget = match deadline {
            0 => self.config.round_timeout_ms,
            _ => deadline
                .saturating_sub(margin_ms)
                .max(deadline / 2)
                .min(self.config.round_timeout_ms),
        };
        self.params = task.params.to_vec();
        self.relayed = Some(Relayed {
            round: task.round,
            run: task.run,
            train: task.train,
            insight: task.insight,
            prototypes: task.prototypes,
            pooled: task.pooled,
            received_ms: now_ms,
            budget_ms: budget,
        });
        self.phase = Phase::Waiting;
        if let Some(log) = self.deferred_log.take()
            && log.opened.as_ref().is_some_and(|o| o.round == task.round)
            && self.restore_round(log, now_ms).is_some()
        {
            return Ok(true);
        }
        self.try_start(now_ms);
        Ok(true)
    }

    /// The global model released upstream, for the site's devices: the same head, round and
    /// digest, under the site's federation and run (a device believes releases of its own
    /// federation). Without `RoundConfig::relay` nothing happens.
    pub fn relay_release(&mut self, release: ModelRelease) {
        if self.config.relay.is_none() {
            return;
        }
        let release = ModelRelease {
            federation: self.config.federation.clone(),
            run: self.config.run,
            ..release
        };
        self.outputs.push_back(Output::Release(Box::new(release)));
    }

    /// The global federation's serving pointer, for the site's devices: what the site is to
    /// serve (the release named for it, as a participant, during a canary stage) becomes a
    /// pointer of the site's federation to every one of its devices; a canary stage the site
    /// is not in changes nothing (its devices keep the release before). Numbered by the
    /// site's driver. Without `RoundConfig::relay` nothing happens.
    pub fn relay_serving(&mut self, pointer: &fedge_wire::ServingPointer) {
        let Some(relay) = &self.config.relay else {
            return;
        };
        if pointer.release_for(&relay.site) != pointer.sha256 {
            return;
        }
        self.outputs
            .push_back(Output::Serving(fedge_wire::ServingPointer {
                federation: self.config.federation.clone(),
                seq: 0,
                sha256: pointer.sha256.clone(),
                round: pointer.round,
                stage: fedge_wire::Stage::All,
                canary: Vec::new(),
                previous: None,
                pinned: pointer.pinned,
            }));
    }

    /// For a site: whether its next round may open now (a global task it has not answered).
    pub(super) fn relay_due(&self) -> Option<u64> {
        self.relayed
            .as_ref()
            .filter(|r| r.round >= self.next_round)
            .map(|r| r.round)
    }

    /// For a site's round opening at `now_ms`: the time left of the global round's share.
    pub(super) fn relay_timeout(&self, now_ms: u64) -> Option<u64> {
        let r = self.relayed.as_ref()?;
        let end = r.received_ms + r.budget_ms;
        Some(end.saturating_sub(now_ms).max(1))
    }

    /// The site's answer to the global round, once `open` aggregated into `self.params` from
    /// `before` (the global parameters).
    pub(super) fn push_upstream(&mut self, open: &OpenRound, before: &[f32]) {
        let (Some(relay), Some(relayed)) = (&self.config.relay, &self.relayed) else {
            return;
        };
        let codec = relayed.train.update_codec;
        let delta: Vec<f32> = self.params.iter().zip(before).map(|(a, b)| a - b).collect();
        let samples = open.accepted.total_samples();
        let val_samples: u64 = open.val.iter().map(|(_, n)| u64::from(*n)).sum();
        let update = ClientUpdate {
            run: relayed.run,
            round: relayed.round,
            client_id: relay.site.clone(),
            seq: relayed.round,
            num_samples: samples.min(f64::from(u32::MAX)) as u32,
            delta: TensorF32::from_slice_with(&delta, codec),
            metrics: LocalMetrics {
                train_loss: weighted_mean(&open.loss).unwrap_or(0.0),
                val_accuracy: weighted_mean(&open.val).unwrap_or(0.0),
                val_samples: u32::try_from(val_samples).unwrap_or(u32::MAX),
                train_seconds: open.train_seconds,
            },
            class_stats: None,
            prototypes: self.merged_prototypes(open, codec),
            features: open.merged_features(),
        };
        self.outputs.push_back(Output::Upstream(Box::new(update)));
    }

    /// The accepted devices' prototypes as one participant's: per class the summed count and
    /// the count-weighted mean.
    fn merged_prototypes(&self, open: &OpenRound, codec: fedge_wire::Codec) -> Option<ClassStats> {
        let config: PrototypeConfig = self.config.prototypes?;
        let clients: Vec<(&[u32], &[f32])> = (0..open.accepted.len())
            .filter_map(|i| open.prototypes.get(open.accepted.client(i)))
            .map(|(counts, means)| (counts.as_slice(), means.as_slice()))
            .collect();
        if clients.is_empty() {
            return None;
        }
        let means = average_prototypes(None, &clients, &config);
        let counts = (0..config.classes)
            .map(|k| {
                let n: u64 = clients
                    .iter()
                    .map(|(c, _)| u64::from(c.get(k).copied().unwrap_or(0)))
                    .sum();
                u32::try_from(n).unwrap_or(u32::MAX)
            })
            .collect();
        Some(ClassStats {
            counts,
            means: TensorF32::from_slice_with(&means, codec),
        })
    }
}
