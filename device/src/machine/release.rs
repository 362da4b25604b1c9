//! The machine's side of released models: which to keep, serve and score (see the parent's
//! "Decisions"), the serving pointer, and the evaluation-only device's score in its status.

use fedge_wire::{ModelRelease, Role, decode_release_within, decode_serving};

use super::serving::{Scored, release_fits};
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
            self.outputs
                .push_back(Output::Score(Box::new(release), None));
        }
    }

    /// A payload on `model/current` (a whole release or one of its chunks).
    pub fn handle_model_bytes(&mut self, payload: &[u8], now_ms: u64) {
        if payload.is_empty() {
            return;
        }
        self.model_reassembler.expire(now_ms);
        let (client, key) = (self.id.client_id.as_str(), self.id.key.as_ref());
        // Its sizes before it is unpacked, verified or kept: a forged release is bounded by
        // what the device can hold, not by the broker's message limit.
        let (head, budget) = (self.head.as_ref(), self.id.memory_budget_mb);
        let fits = |release: &ModelRelease| release_fits(release, head, budget);
        let reassembler = &mut self.model_reassembler;
        let decoded = decode_release_within(reassembler, payload, now_ms, client, key, fits);
        let Some(release) = self.of_federation(decoded, "released model") else {
            return;
        };
        // A release of a run the device has left is kept all the same (a rollback to it sends
        // it again, and only a pointer naming it makes it served: its round is below the one
        // served), but it is not scored.
        let left = self.left(&release);
        let sha256 = release.sha256;
        let new = self.releases.keep(release);
        let evaluates = self.id.role == Role::Evaluate && !left;
        let scoring = new && evaluates && self.releases.first_score(sha256);
        // Only a pointer naming it makes one of a left run served.
        let switched = self.follow((!left).then_some(&sha256));
        if scoring && let Some(release) = self.releases.get(&sha256) {
            self.outputs
                .push_back(Output::Score(Box::new(release.clone()), None));
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
        let (head, budget) = (self.head.as_ref(), self.id.memory_budget_mb);
        let fits = |candidate: &ModelRelease| release_fits(candidate, head, budget);
        let reassembler = &mut self.candidate_reassembler;
        let decoded = decode_release_within(reassembler, payload, now_ms, client, key, fits);
        let Some(candidate) = self.ours(decoded, "candidate model") else {
            return;
        };
        self.releases.set_candidate(candidate.clone());
        if self.releases.first_score(candidate.sha256) {
            // Scored against the release served, on the same images: the gate's paired test.
            let served = (self.releases.served())
                .filter(|s| s.sha256 != candidate.sha256)
                .map(|s| Box::new(s.clone()));
            self.outputs
                .push_back(Output::Score(Box::new(candidate), served));
        }
    }

    /// A payload on `model/serving`: a pointer of the device's federation (with a key, sealed
    /// for this device) above the last one taken is taken, and the device serves the release
    /// it names for it as soon as it holds it. The one taken again (retained, at each
    /// reconnect) is ignored quietly; one numbered below is refused and said in the status
    /// (`last_error`) and the summary: the device will not follow that coordinator's pointers.
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
            return self.pointer_not_above(pointer.seq, kept);
        }
        if let Err(last) = self.releases.take_pointer(&pointer, client) {
            return self.pointer_not_above(pointer.seq, last);
        }
        // Kept across a restart with the round state.
        self.state.serving_seq = pointer.seq;
        self.outputs.push_back(Output::Save(self.state.clone()));
        if self.follow(None) {
            self.publish_status();
        }
    }

    /// A pointer numbered `seq` that was not taken, `last` being the last one taken: the same
    /// one again is nothing to report; one below it is refused visibly.
    fn pointer_not_above(&mut self, seq: u64, last: u64) {
        let client = self.id.client_id.as_str();
        if seq >= last {
            tracing::debug!(client = %client, seq, "serving pointer already taken");
            return;
        }
        let error = format!(
            "serving pointer {seq} refused: not above {last}, the last one this device took (a \
             replay, or a coordinator whose clock went back and whose state folder was lost): \
             this device keeps serving what it serves until a pointer numbered above {last}"
        );
        tracing::warn!(client = %client, "{error}");
        self.summary.pointers_refused += 1;
        self.status.last_error = error;
        self.publish_status();
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

    /// The device serves `choice`, a variant of its release chosen for its site: it goes into
    /// the status, published at once when it changed.
    pub fn handle_site_choice(&mut self, choice: Option<fedge_wire::SiteChoice>) {
        if self.status.site_choice == choice {
            return;
        }
        self.status.site_choice = choice;
        self.publish_status();
    }

    /// An evaluation-only device scored a release or a candidate (or could not: the error goes
    /// into `last_error`); the status says which one its `evaluation` is of.
    pub fn handle_evaluated(&mut self, scored: Scored) {
        match scored.result {
            Ok(evaluation) => {
                self.status.samples = evaluation.samples;
                self.status.evaluation = Some(evaluation);
                self.status.evaluated = Some(scored.sha256);
                self.status.paired = scored.paired;
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
        self.of_federation(decoded, what)
            .filter(|release| !self.left(release))
    }

    /// A decoded release of this device's federation; a refused one goes into `last_error`.
    fn of_federation(
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
        (release.federation == self.id.federation).then_some(release)
    }

    /// Whether `release` is of a run the device has left and does not serve.
    fn left(&self, release: &ModelRelease) -> bool {
        // A run of 0 is never a left one (the state's empty slots are 0).
        release.run != 0
            && self.state.past_runs.contains(&release.run)
            && self.releases.served().is_none_or(|s| s.run != release.run)
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
        // The candidate waiting is compared again, with what is served now.
        if self.id.role == Role::Evaluate
            && let Some(candidate) = self.releases.candidate()
        {
            let again = Output::Score(Box::new(candidate.clone()), Some(Box::new(release.clone())));
            self.outputs.push_back(again);
        }
        self.outputs.push_back(Output::Serve(Box::new(release)));
        true
    }
}
