//! The model in use: the release of the global head with the federation's class list, made
//! after every aggregation ([`Output::Release`]) for the driver to publish retained on
//! `model/current` and keep in the state folder, and what evaluation-only sites say of it.

use fedge_wire::{ModelRelease, TensorF32};

use std::collections::BTreeMap;

use super::{Output, Rejection, Rounds};

/// Most evaluation-only sites whose accuracy the machine keeps (the metrics message stays
/// small whatever writes statuses).
pub(super) const MAX_SITES: usize = 1024;

impl Rounds {
    /// The global head as a release for `round` (the round whose aggregate it is), when the
    /// configuration names the head and the parameters hold it; with the federation's pooled
    /// summary as it stands.
    pub fn release(&self, round: u64) -> Option<ModelRelease> {
        self.release_with(round, None)
    }

    /// [`Rounds::release`] carrying `trained_with`, the pooled summary the round's task
    /// carried, when it carried one: the head was trained on features standardised with it, so
    /// a site must serve it with it, not with the pool folded since from the round's updates.
    /// A round whose task carried none (the federation's first) releases the pool folded from
    /// it, the nearest to the devices' own class-balanced statistics it trained with.
    fn release_with(
        &self,
        round: u64,
        trained_with: Option<&fedge_wire::FeatureSummary>,
    ) -> Option<ModelRelease> {
        let head = self.config.head.clone()?;
        let params = self.params.get(..head.num_params())?;
        Some(ModelRelease {
            federation: self.config.federation.clone(),
            run: self.config.run,
            round,
            strategy: self.strategy.name().to_owned(),
            classes: self.config.classes.clone(),
            backbone: self.config.backbone.clone(),
            sha256: ModelRelease::digest(params),
            params: TensorF32::from_slice(params),
            head,
            feature_norm: self.config.train.feature_norm,
            pooled: (trained_with.or(self.pooled.as_ref()))
                .cloned()
                .filter(|_| self.config.train.feature_norm.pools()),
        })
    }

    /// Hands `round`'s aggregate, if there is a release to make, to the release pipeline
    /// (`crate::release`): released at once, or a candidate.
    pub(super) fn push_release(
        &mut self,
        round: u64,
        trained_with: Option<&fedge_wire::FeatureSummary>,
        now_ms: u64,
    ) {
        if let Some(release) = self.release_with(round, trained_with) {
            self.releases.aggregated(release, now_ms);
            self.take_release_steps();
        }
    }

    /// Sets how aggregates become served releases (`[release]`); call before the first round.
    pub fn set_release_config(&mut self, config: crate::release::ReleaseConfig) {
        let federation = self.config.federation.clone();
        self.releases = crate::release::ReleaseFlow::new(config, &federation);
    }

    /// The release pipeline: what is served, the candidate, the gate's verdict.
    pub fn releases(&self) -> &crate::release::ReleaseFlow {
        &self.releases
    }

    /// After a restart: the releases kept in the state folder, oldest first, the last the one
    /// devices serve (an operator's pin comes back with the operator settings).
    pub fn restore_served(&mut self, kept: Vec<ModelRelease>) {
        self.releases.restore(kept);
    }

    /// `ctl rollback` (with its target) and `ctl promote` (`None`): taken at once; an error
    /// says why not, for `bad_control`.
    pub(super) fn release_control(
        &mut self,
        rollback: Option<Option<&str>>,
        now_ms: u64,
    ) -> Result<(), String> {
        match rollback {
            Some(target) => self.releases.rollback(target)?,
            None => self.releases.promote_now(now_ms)?,
        }
        self.take_release_steps();
        Ok(())
    }

    /// A believed device status, for the pipeline: what it serves, its drift alarms and an
    /// evaluation-only site's score.
    pub(super) fn release_status(
        &mut self,
        client: &str,
        status: &fedge_wire::EdgeStatus,
        now_ms: u64,
    ) {
        self.releases.exclude(&self.control.banned);
        let keyed = self.config.auth.is_some();
        if let Err(detail) = self.releases.device_status(client, status, keyed, now_ms) {
            self.reject(client, Rejection::Score, detail);
        }
        self.take_release_steps();
    }

    /// Time passed, for the pipeline: a candidate's timeout, a canary's window.
    pub(super) fn release_tick(&mut self, now_ms: u64) {
        self.releases.tick(now_ms);
        self.take_release_steps();
    }

    /// The pipeline's steps as the machine's outputs.
    fn take_release_steps(&mut self) {
        use crate::release::Step;
        let mut changed = false;
        while let Some(step) = self.releases.poll_step() {
            changed = true;
            self.outputs.push_back(match step {
                Step::Candidate(release) => Output::Candidate(release),
                Step::Release(release) => Output::Release(release),
                Step::Pointer(pointer) => Output::Serving(pointer),
                Step::Event(event) => Output::ReleaseEvent(event),
            });
        }
        if changed {
            self.outputs.push_back(Output::StatusChanged);
        }
    }

    /// The latest accuracy each evaluation-only device reported, by client id.
    pub fn site_accuracy(&self) -> &BTreeMap<String, f32> {
        &self.site_accuracy
    }

    /// Keeps an evaluation-only device's accuracy (an admitted status's); a value outside
    /// `[0, 1]` is ignored, and past [`MAX_SITES`] sites only known ones are updated.
    pub(super) fn record_site_accuracy(&mut self, client: &str, accuracy: f32) {
        let known = self.site_accuracy.contains_key(client);
        if (0.0..=1.0).contains(&accuracy) && (known || self.site_accuracy.len() < MAX_SITES) {
            self.site_accuracy.insert(client.to_owned(), accuracy);
            self.outputs.push_back(Output::StatusChanged);
        }
    }
}
