//! The machine's side of round tasks: reassembled, their tag checked, then trained, skipped
//! or refused with the reason in the status (see the parent's "Decisions").

use fedge_wire::{RoundTask, decode_task};

use super::{Agent, Output};
use fedge_wire::Role;

impl Agent {
    /// A payload on the task topic (a whole task or one of its chunks): reassemble, check the
    /// tag, and decide whether to train (see the module documentation).
    pub fn handle_task_bytes(&mut self, payload: &[u8], now_ms: u64) {
        if payload.is_empty() {
            return;
        }
        self.summary.bytes_down += payload.len() as u64;
        self.reassembler.expire(now_ms);
        let client_id = self.id.client_id.as_str();
        let task = match decode_task(
            &mut self.reassembler,
            payload,
            now_ms,
            client_id,
            self.id.key.as_ref(),
        ) {
            Ok(Some(task)) => task,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(client = %client_id, error = %e, "round task refused");
                self.status.last_error = e.to_string();
                self.publish_status();
                return;
            }
        };
        self.take_task(task);
    }

    /// A task named for this device that came while it trained (buffered aggregation: a
    /// task without deadline), trained as soon as the training ends.
    pub(super) fn take_pending(&mut self) {
        if let Some(task) = self.pending.take() {
            self.take_task(task);
        }
    }

    /// A decoded task: refused with the reason, kept for after the training under way
    /// (buffered aggregation), trained, or skipped.
    fn take_task(&mut self, task: RoundTask) {
        let client_id = self.id.client_id.as_str();
        if let Some(refusal) = self.refusal(&task) {
            tracing::warn!(client = %client_id, "{refusal}");
            if self.id.follows_federation_backbone
                && let Some(theirs) = &task.backbone
                && Some(theirs.sha256) != self.id.backbone_sha256
            {
                self.summary.backbone_moved = Some(theirs.clone());
            }
            self.decline(&task, &refusal);
            self.status.last_error = refusal;
            self.publish_status();
            return;
        }
        let named = self.id.role == Role::Train
            && task.selected.iter().any(|c| c == client_id)
            && self.state.is_fresh(task.run, task.round);
        // Buffered aggregation names a busy device only when its last version fell out of
        // `max_staleness`: it trains the newer one next, from the newest model it was given.
        if named && self.training.is_some() && task.deadline_ms == 0 {
            self.pending = Some(task);
            return;
        }
        let wanted = named && self.training.is_none();
        if wanted && too_slow_for(task.deadline_ms, self.state.last_train_seconds) {
            self.status.last_error = format!(
                "skipped round {}: the last local training took {:.1} s, longer than the round's {:.1} s deadline",
                task.round,
                self.state.last_train_seconds,
                task.deadline_ms as f64 / 1000.0
            );
            tracing::warn!(client = %client_id, "{}", self.status.last_error);
            let reason = self.status.last_error.clone();
            self.decline(&task, &reason);
            // Skip it once; the next round is tried again.
            self.state.last_train_seconds = 0.0;
            self.publish_status();
        } else if wanted {
            self.training = Some((task.run, task.round, task.train.update_codec));
            self.outputs.push_back(Output::Train(Box::new(task)));
        }
    }

    /// Says in the status that a round this device was selected for, of its federation and
    /// not answered yet, will get no update, so that the coordinator need not wait for it.
    fn decline(&mut self, task: &RoundTask, reason: &str) {
        let selected = task.selected.iter().any(|c| c == &self.id.client_id);
        if selected
            && self.id.role == Role::Train
            && task.federation == self.id.federation
            && self.state.is_fresh(task.run, task.round)
        {
            self.status.declined = Some(super::declined(task.run, task.round, reason));
        }
    }

    /// Why a task must not be trained, if it must not: another federation's, values out of
    /// range, or a replay of a task older than the last one answered.
    fn refusal(&self, task: &RoundTask) -> Option<String> {
        if task.federation != self.id.federation {
            return Some(format!(
                "refused a round task of federation {:?}; this device belongs to {:?}",
                task.federation, self.id.federation
            ));
        }
        if let Err(e) = task.train.check() {
            return Some(format!("refused round {}: {e}", task.round));
        }
        if let Some(pooled) = &task.pooled
            && let Err(e) = self.check_pooled(task, pooled)
        {
            return Some(format!(
                "refused round {}: the pooled feature statistics: {e}",
                task.round
            ));
        }
        let selected = task.selected.iter().any(|c| c == &self.id.client_id);
        if selected
            && self.id.role == Role::Train
            && let Err(e) = crate::classes::check(&self.id.classes, &task.classes)
        {
            return Some(format!("refused round {}: {e}", task.round));
        }
        if let (true, Role::Train, Some(_)) = (selected, self.id.role, &self.local_dp)
            && let Some(refused) = crate::local_dp::refusal(task.train.objective, task.round)
        {
            return Some(refused);
        }
        if let (true, Some(theirs), Some(ours)) =
            (selected, &task.backbone, self.id.backbone_sha256)
            && theirs.sha256 != ours
        {
            let ours = fedge_wire::BackboneRef {
                name: self.id.backbone.clone(),
                sha256: ours,
            };
            return Some(format!(
                "refused round {}: the federation trains on backbone {:?} (sha256 {}…), this \
                 device runs {:?} (sha256 {}…): install the federation's backbone",
                task.round,
                theirs.name,
                theirs.short(),
                ours.name,
                ours.short()
            ));
        }
        if selected && self.state.is_stale(task.run, task.round) {
            return Some(format!(
                "refused a stale round task (run {:016x}, round {}): already answered round {} of run {:016x}",
                task.run, task.round, self.state.last_round, self.state.run
            ));
        }
        None
    }

    /// Checks a task's pooled summary before anything reads it: sizes against the task's
    /// classes and the device's features (the summary's own without [`Agent::with_head`]),
    /// every value finite. A summary that does not hold together would index out of its
    /// tensors in the trainer.
    fn check_pooled(
        &self,
        task: &RoundTask,
        pooled: &fedge_wire::FeatureSummary,
    ) -> Result<(), String> {
        let classes = match task.classes.len() {
            0 => pooled.classes(),
            k => k,
        };
        let features = self.head.as_ref().map_or(pooled.features(), |h| h.features);
        pooled.check(classes, features)
    }
}

/// Whether a task should be skipped because the last round's training took longer than the
/// task's whole deadline: the update would arrive after the round closed.
pub fn too_slow_for(task_deadline_ms: u64, last_train_seconds: f32) -> bool {
    task_deadline_ms > 0 && (last_train_seconds as f64) * 1000.0 > task_deadline_ms as f64
}
