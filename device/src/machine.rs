//! The device agent's decisions as a sans-IO state machine, like the coordinator's round
//! machine.
//!
//! Inputs are method calls: [`Agent::handle_connected`], [`Agent::handle_publish`] (or
//! [`Agent::handle_task_bytes`] and [`Agent::handle_metrics`] directly) with the current time
//! in milliseconds from any monotonic origin the driver chooses, [`Agent::handle_trained`]
//! when local training ends, [`Agent::handle_update_sent`] once the update is queued, and
//! [`Agent::handle_stop`]. Outputs are drained with [`Agent::poll_output`]: what to subscribe
//! to, what to publish, what to train, what to save. The machine never reads a clock, never
//! touches the network or the disk and never trains: the driver does, so
//! every decision below is unit-tested without a broker.
//!
//! # Decisions
//!
//! A round task is trained when it belongs to the device's federation, its training values
//! are in range, the device is selected, the task is fresh and no training is running. Fresh
//! means a later round of the run last answered, or a run never seen (a coordinator that
//! started afresh draws a new run and counts from 1 again): a task delivered twice (retained,
//! reconnect, restart with the saved state) is not trained again, and a replayed older task
//! (an earlier round, or a run the device has left) is refused with a `last_error`. A task is
//! skipped once, with a `last_error`, when the last training took longer than the task's whole
//! deadline: its update would arrive after the round closed. The next task is tried again.
//! A training device refuses a task whose class list lacks a class it has images of (naming
//! it); an evaluation-only device never trains. A task whose pooled feature summary does not
//! hold together (sizes other than its classes × the device's features, a value that is not
//! finite) is refused before anything reads it, like a task whose values are out of range.
//!
//! With local DP ([`Agent::with_local_dp`]) every update's delta is clipped and noised here,
//! where the trained delta becomes the [`ClientUpdate`], so no update leaves un-noised whatever
//! the objective, the strategy or the driver; the round is composed into the device's
//! accountant (kept in the round state, saved before the update is published) and the ε spent
//! goes into the status. A task whose objective sends per-class statistics (FedDIM, FedDDL) is
//! refused under local DP, with the reason in `last_error`, since they would leave un-noised.
//!
//! A release of the global head on `model/current` is kept when it is the device's
//! federation's, verifies (digest, layout, and with a key its seal) and is not of a run the
//! device has left (unless it serves that run): the last [`KEPT_RELEASES`] by arrival, always
//! with the one served, an older round (a rollback) included. Its sizes are checked before it
//! is verified (`serving::release_fits`): another feature size or tail than the device's head
//! ([`Agent::with_head`]), a projector wider than any a device fits, or more bytes than the
//! device reassembles in one frame ([`task_limit_bytes`]) are refused; and the releases kept
//! take at most that many bytes, the one served and the one the pointer names aside. Which
//! one serves follows the coordinator's pointer on `model/serving` once the device has taken
//! one: a pointer of its federation (with a key, sealed for the device) whose `seq` is above
//! the last one taken (the same one again is ignored; an older one is refused and said in
//! `last_error`, since the device will not follow that numbering), naming for each device the
//! release it serves (during a canary stage the listed devices serve the new release, the
//! others the previous one). The
//! device switches to it when it holds it, or as soon as it arrives; meanwhile it serves on
//! what it serves. Before any pointer, a release serves when it is newer than the one served:
//! a later round of the same run, or another run. Each switch is an [`Output::Serve`], and the
//! status says the release's digest and round. An evaluation-only device also scores, once
//! per digest, every new release on `model/current` and every candidate on `model/candidate`
//! (which nobody serves, and a training device does not even subscribe to), and reports the
//! score in its status with the digest of what it scored.

use std::collections::VecDeque;

use fedge_wire::{
    ClassStats, ClientUpdate, Codec, DeviceKey, EdgeStatus, HeadConfig, LocalMetrics, Message,
    ModelRelease, Reassembler, Role, RoundTask, TensorF32, Topics,
};

