//! The machine's side of released models: which to keep and score (see the parent's
//! "Decisions"), and the evaluation-only device's score in its status.

use fedge_wire::SiteEvaluation;

use super::{Agent, Output};
use fedge_wire::decode_release;

impl Agent {
    /// The release the device already holds (from its disk at start), so only newer ones are
    /// taken and the status says which round it serves.
    pub fn hold_model(&mut self, run: u64, round: u64) {
        self.model = Some((run, round));
        self.status.model_round = Some(round);
    }

    /// A payload on `model/current` (a whole release or one of its chunks).
    pub fn handle_model_bytes(&mut self, payload: &[u8], now_ms: u64) {
        if payload.is_empty() {
            return;
        }
        self.model_reassembler.expire(now_ms);
        let key = self.id.key.as_ref();
        let client = self.id.client_id.as_str();
        let release =
            match decode_release(&mut self.model_reassembler, payload, now_ms, client, key) {
                Ok(Some(release)) => release,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(client = %client, "released model refused: {e}");
                    self.status.last_error = format!("released model refused: {e}");
                    self.publish_status();
                    return;
                }
            };
        if release.federation != self.id.federation {
            return;
        }
        // A run of 0 is never a left one (the state's empty slots are 0).
        let left = release.run != 0 && self.state.past_runs.contains(&release.run);
        let fresh = match self.model {
            Some((run, round)) if run == release.run => release.round > round,
            _ => !left,
        };
        if !fresh {
            return;
        }
        self.hold_model(release.run, release.round);
        let evaluate = self.id.role == fedge_wire::Role::Evaluate;
        self.outputs.push_back(Output::Model {
            release: Box::new(release),
            evaluate,
        });
        if !evaluate {
            self.publish_status();
        }
    }

    /// The serving side's drift alarm says `drift` (after an alarm or a re-estimation of the
    /// site's statistics): it goes into the status, published at once when either is new.
    pub fn handle_drift(&mut self, drift: Option<fedge_wire::DriftStatus>) {
        let events = |d: &Option<fedge_wire::DriftStatus>| {
            d.as_ref().map_or(0, |d| d.alarms + d.adaptations)
        };
        let news = events(&drift) > events(&self.status.drift);
        self.status.drift = drift;
        if news {
            self.publish_status();
        }
    }

    /// An evaluation-only device scored a release (or could not: the error goes into
    /// `last_error`).
    pub fn handle_evaluated(&mut self, result: Result<SiteEvaluation, String>) {
        match result {
            Ok(evaluation) => {
                self.status.samples = evaluation.samples;
                self.status.evaluation = Some(evaluation);
                self.status.last_error.clear();
            }
            Err(e) => {
                tracing::warn!(client = %self.id.client_id, "cannot score the released model: {e}");
                self.status.last_error = e;
            }
        }
        self.publish_status();
    }
}
