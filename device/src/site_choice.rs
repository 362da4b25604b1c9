//! The per-site choice (docs/algorithms.md §10, "The per-site choice"): what a device serves on
//! top of the release it was told to serve, among
//!
//! - the release as it is ([`SiteVariant::Release`]), standardised as its `feature_norm` says;
//! - its label-free adaptation ([`SiteVariant::PriorEm`], [`crate::site_norm::label_shift`]):
//!   the site's class prior and feature map from the site's rows, labels unread;
//! - the site's correction of its head ([`SiteVariant::Correction`], [`crate::site_head`]),
//!   trained on the site's labelled rows.
//!
//! The rule cannot serve worse than the release beyond noise: a variant replaces what serves
//! only when the gate's paired test finds it better on the site's labelled rows (the rows the
//! release did not train on: a device's held-back share, an evaluation site's samples); the
//! correction is judged against what serves by then, each row scored by a correction that did
//! not train on it. Without enough labelled rows ([`min_labelled`]) the release serves as it is:
//! no correction, and no label-free variant either, since a fit that explains the site's rows
//! better than the pool does can still carry them onto the wrong classes. Pure computation:
//! the device's driver runs it off its loop and installs what it returns.

use fedge_models::HeadConfig;
use fedge_models::head::{Forward, argmax};
use fedge_wire::{FeatureNorm, ModelRelease, SiteVariant};

use crate::features::FeatureSet;
use burn::prelude::Device;

use crate::site_head::{Corrector, SiteHeadSettings};
use crate::site_norm::{FeatureStats, prior_shift, standardised};

/// The fewest labelled rows the device compares variants on: two per fold of the correction's
/// judgement (with fewer, no variant can pass the paired test anyway: it needs five gains and
/// no loss at the 5 % level).
pub fn min_labelled(corrector: &Corrector<'_>) -> usize {
    2 * corrector.settings.folds.max(2)
}

/// What a site serves: the variant, and what it takes to serve it.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteServing {
    /// The variant.
    pub variant: SiteVariant,
    /// What the features are standardised with (`None`: as the backbone made them).
    pub stats: Option<FeatureStats>,
    /// The head's parameters when they are not the release's (the correction).
    pub params: Option<Vec<f32>>,
    /// Added to the head's logits, one per class (the label-free prior correction).
    pub log_ratio: Option<Vec<f32>>,
    /// Why, in words (the status and the log say it).
    pub reason: String,
}

impl SiteServing {
    /// The release as it is, standardised with `stats`.
    pub fn release(stats: Option<FeatureStats>, reason: impl Into<String>) -> Self {
        Self {
            variant: SiteVariant::Release,
            stats,
            params: None,
            log_ratio: None,
            reason: reason.into(),
        }
    }

    /// Whether its statistics, parameters and prior correction have the sizes of `head`; why
    /// not otherwise.
    pub fn fits(&self, head: &HeadConfig) -> Result<(), String> {
        let sizes = [
            (
                "statistics",
                self.stats.as_ref().map(|s| s.mean.len()),
                head.features,
            ),
            (
                "parameters",
                self.params.as_ref().map(Vec::len),
                head.num_params(),
            ),
            (
                "prior correction",
                self.log_ratio.as_ref().map(Vec::len),
                head.classes,
            ),
        ];
        match sizes
            .into_iter()
            .find(|(_, got, want)| got.is_some_and(|g| g != *want))
        {
            Some((what, got, want)) => Err(format!(
                "its {what} hold {} values, the release's head takes {want}",
                got.unwrap_or_default()
            )),
            None => Ok(()),
        }
    }

    /// The classes this variant of a release (head `head`, parameters `release`) answers for
    /// `rows` (unstandardised); `None` when the parameters or rows do not fit the head.
    pub fn answers(
        &self,
        head: &HeadConfig,
        release: &[f32],
        rows: &FeatureSet,
    ) -> Option<Vec<usize>> {
        let params = self.params.as_deref().unwrap_or(release);
        let tensors = head.split(params).ok()?;
        let rows = standardised(self.stats.as_ref(), rows);
        let mut forward = Forward::new(head);
        let dim = head.features;
        if rows.dim != dim {
            return None;
        }
        let answers = (rows.features.chunks_exact(dim.max(1)))
            .map(|x| {
                let mut logits = forward.logits(&tensors, x).to_vec();
                if let Some(ratio) = &self.log_ratio {
                    logits.iter_mut().zip(ratio).for_each(|(l, r)| *l += r);
                }
                argmax(&logits)
            })
            .collect();
        Some(answers)
    }
}