use crate::local_dp::LocalDp;
use crate::state::RoundState;
use crate::train::{TrainError, TrainOutcome};

/// Who the device is and what its status reports; everything the machine needs from the
/// set-up besides the data and the Burn device.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Client id (one MQTT topic level).
    pub client_id: String,
    /// Federation name.
    pub federation: String,
    /// The device's key: when set, updates are sealed with it and round tasks must carry a tag
    /// that verifies with it.
    pub key: Option<DeviceKey>,
    /// Training samples (the update's weight, and in status).
    pub samples: u32,
    /// Validation samples (in the update's metrics).
    pub val_samples: u32,
    /// Hardware profile name, for status.
    pub profile: String,
    /// Backbone name, for status.
    pub backbone: String,
    /// The SHA-256 of the backbone's ONNX file, when known: a task naming another backbone
    /// is refused.
    pub backbone_sha256: Option<[u8; 32]>,
    /// The backbone is the federation's (`backbone = "federation"`): a task naming another
    /// one ends the agent's run so that it is fetched ([`AgentSummary::backbone_moved`]).
    pub follows_federation_backbone: bool,
    /// Training device name, for status.
    pub device: String,
    /// The engine that runs the backbone and its providers, for status.
    pub runtime: String,
    /// The profile's memory budget in MiB (0: none): a peak above it is reported in status.
    pub memory_budget_mb: u64,
    /// Train when selected, or only score released models.
    pub role: Role,
    /// The classes the device has samples of: a task whose class list lacks one is refused.
    pub classes: Vec<String>,
}

/// The device's client id or federation cannot name its topics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid agent identity: {0}")]
pub struct InvalidIdentity(pub String);

/// What an agent did before it stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSummary {
    /// Rounds trained.
    pub rounds_trained: u64,
    /// Update bytes published (all chunks).
    pub bytes_up: u64,
    /// Task bytes received.
    pub bytes_down: u64,
    /// Times somebody else's status on the device's topic was replaced by its own.
    pub statuses_restored: u64,
    /// Serving pointers refused for a number below the last one taken (a coordinator whose
    /// clock went back, or a replay); each is in the status's `last_error` too.
    pub pointers_refused: u64,
    /// A device that takes its backbone from the federation (`backbone = "federation"`) was
    /// asked to train on another one: the driver stops so that it is fetched.
    pub backbone_moved: Option<fedge_wire::BackboneRef>,
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Subscribe to these topic filters at QoS 1.
    Subscribe(Vec<String>),
    /// Publish the device's status on `topic`, retained, at QoS 1, stamped with the wall
    /// clock's time.
    Status {
        /// The status topic.
        topic: String,
        /// The status, `updated_at` still empty.
        status: Box<EdgeStatus>,
    },
    /// Publish an update frame on `topic` in chunks (message id `seq`), not retained, then
    /// report with [`Agent::handle_update_sent`].
    Update {
        /// The update topic.
        topic: String,
        /// The encoded (and, with a key, sealed) update.
        frame: Vec<u8>,
        /// The update's sequence number.
        seq: u64,
    },
    /// Train on this task away from the network loop, then report with
    /// [`Agent::handle_trained`].
    Train(Box<RoundTask>),
    /// Persist the round state (when the device has a state file).
    Save(RoundState),
    /// Serve this verified release of the global head from now (a newer one, or an older one
    /// again after a rollback): keep it on disk and install it for predictions.
    Serve(Box<ModelRelease>),
    /// Score this verified release or candidate on the device's data (evaluation-only
    /// devices), then report with [`Agent::handle_evaluated`]; with a second release (a
    /// candidate's: the one the device serves), also say on which images only one of the two
    /// is right ([`fedge_wire::PairedScore`], what the gate decides on).
    Score(Box<ModelRelease>, Option<Box<ModelRelease>>),
}

