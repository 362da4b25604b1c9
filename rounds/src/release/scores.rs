//! The evaluation sites' scores the gate takes (docs/algorithms.md §11): only from the
//! devices named in `[release] evaluators` and not banned, of a release this pipeline made,
//! within range and tied to their counts.

use fedge_wire::{PairedScore, SiteEvaluation};

use super::{ReleaseFlow, ReleaseMode, SCORES_PER_SITE, Score};

/// Most images an evaluation site may say it scored.
pub const MAX_SCORED_IMAGES: u32 = 10_000_000;

impl ReleaseFlow {
    /// Keeps an evaluation site's score when the gate may use it, or says why not.
    pub(super) fn take_score(
        &mut self,
        client: &str,
        sha: &str,
        evaluation: &SiteEvaluation,
        status: &fedge_wire::EdgeStatus,
        now_ms: u64,
    ) -> Result<(), String> {
        if self.config.mode != ReleaseMode::Gated {
            return Ok(());
        }
        if !self.config.evaluators.iter().any(|e| e == client) {
            return Err(format!(
                "a score from {client}, not an evaluation site of [release] evaluators"
            ));
        }
        if self.excluded.contains(client) {
            return Err(format!("a score from {client}, which is banned"));
        }
        if !self.knows(sha) {
            // A candidate of this pipeline's from before a restart (candidates are not kept):
            // compared with a release it knows, it is no forgery, and there is nothing to judge.
            if status
                .paired
                .as_ref()
                .is_some_and(|p| self.knows(&p.against))
            {
                tracing::debug!(
                    client,
                    sha,
                    "a score of a candidate from before the restart"
                );
                return Ok(());
            }
            return Err(format!(
                "a score of release {}, which this coordinator did not make (another run's?)",
                sha.get(..12).unwrap_or(sha)
            ));
        }
        check_score(evaluation, status.paired.as_ref())?;
        let site = self.scores.entry(client.to_owned()).or_default();
        // Tied to its counts: the site's own score of the release compared with, on as many
        // images, must differ from this one by (gained − lost) / images.
        if let Some(paired) = &status.paired
            && let Some(served) = site.iter().find(|s| s.sha == paired.against)
            && served.evaluation.samples == paired.samples
        {
            let n = f64::from(paired.samples);
            let said = f64::from(evaluation.accuracy) - f64::from(served.evaluation.accuracy);
            let counted = (f64::from(paired.gained) - f64::from(paired.lost)) / n;
            if (said - counted).abs() > 1.5 / n + 1e-6 {
                return Err(format!(
                    "{client}'s scores differ by {said:.4} but its paired counts by {counted:.4}"
                ));
            }
        }
        site.retain(|s| s.sha != sha);
        site.push_back(Score {
            sha: sha.to_owned(),
            evaluation: evaluation.clone(),
            paired: status.paired.clone(),
        });
        while site.len() > SCORES_PER_SITE {
            site.pop_front();
        }
        self.judge(now_ms, false);
        Ok(())
    }
}

/// Why an evaluation site's score cannot be true: accuracies outside [0, 1] or not a whole
/// number of its images, paired counts beyond the images or of another number of them.
fn check_score(evaluation: &SiteEvaluation, paired: Option<&PairedScore>) -> Result<(), String> {
    let n = evaluation.samples;
    if n == 0 || n > MAX_SCORED_IMAGES {
        return Err(format!(
            "a score of {n} images (give 1 to {MAX_SCORED_IMAGES})"
        ));
    }
    let fraction = |a: f32| a.is_finite() && (0.0..=1.0).contains(&a);
    if !fraction(evaluation.accuracy)
        || !evaluation
            .class_accuracy
            .iter()
            .flatten()
            .all(|a| fraction(*a))
    {
        return Err(format!(
            "an accuracy outside 0 to 1 ({})",
            evaluation.accuracy
        ));
    }
    let right = f64::from(evaluation.accuracy) * f64::from(n);
    if (right - right.round()).abs() > 0.1 + f64::from(n) * 1e-7 {
        return Err(format!(
            "accuracy {} is not a whole number of its {n} images",
            evaluation.accuracy
        ));
    }
    if let Some(paired) = paired {
        paired.check()?;
        if paired.samples != n {
            return Err(format!(
                "paired counts over {} images, the score over {n}",
                paired.samples
            ));
        }
    }
    Ok(())
}