impl SiteServing {
    /// The share of the labelled `rows` (unstandardised) this variant of a release (head
    /// `head`, parameters `release`) answers right; `None` when they do not fit the head.
    pub fn accuracy(&self, head: &HeadConfig, release: &[f32], rows: &FeatureSet) -> Option<f32> {
        let answers = self.answers(head, release, rows)?;
        let right = (answers.iter().zip(&rows.labels))
            .filter(|(a, y)| **a == **y as usize)
            .count();
        Some(right as f32 / rows.len().max(1) as f32)
    }
}

/// What a site holds to choose with.
#[derive(Clone, Copy)]
pub struct SiteRows<'a> {
    /// The site's rows, labels unread (what it sees: its data, or its requests).
    pub unlabelled: &'a FeatureSet,
    /// Labelled rows the release did not train on.
    pub labelled: &'a FeatureSet,
}

/// Chooses what the site serves of `release` (verified parameters `params`), which it
/// standardises with `base` as the release's `feature_norm` says (the module's comment).
/// Deterministic for a given `seed`. A training error of the correction leaves what serves by
/// then, with the error in the reason.
pub fn choose(
    release: &ModelRelease,
    params: &[f32],
    base: Option<FeatureStats>,
    rows: SiteRows<'_>,
    corrector: &Corrector<'_>,
    seed: u64,
) -> SiteServing {
    let head = &release.head;
    if head.tail.is_some() {
        return SiteServing::release(
            base,
            "the release trains the backbone's tail: served as it is",
        );
    }
    let labelled = rows.labelled;
    let judged = labelled.len() >= min_labelled(corrector) && labelled.dim == head.features;
    let mut serves = SiteServing::release(base, "");
    let mut why = Vec::new();
    // The label-free variant, where the head learnt on the pooled statistics, judged on the
    // labelled rows. Without them it is not even fitted: a class mix and a feature shift
    // explain a site's rows together and can trade off, so a fit that explains the rows better
    // can still carry them onto the wrong classes (docs/algorithms.md §10).
    match (release.feature_norm, &release.pooled) {
        (FeatureNorm::Pooled, Some(_)) if !judged => why.push(format!(
            "no prior-em: it serves only when better on labelled rows, and fewer than {} are here",
            min_labelled(corrector)
        )),
        (FeatureNorm::Pooled, Some(pooled)) => {
            match prior_shift(
                pooled,
                &rows.unlabelled.features,
                rows.unlabelled.dim,
                head,
                params,
            ) {
                Some(fit) if fit.accepted() => {
                    let candidate = SiteServing {
                        variant: SiteVariant::PriorEm,
                        stats: Some(fit.stats),
                        params: None,
                        log_ratio: Some(fit.log_ratio),
                        reason: String::new(),
                    };
                    let (gained, lost) = discordant(head, params, &serves, &candidate, labelled);
                    let p = fedge_wire::paired::improvement_p(gained, lost);
                    let better = p < corrector.settings.significance;
                    why.push(format!(
                        "prior-em {} on {} labelled rows: {gained} gained, {lost} lost (p = \
                         {p:.3})",
                        if better {
                            "better"
                        } else {
                            "not better beyond noise"
                        },
                        labelled.len()
                    ));
                    if better {
                        serves = candidate;
                    }
                }
                Some(fit) => why.push(format!("prior-em not fitted ({:?})", fit.outcome)),
                None => why.push("prior-em cannot read the release's pooled summary".into()),
            }
        }
        (FeatureNorm::Pooled, None) => why.push(
            "no prior-em: the release carries no pooled summary (its devices sent none: under \
             local DP, or behind site aggregators)"
                .into(),
        ),
        (norm, _) => why.push(format!(
            "prior-em adapts a head trained under feature_norm = pooled, not {}",
            norm.name()
        )),
    }
    // The correction, judged against what serves by now.
    match judged {
        false => why.push(format!(
            "no correction: {} labelled rows, {} needed",
            labelled.len(),
            min_labelled(corrector)
        )),
        true => match correction(head, params, &serves, labelled, corrector, seed) {
            Ok((Some(corrected), counts)) => {
                why.push(format!("the correction is better: {counts}"));
                serves = SiteServing {
                    variant: SiteVariant::Correction,
                    stats: serves.stats,
                    params: Some(corrected),
                    log_ratio: None,
                    reason: String::new(),
                };
            }
            Ok((None, counts)) => why.push(format!(
                "the correction is not better beyond noise: {counts}"
            )),
            Err(e) => why.push(format!("the correction failed to train: {e}")),
        },
    }
    serves.reason = format!("{}: {}", serves.variant.name(), why.join("; "));
    serves
}

