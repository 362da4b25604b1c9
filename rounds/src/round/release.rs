//! The model in use: the release of the global head with the federation's class list, made
//! after every aggregation ([`Output::Release`]) for the driver to publish retained on
//! `model/current` and keep in the state folder, and what evaluation-only sites say of it.

use fedge_wire::{ModelRelease, TensorF32};

use std::collections::BTreeMap;

use super::{Output, Rounds};

/// Most evaluation-only sites whose accuracy the machine keeps (the metrics message stays
/// small whatever writes statuses).
pub(super) const MAX_SITES: usize = 1024;

impl Rounds {
    /// The global head as a release for `round` (the round whose aggregate it is), when the
    /// configuration names the head and the parameters hold it.
    pub fn release(&self, round: u64) -> Option<ModelRelease> {
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
            pooled: self
                .pooled
                .clone()
                .filter(|_| self.config.train.feature_norm.pools()),
        })
    }

    /// Queues the release of `round`'s aggregate, if there is one to make.
    pub(super) fn push_release(&mut self, round: u64) {
        if let Some(release) = self.release(round) {
            self.outputs.push_back(Output::Release(Box::new(release)));
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