/// The agent's decisions; see the module documentation.
#[derive(Debug)]
pub struct Agent {
    id: Identity,
    status_topic: String,
    update_topic: String,
    task_base: String,
    metrics_topic: String,
    model_base: String,
    candidate_base: String,
    serving_topic: String,
    reassembler: Reassembler,
    /// `model/current`'s chunks (its message ids are rounds, like the tasks').
    model_reassembler: Reassembler,
    /// `model/candidate`'s chunks (evaluation-only devices).
    candidate_reassembler: Reassembler,
    /// The releases held, the one served and the last serving pointer taken.
    releases: serving::Releases,
    status: EdgeStatus,
    state: RoundState,
    /// The round being trained and how its update must be packed.
    /// The task being trained: its run, round and update codec.
    training: Option<(u64, u64, Codec)>,
    /// A task without deadline that named this device while it trained: trained next.
    pending: Option<fedge_wire::RoundTask>,
    /// The peak memory of a round whose update the driver is publishing.
    publishing: Option<Option<f64>>,
    summary: AgentSummary,
    outputs: VecDeque<Output>,
    /// Local DP: the settings and the noise source every update's delta goes through.
    local_dp: Option<LocalDp>,
    /// The device's own head ([`Agent::with_head`]): what a task's pooled summary and a
    /// release's sizes are checked against.
    head: Option<HeadConfig>,
}

impl Agent {
    /// A machine for `id`, remembering `state` from before a restart.
    pub fn new(id: Identity, state: RoundState) -> Result<Self, InvalidIdentity> {
        let topics = Topics::new(&id.federation).map_err(|e| InvalidIdentity(e.to_string()))?;
        if !fedge_wire::valid_client_id(&id.client_id) {
            return Err(InvalidIdentity(format!(
                "client id {:?} must be 1-64 characters of A-Z a-z 0-9 _ . -",
                id.client_id
            )));
        }
        let status = EdgeStatus {
            client_id: id.client_id.clone(),
            online: true,
            profile: id.profile.clone(),
            backbone: id.backbone.clone(),
            samples: id.samples,
            role: id.role,
            last_round: state.last_round,
            last_error: String::new(),
            device: id.device.clone(),
            runtime: id.runtime.clone(),
            peak_memory_mb: None,
            updated_at: String::new(),
            tag: None,
            protocol: Some(fedge_wire::PROTOCOL_VERSION),
            ..EdgeStatus::default()
        };
        Ok(Self {
            status_topic: topics.edge_status(&id.client_id),
            update_topic: topics.update(&id.client_id),
            task_base: topics.round_task(),
            metrics_topic: topics.metrics(),
            model_base: topics.model_current(),
            candidate_base: topics.model_candidate(),
            serving_topic: topics.model_serving(),
            // One stream at a time (two while one expires), no larger than the memory budget
            // allows: a reassembler never holds more than the device can afford.
            model_reassembler: reassembler(id.memory_budget_mb),
            candidate_reassembler: reassembler(id.memory_budget_mb),
            releases: serving::Releases::within(task_limit_bytes(id.memory_budget_mb)),
            reassembler: reassembler(id.memory_budget_mb),
            id,
            status,
            state,
            training: None,
            pending: None,
            publishing: None,
            summary: AgentSummary::default(),
            outputs: VecDeque::new(),
            local_dp: None,
            head: None,
        })
    }

    /// Turns local DP on: every update's delta is privatised with `local_dp` (its noise source
    /// injected by the driver) and the status reports the ε spent so far, counting the rounds
    /// the remembered state's accountant already holds.
    pub fn with_local_dp(mut self, local_dp: LocalDp) -> Self {
        let spent = self.state.accountant.get_or_insert_with(Default::default);
        self.status.epsilon = local_dp.epsilon(spent);
        self.local_dp = Some(local_dp);
        self
    }

    /// Tells the machine the device's own head: the backbone's feature size, the projector
    /// width of its profile and the trainable tail it runs, if any. A release of other sizes
    /// is refused before it is verified or kept (it could not serve here), and a task's pooled
    /// summary is checked against the feature size. Without it, only what the layout bounds
    /// is checked.
    pub fn with_head(mut self, head: HeadConfig) -> Self {
        self.head = Some(head);
        self
    }

