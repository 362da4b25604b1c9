//! The machine's side of released models: which to keep, serve and score (see the parent's
//! "Decisions"), the serving pointer, and the evaluation-only device's score in its status.

use fedge_wire::{ModelRelease, Role, decode_release, decode_serving};

use super::serving::Scored;
use super::{Agent, Output};

impl Agent {
    /// The release the device already serves (kept on its disk, at start): it counts as held
    /// and served, so only a newer one replaces it before any pointer and a pointer naming it
    /// needs no download, and the status says which release and round it serves. An
    /// evaluation-only device scores it ([`Output::Score`]).
    pub fn hold_model(&mut self, release: ModelRelease) {
        self.status.serving = Some(release.sha256_hex());
        self.status.model_round = Some(release.round);
        self.releases.serve(&release);
        if self.id.role == Role::Evaluate && self.releases.first_score(release.sha256) {
            self.outputs.push_back(Output::Score(Box::new(release)));
        }
    }

    /// A payload on `model/current` (a whole release or one of its chunks).
    pub fn handle_model_bytes(&mut self, payload: &[u8], now_ms: u64) {
        if payload.is_empty() {
            return;
        }
        self.model_reassembler.expire(now_ms);
        let (client, key) = (self.id.client_id.as_str(), self.id.key.as_ref());
        let decoded = decode_release(&mut self.model_reassembler, payload, now_ms, client, key);
        let Some(release) = self.ours(decoded, "released model") else {
            return;
        };
        let sha256 = release.sha256;
        let new = self.releases.keep(release);
        let scoring = new && self.id.role == Role::Evaluate && self.releases.first_score(sha256);
        let switched = self.follow(Some(&sha256));
        if scoring && let Some(release) = self.releases.get(&sha256) {
            self.outputs
                .push_back(Output::Score(Box::new(release.clone())));
        } else if switched {
            // An evaluation-only device says it once its score is in.
            self.publish_status();
        }
    }

    /// A payload on `model/candidate` (a whole release or one of its chunks): an
    /// evaluation-only device scores each candidate once; nobody serves one, and a training
    /// device does not even reassemble them.
    pub fn handle_candidate_bytes(&mut self, payload: &[u8], now_ms: u64) {
        if payload.is_empty() || self.id.role != Role::Evaluate {
            return;
        }
        self.candidate_reassembler.expire(now_ms);
        let (client, key) = (self.id.client_id.as_str(), self.id.key.as_ref());
        let decoded = decode_release(
            &mut self.candidate_reassembler,
            payload,
            now_ms,
            client,
            key,
        );
        let Some(candidate) = self.ours(decoded, "candidate model") else {
            return;
        };
        if self.releases.first_score(candidate.sha256) {
            self.outputs.push_back(Output::Score(Box::new(candidate)));
        }
    }

    /// A payload on `model/serving`: a pointer of the device's federation (with a key, sealed
    /// for this device) above the last one taken is taken, and the device serves the release
    /// it names for it as soon as it holds it.
    pub fn handle_serving_bytes(&mut self, payload: &[u8]) {
        if payload.is_empty() {
            return;
        }
        let client = self.id.client_id.as_str();
        let Some(pointer) = decode_serving(payload, client, self.id.key.as_ref()) else {
            tracing::warn!(client = %client, "serving pointer refused: malformed, or not sealed for this device");
            return;
        };
        if pointer.federation != self.id.federation {
            return;
        }
        let kept = self.state.serving_seq;
        if pointer.seq <= kept {
            tracing::debug!(client = %client, seq = pointer.seq, last = kept, "serving pointer ignored: not above the last one taken before a restart");
            return;
        }
        if let Err(last) = self.releases.take_pointer(&pointer, client) {
            tracing::debug!(client = %client, seq = pointer.seq, last, "serving pointer ignored: not above the last one taken");
            return;
        }
        // Kept across a restart with the round state.
        self.state.serving_seq = pointer.seq;
        self.outputs.push_back(Output::Save(self.state.clone()));
        if self.follow(None) {
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

    /// An evaluation-only device scored a release or a candidate (or could not: the error goes
    /// into `last_error`); the status says which one its `evaluation` is of.
    pub fn handle_evaluated(&mut self, scored: Scored) {
        match scored.result {
            Ok(evaluation) => {
                self.status.samples = evaluation.samples;
                self.status.evaluation = Some(evaluation);
                self.status.evaluated = Some(scored.sha256);
                self.status.last_error.clear();
            }
            Err(e) => {
                tracing::warn!(client = %self.id.client_id, sha256 = %scored.sha256, "cannot score the released model: {e}");
                self.status.last_error = e;
            }
        }
        self.publish_status();
    }

    /// A decoded release of this device's federation, not of a run it has left (unless it
    /// serves that run); a refused one goes into `last_error`.
    fn ours(
        &mut self,
        decoded: Result<Option<ModelRelease>, String>,
        what: &str,
    ) -> Option<ModelRelease> {
        let release = match decoded {
            Ok(release) => release?,
            Err(e) => {
                tracing::warn!(client = %self.id.client_id, "{what} refused: {e}");
                self.status.last_error = format!("{what} refused: {e}");
                self.publish_status();
                return None;
            }
        };
        // A run of 0 is never a left one (the state's empty slots are 0).
        let left = release.run != 0
            && self.state.past_runs.contains(&release.run)
            && self.releases.served().is_none_or(|s| s.run != release.run);
        (release.federation == self.id.federation && !left).then_some(release)
    }

    /// Switches to the release the device must serve, if that changes ([`Output::Serve`], the
    /// status's `serving` and `model_round`); `arrived` is a release just received. Returns
    /// whether it switched.
    fn follow(&mut self, arrived: Option<&[u8; 32]>) -> bool {
        let Some(release) = self.releases.to_serve(arrived).cloned() else {
            return false;
        };
        tracing::info!(client = %self.id.client_id, round = release.round, sha256 = %release.sha256_hex(), "serving another release");
        self.status.serving = Some(release.sha256_hex());
        self.status.model_round = Some(release.round);
        self.releases.serve(&release);
        self.outputs.push_back(Output::Serve(Box::new(release)));
        true
    }
}
