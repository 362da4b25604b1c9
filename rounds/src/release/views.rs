//! Read-only views of the pipeline for the coordinator's status and metrics: the candidate
//! waiting, and the evaluation sites' kept scores of one release.

use std::collections::BTreeMap;

use fedge_wire::ModelRelease;

use super::ReleaseFlow;

impl ReleaseFlow {
    /// The candidate waiting for the gate, held or not, if any.
    pub fn candidate(&self) -> Option<&ModelRelease> {
        self.candidate.as_ref().map(|(release, _)| release)
    }

    /// Each evaluation site's accuracy of the release with this SHA-256 (hex), by client id,
    /// from the scores the gate keeps (`gated` mode: the sites of `evaluators`, not banned, up
    /// to their last few releases); empty when none scored it, and in `direct` mode, which
    /// keeps no scores.
    pub fn site_scores(&self, sha256: &str) -> BTreeMap<String, f32> {
        (self.scores.iter())
            .filter_map(|(site, scores)| {
                let score = scores.iter().rev().find(|s| s.sha == sha256)?;
                Some((site.clone(), score.evaluation.accuracy))
            })
            .collect()
    }
}