/// [`choose`] with the default settings of the correction ([`SiteHeadSettings::default`]),
/// trained on the Burn `device`: what a serving device runs.
pub fn choose_on(
    device: &Device,
    release: &ModelRelease,
    params: &[f32],
    base: Option<FeatureStats>,
    rows: SiteRows<'_>,
    seed: u64,
) -> SiteServing {
    let corrector = Corrector {
        head: &release.head,
        settings: SiteHeadSettings::default(),
        device,
    };
    choose(release, params, base, rows, &corrector, seed)
}

/// [`choose_on`] for a site that simulation builds (`fedge demo`, `fedge eval`, the benchmarks):
/// it standardises as a device with training rows `train` (none for a serving-only site) does
/// to use `release` (`site_norm::release_stats`, its other rows `rows.unlabelled`, whose labels
/// are never read), the release's own parameters. Also returns that standardisation, which the
/// release as it is serves with.
pub fn choose_at_site(
    device: &Device,
    release: &ModelRelease,
    train: &FeatureSet,
    rows: SiteRows<'_>,
    seed: u64,
) -> (SiteServing, Option<FeatureStats>) {
    let unlabelled = FeatureSet {
        labels: vec![0; rows.unlabelled.len()],
        ..rows.unlabelled.clone()
    };
    let base = crate::site_norm::release_stats(release, train, &unlabelled);
    let rows = SiteRows {
        unlabelled: &unlabelled,
        labelled: rows.labelled,
    };
    let params = release.params.to_vec();
    let served = choose_on(device, release, &params, base.clone(), rows, seed);
    (served, base)
}

/// Rows only `candidate` gets right, and rows only `current` does.
fn discordant(
    head: &HeadConfig,
    params: &[f32],
    current: &SiteServing,
    candidate: &SiteServing,
    labelled: &FeatureSet,
) -> (u32, u32) {
    let (Some(a), Some(b)) = (
        current.answers(head, params, labelled),
        candidate.answers(head, params, labelled),
    ) else {
        return (0, 0);
    };
    let (mut gained, mut lost) = (0, 0);
    for ((&was, &now), &y) in a.iter().zip(&b).zip(&labelled.labels) {
        match (now == y as usize, was == y as usize) {
            (true, false) => gained += 1,
            (false, true) => lost += 1,
            _ => {}
        }
    }
    (gained, lost)
}

/// The correction of the release on `labelled` (standardised as `serves` standardises) when the
/// paired test finds it better than `serves`, with the comparison's counts in words.
fn correction(
    head: &HeadConfig,
    params: &[f32],
    serves: &SiteServing,
    labelled: &FeatureSet,
    corrector: &Corrector<'_>,
    seed: u64,
) -> Result<(Option<Vec<f32>>, String), crate::train::TrainError> {
    let baseline = serves.answers(head, params, labelled).unwrap_or_default();
    let rows = standardised(serves.stats.as_ref(), labelled);
    let judged = corrector.judge_against(params, &rows, &baseline, seed)?;
    let counts = format!(
        "{} gained, {} lost of {} labelled rows (p = {:.3})",
        judged.gained, judged.lost, judged.rows, judged.p_value
    );
    match judged.better(&corrector.settings) {
        true => Ok((Some(corrector.correct(params, &rows, seed)?), counts)),
        false => Ok((None, counts)),
    }
}

#[cfg(test)]
#[path = "site_choice_tests.rs"]
mod tests;
