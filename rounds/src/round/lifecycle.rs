//! Opening and closing rounds: sampling the clients, the task (with its tags and the
//! objectives' global tensors), the journal's `Opened` record; at the close, the norm guard,
//! the aggregation, the objectives' folding and the round's report; and the bookkeeping of a
//! rejection. Called by the machine's inputs in `mod.rs` and never calls back into them; no I/O.

use std::collections::BTreeMap;

use fedge_wire::{BackboneRef, DeviceKey, Message, RoundTask, TensorF32};
use rand::seq::IteratorRandom;

use super::open::{OpenRound, weighted_mean};
use super::saved::{Record, params_fingerprint};
use super::types::{NormClip, Output, Phase, Rejection, RoundReport};
use super::{Rounds, guard};
use crate::objectives::fedddl::GlobalPrototypes;
use crate::objectives::feddim::GlobalInsight;
use crate::strategy::{Failure, SamplingKind};
use crate::updates::norms::{l2_norm, norms};
use crate::updates::{RoundUpdates, UpdatesConfig};

impl Rounds {
    pub(super) fn try_start(&mut self, now_ms: u64) {
        self.control.clock_ms = self.control.clock_ms.max(now_ms);
        // A site opens a round only to answer a global task, numbered as it is.
        if self.config.relay.is_some() {
            match self.relay_due() {
                Some(round) if self.open.is_none() => self.next_round = round,
                _ => return,
            }
        }
        if self.control.paused {
            return;
        }
        // Buffered: `min_clients` gates the first version; after it a version is always open,
        // so that an update arriving while few devices are online still finds one.
        let started = self.buffered() && self.next_round > 1;
        if started || self.eligible().len() >= self.config.min_clients.max(1) {
            self.open_round(now_ms);
        }
    }

    fn open_round(&mut self, now_ms: u64) {
        if self.buffered() {
            let picks = self.buffer_picks(self.next_round, now_ms);
            self.open_with(picks, now_ms);
            return;
        }
        let eligible = self.eligible();
        let online = eligible.len();
        // The epsilon keeps 0.3 × 10 at 3 despite f32 rounding.
        let share =
            (self.config.fraction.clamp(0.0, 1.0) as f64 * online as f64 - 1e-6).ceil() as usize;
        let wanted = share
            .max(self.config.min_clients.min(online))
            .max(1)
            .min(online);
        if online == 0 {
            self.phase = Phase::Waiting;
            self.outputs.push_back(Output::StatusChanged);
            return;
        }
        // Under central DP the round must fit the privacy budget before anyone is drawn.
        if !self.plan_private_round(wanted, online) {
            return;
        }
        let poisson = self.config.privacy.map(|p| p.sampling) == Some(SamplingKind::Poisson);
        let mut selected: Vec<String> = if poisson {
            self.poisson_draw(eligible)
        } else {
            eligible.into_iter().choose_multiple(&mut self.rng, wanted)
        };
        selected.sort();
        self.open_with(selected, now_ms);
    }