    /// The Last Will the broker publishes when the device vanishes: its status offline, with
    /// the last round it had answered when it connected.
    pub fn last_will(&self) -> (String, EdgeStatus) {
        let will = EdgeStatus {
            online: false,
            last_round: self.state.last_round,
            ..self.status.clone()
        };
        (self.status_topic.clone(), will)
    }

    /// The next thing the driver must do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The status as last published (without its time stamp).
    pub fn status(&self) -> &EdgeStatus {
        &self.status
    }

    /// The round state as last saved or about to be.
    pub fn state(&self) -> &RoundState {
        &self.state
    }

    /// What the agent did so far.
    pub fn summary(&self) -> &AgentSummary {
        &self.summary
    }

    /// The broker accepted the connection: subscribe to the tasks, the metrics, the device's
    /// own status topic, the releases and the serving pointer (and, evaluation-only devices,
    /// the candidates), and say the device is online.
    pub fn handle_connected(&mut self) {
        let mut filters = vec![
            self.task_base.clone(),
            format!("{}/+", self.task_base),
            self.metrics_topic.clone(),
            self.status_topic.clone(),
            self.model_base.clone(),
            format!("{}/+", self.model_base),
            self.serving_topic.clone(),
        ];
        if self.id.role == Role::Evaluate {
            filters.extend([
                self.candidate_base.clone(),
                format!("{}/+", self.candidate_base),
            ]);
        }
        self.outputs.push_back(Output::Subscribe(filters));
        self.publish_status();
    }

    /// A message on any topic the agent subscribed to.
    pub fn handle_publish(&mut self, topic: &str, payload: &[u8], now_ms: u64) {
        if topic == self.status_topic {
            self.handle_own_status(payload);
        } else if topic == self.metrics_topic {
            self.handle_metrics(payload);
        } else if under(topic, &self.task_base) {
            self.handle_task_bytes(payload, now_ms);
        } else if under(topic, &self.model_base) {
            self.handle_model_bytes(payload, now_ms);
        } else if topic == self.serving_topic {
            self.handle_serving_bytes(payload);
        } else if under(topic, &self.candidate_base) {
            self.handle_candidate_bytes(payload, now_ms);
        }
    }

    /// A retained status on the device's own topic: its own, or one somebody else wrote (an
    /// `offline` to get it deselected, garbage, a cleared topic). While running, the device puts
    /// its own status back over anything that is not its own, so no forgery keeps it out of
    /// the rounds (with keys the coordinator refuses the forgery anyway).
    pub fn handle_own_status(&mut self, payload: &[u8]) {
        if !self.status.online {
            return;
        }
        let own = serde_json::from_slice::<EdgeStatus>(payload).is_ok_and(|s| {
            let signed = match &self.id.key {
                Some(key) => s.verify(&self.id.federation, &self.id.client_id, key),
                None => true,
            };
            s.online && s.client_id == self.id.client_id && signed
        });
        if !own {
            tracing::warn!(client = %self.id.client_id, "somebody else wrote this device's status; putting it back");
            self.summary.statuses_restored += 1;
            self.publish_status();
        }
    }

    /// A round's metrics JSON: a rejection of this device's update lands in `last_error`.
    /// The coordinator's `declined` or `no_report` says less than the device's own reason for
    /// a round it could not answer, which stays.
    pub fn handle_metrics(&mut self, payload: &[u8]) {
        let Some((round, reason)) = failure_of(payload, &self.id.client_id) else {
            return;
        };
        let vague = reason == "declined" || reason == "no_report";
        if vague && !self.status.last_error.is_empty() {
            tracing::debug!(client = %self.id.client_id, round, %reason, "the coordinator counted the round as failed; the device's own reason stays");
            return;
        }
        let e = rejection_message(round, &reason);
        tracing::warn!(client = %self.id.client_id, "{e}");
        self.status.last_error = e;
        self.publish_status();
    }

