//! The open round's bookkeeping: who was selected, the updates accepted so far (with the
//! objectives' statistics and the clients' metrics), the deadline, the task sent and the
//! round's rejections. A plain record the machine fills; it decides nothing.

use std::collections::{BTreeMap, BTreeSet};

use fedge_wire::FeatureSummary;

use crate::objectives::ClientStats;
use crate::strategy::Failure;
use crate::updates::RoundUpdates;

/// The round open now.
pub(super) struct OpenRound {
    pub(super) round: u64,
    pub(super) selected: BTreeSet<String>,
    pub(super) accepted: RoundUpdates,
    pub(super) failures: Vec<Failure>,
    /// Selected clients that said they cannot train this round (their status's `declined`).
    pub(super) declined: BTreeSet<String>,
    /// Selected clients that went offline without reporting (their Last Will).
    pub(super) gone: BTreeSet<String>,
    /// FedDIM class statistics by client: counts and `[K, H]` means.
    pub(super) class_stats: ClientStats,
    /// FedDDL local prototypes by client: counts and `[K, H]` means.
    pub(super) prototypes: ClientStats,
    /// Whether the round's task pools features: updates must carry a summary.
    pub(super) pools: bool,
    /// The pooled summary the round's task carried (as sent): what its devices standardised
    /// with, so what the release of its aggregate carries.
    pub(super) pool: Option<FeatureSummary>,
    /// Feature summaries by client, when the round pools.
    pub(super) features: BTreeMap<String, FeatureSummary>,
    pub(super) val: Vec<(f32, u32)>,
    pub(super) loss: Vec<(f32, u32)>,
    /// The longest local training an accepted update reports, in seconds.
    pub(super) train_seconds: f32,
    pub(super) opened_ms: u64,
    pub(super) deadline_ms: u64,
    pub(super) extended: bool,
    pub(super) task_frame: Vec<u8>,
    pub(super) bytes_up: u64,
    pub(super) rejected: BTreeMap<&'static str, u64>,
    /// Buffered mode: each accepted update's staleness (versions behind this round).
    pub(super) staleness: BTreeMap<String, u64>,
    /// Buffered mode: the task as sent, re-sealed when more devices are given it.
    pub(super) task: Option<fedge_wire::RoundTask>,
}

impl OpenRound {
    /// A round just opened with `selected` clients, its deltas held in `accepted`.
    pub(super) fn new(
        round: u64,
        selected: Vec<String>,
        accepted: RoundUpdates,
        (opened_ms, deadline_ms): (u64, u64),
        task_frame: Vec<u8>,
    ) -> Self {
        Self {
            round,
            accepted,
            failures: Vec::new(),
            declined: BTreeSet::new(),
            gone: BTreeSet::new(),
            class_stats: BTreeMap::new(),
            prototypes: BTreeMap::new(),
            pools: false,
            pool: None,
            features: BTreeMap::new(),
            selected: selected.into_iter().collect(),
            val: Vec::new(),
            loss: Vec::new(),
            train_seconds: 0.0,
            opened_ms,
            deadline_ms,
            extended: false,
            task_frame,
            bytes_up: 0,
            rejected: BTreeMap::new(),
            staleness: BTreeMap::new(),
            task: None,
        }
    }

    /// The accepted updates' feature summaries as one, merged robustly
    /// ([`FeatureSummary::robust_merge`]: classes of at least three devices, clipped around the devices' medians), if
    /// any class has enough devices.
    pub(super) fn merged_features(&self) -> Option<FeatureSummary> {
        let accepted = (0..self.accepted.len()).map(|i| self.accepted.client(i));
        let parts: Vec<&FeatureSummary> = accepted.filter_map(|c| self.features.get(c)).collect();
        FeatureSummary::robust_merge(&parts)
    }

    /// `client` declined the round: true when that is news (it was selected, has not reported
    /// and had not declined), then counted as its failure `declined`.
    pub(super) fn decline(&mut self, client: &str) -> bool {
        if !self.selected.contains(client)
            || self.accepted.contains(client)
            || !self.declined.insert(client.to_owned())
        {
            return false;
        }
        match self.failures.iter_mut().find(|f| f.client == client) {
            Some(failure) => "declined".clone_into(&mut failure.reason),
            None => self.failures.push(Failure {
                client: client.to_owned(),
                reason: "declined".to_owned(),
            }),
        }
        self.gone.remove(client);
        true
    }

    /// `client` went offline (its Last Will) or came back: a selected device gone without
    /// reporting is its failure `offline`, and not waited for once a quorum is in. True when
    /// that changed what the round waits for.
    pub(super) fn set_gone(&mut self, client: &str, gone: bool) -> bool {
        if !gone {
            self.failures
                .retain(|f| !(f.client == client && f.reason == "offline"));
            return self.gone.remove(client);
        }
        if !self.selected.contains(client)
            || self.accepted.contains(client)
            || self.declined.contains(client)
            || !self.gone.insert(client.to_owned())
        {
            return false;
        }
        if !self.failures.iter().any(|f| f.client == client) {
            self.failures.push(Failure {
                client: client.to_owned(),
                reason: "offline".to_owned(),
            });
        }
        true
    }

    /// Whether nothing is left to wait for: every selected client reported, declined, or went
    /// offline — the last only once `quorum` updates are in (else the round waits for its
    /// deadline, for a device to come back with its update).
    pub(super) fn all_answered(&self, quorum: usize) -> bool {
        let gone = (self.gone.iter())
            .filter(|c| !self.accepted.contains(c))
            .count();
        let answered = self.accepted.len() + self.declined.len() + gone;
        answered >= self.selected.len() && (gone == 0 || self.accepted.len() >= quorum)
    }

    /// Counts a rejection in this round, and as the client's failure when it was selected (one
    /// failure per client, with its latest reason, however many messages were rejected).
    pub(super) fn count_rejection(&mut self, client: &str, reason: &'static str) {
        *self.rejected.entry(reason).or_default() += 1;
        if !self.selected.contains(client) {
            return;
        }
        match self.failures.iter_mut().find(|f| f.client == client) {
            Some(failure) => reason.clone_into(&mut failure.reason),
            None => self.failures.push(Failure {
                client: client.to_owned(),
                reason: reason.to_owned(),
            }),
        }
    }
}

/// The sample-weighted mean of `(value, samples)` pairs; `None` without samples.
pub(super) fn weighted_mean(values: &[(f32, u32)]) -> Option<f32> {
    let total: f64 = values.iter().map(|(_, n)| *n as f64).sum();
    (total > 0.0).then(|| {
        (values
            .iter()
            .map(|(v, n)| *v as f64 * *n as f64)
            .sum::<f64>()
            / total) as f32
    })
}