    /// Opens the next round with these (sorted) clients.
    pub(super) fn open_with(&mut self, selected: Vec<String>, now_ms: u64) {
        // Every selected client may be halfway through a chunked update at the same moment (a
        // fleet answering one task); with room for fewer, the oldest partial updates would be
        // evicted and time out as `incomplete` (seen with 1,000 devices and the journal on).
        // Buffered: devices given earlier versions' tasks may be sending too.
        let senders = selected.len().max(self.in_flight.len() + selected.len());
        let room = (2 * senders).max(fedge_wire::DEFAULT_MAX_PENDING);
        self.reassembler.set_max_pending(room);
        let round = self.next_round;
        self.next_round += 1;
        let timeout = self
            .relay_timeout(now_ms)
            .unwrap_or(self.config.round_timeout_ms);
        let (train, insight, prototypes, pooled) = match &self.relayed {
            // A site passes the global task's settings and tensors on.
            Some(r) => (
                r.train.clone(),
                r.insight.clone(),
                r.prototypes.clone(),
                r.pooled.clone(),
            ),
            None => (
                self.strategy.configure_round(round, &self.config.train),
                self.insight.as_ref().and_then(GlobalInsight::tensor),
                self.prototypes.as_ref().and_then(GlobalPrototypes::tensor),
                self.pooled.clone(),
            ),
        };
        let pools = train.feature_norm.pools();
        // The task travels in the round's codec (f16 unless updates are lossless); the
        // coordinator keeps its f32 model, so steps below f16's resolution still add up, and
        // rebuilds what devices trained from with `task_params` where it needs it exactly.
        let update_codec = train.update_codec;
        let codec = update_codec.for_tasks();
        let buffered = self.buffered();
        let task = RoundTask {
            federation: self.config.federation.clone(),
            run: self.config.run,
            round,
            selected: selected.clone(),
            classes: self.config.classes.clone(),
            params: TensorF32::from_slice_with(&self.params, codec),
            train,
            // Buffered: a device trains to the end, however long it takes.
            deadline_ms: if buffered { 0 } else { timeout },
            insight: insight.map(|t| t.recoded(codec)),
            prototypes: prototypes.map(|t| t.recoded(codec)),
            backbone: self.config.backbone_sha256.map(|sha256| BackboneRef {
                name: self.config.backbone.clone(),
                sha256,
            }),
            pooled: pooled.filter(|_| pools).map(|p| p.recoded(codec)),
        };
        let pool = task.pooled.clone();
        let kept = buffered.then(|| task.clone());
        let frame = self.task_frame(task);
        let held = UpdatesConfig {
            dots: self.strategy.needs_dots(),
            budget_bytes: self.config.update_memory_bytes,
            codec: update_codec,
            ..UpdatesConfig::default()
        };
        let accepted = RoundUpdates::reusing(
            std::mem::take(&mut self.spare_arena),
            self.params.len(),
            selected.len(),
            held,
        );
        let times = (now_ms, now_ms + timeout);
        if buffered {
            for client in &selected {
                self.in_flight.start(client, round, now_ms);
            }
        }
        let mut open = OpenRound::new(round, selected, accepted, times, frame.clone());
        open.pools = pools;
        open.pool = pool;
        open.task = kept;
        self.open = Some(open);
        self.phase = Phase::Training;
        if buffered {
            self.schedule_buffer_tick(now_ms);
        }
        if self.journaling() {
            let selected = self
                .open
                .as_ref()
                .map(|o| o.selected.iter().cloned().collect());
            self.outputs.push_back(Output::Journal(Record::Opened {
                round,
                selected: selected.unwrap_or_default(),
                base: params_fingerprint(&self.params),
                run: self.config.run,
            }));
        }
        self.outputs.push_back(Output::PublishTask { round, frame });
        self.outputs.push_back(Output::StatusChanged);
    }

    /// A task framed for its selected devices (sealed with their keys when there are keys).
    pub(super) fn task_frame(&self, task: RoundTask) -> Vec<u8> {
        let version = self.downlink_version();
        let selected = task.selected.clone();
        let frame = fedge_wire::encode_as(&Message::RoundTask(task), version);
        let Some(keys) = &self.config.auth else {
            return frame;
        };
        // Selected clients are online, and only devices with keys go online.
        let signers: Vec<(&str, &DeviceKey)> = selected
            .iter()
            .filter_map(|c| keys.get(c).map(|k| (c.as_str(), k)))
            .collect();
        fedge_wire::seal(frame, &signers)
    }