    /// Local training ended: publish the update (then [`Agent::handle_update_sent`]) or report
    /// the failure; the round counts as answered either way.
    pub fn handle_trained(&mut self, done: Trained) {
        let (run, codec) = self
            .training
            .take()
            .map(|(run, _, codec)| (run, codec))
            .unwrap_or_default();
        self.status.last_round = done.round;
        if let Some(data) = done.data {
            self.id.samples = data.samples;
            self.id.val_samples = data.val_samples;
            self.id.classes = data.classes;
            self.status.samples = data.samples;
            self.status.new_samples = data.new_samples;
        }
        self.state.answer(run, done.round);
        self.state.last_train_seconds = done.seconds;
        match done.result.and_then(|outcome| self.privatised(outcome)) {
            Ok(outcome) => {
                self.state.seq += 1;
                let seq = self.state.seq;
                let update = ClientUpdate {
                    run,
                    round: done.round,
                    client_id: self.id.client_id.clone(),
                    seq,
                    num_samples: self.id.samples,
                    delta: TensorF32::from_slice_with(&outcome.delta, codec),
                    metrics: LocalMetrics {
                        train_loss: outcome.last_epoch_loss,
                        val_accuracy: done.val_accuracy,
                        val_samples: self.id.val_samples,
                        train_seconds: done.seconds,
                    },
                    class_stats: outcome.class_stats.map(|s| class_stats(s, codec)),
                    prototypes: outcome.prototypes.map(|s| class_stats(s, codec)),
                    // Statistics never in int8, whose error follows the largest value.
                    features: outcome.features.map(|f| f.recoded(codec.for_tasks())),
                };
                let mut frame = fedge_wire::encode(&Message::ClientUpdate(update));
                if let Some(key) = &self.id.key {
                    frame = fedge_wire::seal(frame, &[(self.id.client_id.as_str(), key)]);
                }
                self.publishing = Some(done.peak_memory_mb);
                self.outputs.push_back(Output::Update {
                    topic: self.update_topic.clone(),
                    frame,
                    seq,
                });
            }
            Err(e) => {
                tracing::error!(client = %self.id.client_id, round = done.round, error = %e, "local training failed");
                self.status.last_error = e.to_string();
                self.status.declined = Some(declined(run, done.round, &self.status.last_error));
                self.finish_round(done.peak_memory_mb);
            }
        }
        self.take_pending();
    }

    /// The driver queued the update (`Ok` with the bytes of all chunks) or could not.
    pub fn handle_update_sent(&mut self, sent: Result<u64, String>) {
        let Some(peak) = self.publishing.take() else {
            return;
        };
        match sent {
            Ok(bytes) => {
                self.summary.bytes_up += bytes;
                self.summary.rounds_trained += 1;
                self.status.last_error.clear();
                self.status.declined = None;
            }
            Err(e) => {
                tracing::error!(client = %self.id.client_id, error = %e, "cannot publish update");
                self.status.last_error = e.to_string();
            }
        }
        self.finish_round(peak);
    }

    /// The agent stops: say the device is offline.
    pub fn handle_stop(&mut self) {
        self.status.online = false;
        self.publish_status();
    }

    /// After a round: memory in status, the state saved, the status published.
    fn finish_round(&mut self, peak_memory_mb: Option<f64>) {
        self.status.peak_memory_mb = peak_memory_mb;
        if let Some(message) =
            peak_memory_mb.and_then(|peak| over_budget(peak, self.id.memory_budget_mb))
        {
            tracing::warn!(client = %self.id.client_id, "{message}");
            if self.status.last_error.is_empty() {
                self.status.last_error = message;
            }
        }
        self.outputs.push_back(Output::Save(self.state.clone()));
        self.publish_status();
    }

