//! The federation's pooled feature summary (docs/algorithms.md §7): when the round's
//! `feature_norm` pools, every update carries the device's summary of its training rows, and
//! each aggregated round folds the accepted ones into the federation's, which the next task
//! and every release carry.
//!
//! The fold is a decayed merge, `S ← merge(γ·S, S_round)` with γ = [`POOLED_DECAY`]: with
//! client sampling, a round's few devices would make the statistics jump, while older rounds
//! still speak for devices not drawn lately; a site whose data changed fades out of the pool
//! over a few rounds. A device weighs by its rows, capped as its delta is
//! (`max_weight_ratio`). A site aggregator passes the global summary on and sends its round's
//! merged one upstream (`relay`); it keeps none of its own.

use fedge_wire::FeatureSummary;

use super::ResumeError;
use super::Rounds;
use super::open::OpenRound;

/// The weight each aggregated round keeps of the pooled summary before it.
pub const POOLED_DECAY: f64 = 0.8;

impl Rounds {
    /// The federation's pooled feature summary, once devices sent theirs.
    pub fn pooled(&self) -> Option<&FeatureSummary> {
        self.pooled.as_ref()
    }

    /// Folds the aggregated round's accepted summaries into the pooled one (not on a site).
    pub(super) fn fold_pooled(&mut self, open: &OpenRound) {
        if self.is_site() {
            return;
        }
        let Some(round) = open.merged_features() else {
            return;
        };
        let merged = match self.pooled.take() {
            Some(before) => FeatureSummary::merge([before.scaled(POOLED_DECAY), round].iter()),
            None => Some(round),
        };
        self.pooled = merged;
    }

    /// The saved pooled summary, checked against the head.
    pub(super) fn restore_pooled(
        &mut self,
        saved: Option<FeatureSummary>,
    ) -> Result<(), ResumeError> {
        let Some(saved) = saved else {
            return Ok(());
        };
        if let Some(head) = &self.config.head {
            saved
                .check(head.classes, head.features)
                .map_err(ResumeError::Pooled)?;
        }
        self.pooled = Some(saved);
        Ok(())
    }
}