    pub(super) fn close_round(&mut self, now_ms: u64) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        self.last_closed = open.round;
        // Views are in client order whatever the arrival order, so a seeded run reproduces.
        open.accepted.finish();
        // Under central DP clipping bounds every device; the norm-ratio drop would make one
        // device's fate depend on the others' unclipped norms.
        let private = self.privacy.is_some();
        let (mut longest, norm_clipped) = match private {
            false => self.clip_norm_outliers(&mut open),
            true => (0.0, Vec::new()),
        };
        // A buffer closes full: its size is the quorum.
        let buffered = self.buffered();
        let quorum = if buffered {
            1
        } else {
            self.config.min_updates.max(1)
        };
        let aggregated = !open.accepted.is_empty() && open.accepted.len() >= quorum;
        let mut staleness = Vec::new();
        let reported: Vec<String> = (0..open.accepted.len())
            .map(|i| open.accepted.client(i).to_owned())
            .collect();
        let mut aggregation = None;
        let mut abandoned = (!aggregated).then_some("quorum");
        let mut capped = Vec::new();
        // A site's answer is the aggregate's step from the global parameters.
        let before = self.config.relay.is_some().then(|| self.params.clone());
        if aggregated {
            // Buffered: a device that has not reported is still in flight, not a failure.
            for client in open.selected.iter().filter(|_| !buffered) {
                let failed = open.failures.iter().any(|f| &f.client == client);
                if !failed && !open.accepted.contains(client) {
                    open.failures.push(Failure {
                        client: client.clone(),
                        reason: "no_report".into(),
                    });
                }
            }
            if !private {
                capped = self.cap_weights(&mut open);
            }
            if buffered {
                staleness = self.weigh_staleness(&mut open);
            }
            if let Some(expected) = self.private_expected() {
                self.strategy.expect_participants(expected);
            }
            let saved = self.strategy.state();
            let result = self
                .strategy
                .aggregate(&self.params, &open.accepted, &open.failures);
            // Under central DP the step is bounded by the clip norm this round used.
            let clip = result.report.dp_clip_norm;
            longest = self
                .private_step_bound(open.accepted.len(), clip)
                .unwrap_or(longest);
            // The noisy sum was drawn: the round counts, whether or not the guard applies it.
            self.account_round(&open.selected);
            match guard::refuse_aggregate(&self.params, &result.params, longest) {
                Some(reason) => {
                    // The model and the strategy's buffers stay as they were.
                    let _ = self.strategy.restore(&saved);
                    abandoned = Some(reason);
                }
                None => {
                    if self.insight.is_some() {
                        // Each client's classifier is the task's (rounded) one plus its delta.
                        let sent = self.task_params();
                        if let Some(insight) = self.insight.as_mut() {
                            insight.fold(&sent, &open.accepted, &open.class_stats);
                        }
                    }
                    if let Some(prototypes) = self.prototypes.as_mut() {
                        prototypes.fold(&open.accepted, &open.prototypes);
                    }
                    self.fold_pooled(&open);
                    self.params = result.params;
                    aggregation = Some(result.report);
                }
            }
        }
        let aggregated = abandoned.is_none();
        if let (true, Some(before)) = (aggregated, &before) {
            self.push_upstream(&open, before);
        }
        let mut failures: BTreeMap<String, String> = open
            .selected
            .iter()
            .filter(|c| !buffered && !reported.contains(c))
            .map(|c| (c.clone(), "no_report".to_owned()))
            .collect();
        for failure in &open.failures {
            if let Some(reason) = failures.get_mut(&failure.client) {
                reason.clone_from(&failure.reason);
            }
        }
        for client in open.selected.iter().filter(|_| !buffered) {
            if failures.contains_key(client) {
                let missed = self.control.missed.entry(client.clone()).or_insert(0);
                *missed += 1;
                let limit = self.config.max_missed_rounds;
                if limit > 0 && *missed >= limit {
                    let rest = super::types::rest_ms(self.config.round_timeout_ms, *missed - limit);
                    self.control
                        .rest_until
                        .insert(client.clone(), now_ms + rest);
                    tracing::warn!(%client, missed = *missed, rest_s = rest / 1000, "device rests: selected for no round until it reports healthy or its rest ends");
                }
            } else {
                self.control.missed.remove(client);
                self.control.rest_until.remove(client);
            }
        }
        let report = RoundReport {
            round: open.round,
            aggregated,
            abandoned,
            capped,
            norm_clipped,
            failures,
            selected: open.selected.iter().cloned().collect(),
            reported,
            rejected: open.rejected,
            bytes_up: open.bytes_up,
            bytes_down: open.task_frame.len() as u64 * open.selected.len() as u64,
            duration_ms: now_ms.saturating_sub(open.opened_ms),
            // What devices report of their own data is not noised: left out under central DP.
            source_val_accuracy: weighted_mean(&open.val).filter(|_| !private),
            train_loss: weighted_mean(&open.loss).filter(|_| !private),
            params_norm: l2_norm(&self.params),
            aggregation,
            privacy: self.privacy_spent(),
            staleness,
        };
        if buffered {
            // The next version takes updates from `max_staleness` versions back, no older.
            let oldest = (open.round + 1).saturating_sub(self.config.aggregation.max_staleness);
            self.in_flight.drop_before(oldest);
        }
        if before.is_some() {
            self.relayed = None;
        }
        self.spare_arena = open.accepted.into_arena();
        self.last_report = Some(report.clone());
        self.outputs.push_back(Output::RoundEnded(Box::new(report)));
        if aggregated {
            self.aggregated_rounds += 1;
            // A site's aggregate is not the global model: the global release is relayed.
            if self.config.relay.is_none() {
                self.push_release(open.round, open.pool.as_ref(), now_ms);
            }
        }
        let done = self.config.rounds > 0 && self.aggregated_rounds >= self.config.rounds;
        if !done && self.privacy_exhausted() {
            self.finish_for_privacy();
        } else if done {
            self.phase = Phase::Finished;
            self.outputs.push_back(Output::StatusChanged);
            self.outputs.push_back(Output::Finished);
        } else {
            self.phase = Phase::Waiting;
            self.try_start(now_ms);
            if self.phase == Phase::Waiting {
                self.outputs.push_back(Output::StatusChanged);
            }
        }
    }

    /// Cuts sample counts above `max_weight_ratio` × the round's lower median count (and the
    /// class counts of those clients' statistics in proportion); returns the clients cut.
    /// The parameters devices trained from this round: the model as the task's codec carries
    /// it. FedDIM's server side rebuilds each client's classifier from them.
    fn task_params(&self) -> Vec<f32> {
        let train = match &self.relayed {
            Some(r) => &r.train,
            None => &self.config.train,
        };
        TensorF32::from_slice_with(&self.params, train.update_codec.for_tasks()).to_vec()
    }

    fn cap_weights(&mut self, open: &mut OpenRound) -> Vec<String> {
        let Some(cap) = guard::sample_cap(self.config.max_weight_ratio, &open.accepted) else {
            return Vec::new();
        };
        let capped = open.accepted.cap_samples(cap);
        for (client, claimed) in &capped {
            let scale = f64::from(cap) / f64::from((*claimed).max(1));
            for stats in [&mut open.class_stats, &mut open.prototypes] {
                if let Some((counts, _)) = stats.get_mut(client) {
                    guard::scale_counts(counts, scale);
                }
            }
            if let Some(features) = open.features.get_mut(client) {
                *features = features.scaled(scale);
            }
        }
        capped.into_iter().map(|(client, _)| client).collect()
    }

    /// Scales every delta longer than `max_norm_ratio` × the median norm of the round's other
    /// updates down to that length (`guard::norm_clips`). Returns the norm of the longest
    /// delta after it, and the clips.
    fn clip_norm_outliers(&mut self, open: &mut OpenRound) -> (f64, Vec<NormClip>) {
        let norms = norms(&open.accepted);
        let clips = guard::norm_clips(self.config.max_norm_ratio, &open.accepted, &norms);
        let mut scales = vec![1f32; norms.len()];
        let mut lengths = norms;
        for (i, clip) in &clips {
            scales[*i] = (clip.bound / clip.norm) as f32;
            lengths[*i] = clip.bound;
            // The guard doing its job, not something to act on: INFO (the round's status and
            // report name every scaled update).
            tracing::info!(
                client = %clip.client,
                norm = clip.norm,
                bound = clip.bound,
                ratio = self.config.max_norm_ratio,
                "update scaled down to max_norm_ratio × the median norm of the round's other updates"
            );
        }
        if !clips.is_empty() {
            let dots = open.accepted.keeps_dots();
            open.accepted = open.accepted.scaled(&scales, dots);
        }
        let longest = lengths.into_iter().fold(0.0, f64::max);
        (longest, clips.into_iter().map(|(_, c)| c).collect())
    }

    /// Counts a rejection of `client`'s message in the open round, if any.
    pub(super) fn reject(&mut self, client: &str, reason: Rejection, detail: String) {
        let mut open = self.open.take();
        self.count_rejection(open.as_mut(), client, reason, detail);
        self.open = open;
    }

    /// The bookkeeping of a rejection: totals, the round's counts and failures (when `open` is
    /// the round it happened in), the output for the driver.
    pub(super) fn count_rejection(
        &mut self,
        open: Option<&mut OpenRound>,
        client: &str,
        reason: Rejection,
        detail: String,
    ) {
        *self.rejected_total.entry(reason.name()).or_default() += 1;
        if let Some(open) = open {
            open.count_rejection(client, reason.name());
        }
        self.outputs.push_back(Output::Rejected {
            client: client.to_owned(),
            reason,
            detail,
        });
        self.outputs.push_back(Output::StatusChanged);
    }
}