    /// With local DP: the outcome's delta clipped and noised, the round composed into the
    /// accountant, the ε spent in the status, and the state saved before the update can leave
    /// (a crash after publishing must not forget the round). Without: the outcome unchanged.
    fn privatised(&mut self, mut outcome: TrainOutcome) -> Result<TrainOutcome, TrainError> {
        let Some(dp) = &mut self.local_dp else {
            return Ok(outcome);
        };
        let clip = dp
            .privatize(&mut outcome.delta)
            .map_err(TrainError::Privacy)?;
        let spent = self.state.accountant.get_or_insert_with(Default::default);
        dp.account(spent).map_err(TrainError::Privacy)?;
        self.status.epsilon = dp.epsilon(spent);
        tracing::debug!(client = %self.id.client_id, norm = clip.norm, clipped = clip.clipped, epsilon = ?self.status.epsilon, "update privatised");
        // Refused at the task already; never sent un-noised whatever the trainer returned. A
        // pooling federation gets no summary from this device (it still uses the pooled one).
        (outcome.class_stats, outcome.prototypes, outcome.features) = (None, None, None);
        self.outputs.push_back(Output::Save(self.state.clone()));
        Ok(outcome)
    }

    fn publish_status(&mut self) {
        self.outputs.push_back(Output::Status {
            topic: self.status_topic.clone(),
            status: Box::new(self.status.clone()),
        });
    }
}

/// A declined round as the status says it.
fn declined(run: u64, round: u64, reason: &str) -> fedge_wire::Declined {
    fedge_wire::Declined {
        run: format!("{run:016x}"),
        round,
        reason: reason.to_owned(),
    }
}

/// Whether `topic` is `base` or one of its chunk topics `base/<i>`.
fn under(topic: &str, base: &str) -> bool {
    topic
        .strip_prefix(base)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A reassembler of the coordinator's chunked frames, within [`task_limit_bytes`].
fn reassembler(memory_budget_mb: u64) -> Reassembler {
    Reassembler::new(
        fedge_wire::DEFAULT_REASSEMBLY_TIMEOUT_MS,
        task_limit_bytes(memory_budget_mb),
    )
    .with_max_pending(fedge_wire::MAX_PENDING_PER_SENDER)
}

/// The coordinator's word on this device's update, from a round's metrics JSON: `Some` when
/// the device was selected and its update did not count (a rejection reason or `no_report`).
pub fn rejection_of(metrics: &[u8], client_id: &str) -> Option<String> {
    failure_of(metrics, client_id).map(|(round, reason)| rejection_message(round, &reason))
}

/// The round and the reason a round's metrics JSON gives for this device's failure.
fn failure_of(metrics: &[u8], client_id: &str) -> Option<(u64, String)> {
    let value: serde_json::Value = serde_json::from_slice(metrics).ok()?;
    let reason = value.get("failures")?.get(client_id)?.as_str()?;
    let round = value.get("round").and_then(|r| r.as_u64()).unwrap_or(0);
    Some((round, reason.to_owned()))
}

fn rejection_message(round: u64, reason: &str) -> String {
    format!("round {round}: the coordinator did not use this device's update ({reason})")
}

/// Counts and `[K, H]` means as they go on the wire.
pub fn class_stats((counts, means): (Vec<u32>, Vec<f32>), codec: Codec) -> ClassStats {
    ClassStats {
        counts,
        means: TensorF32::from_slice_with(&means, codec),
    }
}

/// The message for a peak above the budget, if it is.
pub fn over_budget(peak_mib: f64, budget_mb: u64) -> Option<String> {
    (budget_mb > 0 && peak_mib > budget_mb as f64).then(|| {
        format!(
            "peak memory {peak_mib:.0} MiB is above the profile's memory_budget_mb = {budget_mb}: \
             lower [resources] feature_cache_mb or raise the budget"
        )
    })
}

mod release;
mod serving;
mod tasks;
mod trained;

pub use serving::{KEPT_RELEASES, SCORED_REMEMBERED, Scored, task_limit_bytes};
pub use tasks::too_slow_for;
pub use trained::{DataSummary, Trained};

pub use fedge_wire::{TaskError, decode_task};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod release_tests;

#[cfg(test)]
mod serving_tests;

#[cfg(test)]
mod local_dp_tests;

#[cfg(test)]
mod pooled_tests;
