//! What the driver does with the federation's class list: renumber the device's cached labels
//! onto it before training or scoring (`fedge_device::classes`), and score a released head on an
//! evaluation-only device's data.

use std::sync::Arc;

use fedge_models::HeadConfig;
use fedge_wire::{FeatureNorm, ModelRelease, PairedScore, SiteEvaluation};

use super::setup::AgentSetup;
use fedge_device::FeatureSet;
use fedge_device::classes::{self, UnknownClasses};
use fedge_device::site_norm::{FeatureStats, standardise};

/// Renumbers the labels of `setup`'s splits and views onto `federation` (no copy unless a
/// training or scoring thread still holds the data).
pub fn align(setup: &mut AgentSetup, federation: &[String]) -> Result<(), UnknownClasses> {
    if setup.class_names.as_slice() == federation {
        return Ok(());
    }
    classes::check(&setup.used_classes(), federation)?;
    let mut names = setup.class_names.clone();
    let train = Arc::make_mut(&mut setup.train);
    let val = Arc::make_mut(&mut setup.val);
    match setup.views.as_mut().map(Arc::make_mut) {
        Some(views) => {
            let mut sets: Vec<&mut FeatureSet> = vec![train, val, &mut views.objects];
            sets.extend(views.counterfactuals.iter_mut());
            classes::renumber(&mut sets, &mut names, federation)?
        }
        None => classes::renumber(&mut [train, val], &mut names, federation)?,
    }
    setup.class_names = names;
    Ok(())
}

/// The head of `setup` for a class list of `classes` names.
pub fn head_for(setup: &AgentSetup, classes: usize) -> HeadConfig {
    HeadConfig {
        classes,
        ..setup.head.clone()
    }
}

/// The class `release`'s head predicts for each of `setup`'s validation rows (all of an
/// evaluation-only device's samples), already aligned to the release's classes.
fn predictions(
    setup: &AgentSetup,
    release: &ModelRelease,
    site: Option<&FeatureStats>,
) -> Result<Vec<usize>, String> {
    let params = release.verify().map_err(|e| e.to_string())?;
    let data = &setup.val;
    if release.head.features != data.dim || release.head.hidden != setup.head.hidden {
        return Err(format!(
            "the released head is {}→{}→{}, this device's features are {} wide with a projector of {}",
            release.head.features,
            release.head.hidden,
            release.head.classes,
            data.dim,
            setup.head.hidden
        ));
    }
    // A normalised head: the site's statistics for the release, taken from the rows it
    // scores without their labels (`DeviceData::serving_stats`).
    let standardised = match release.feature_norm {
        FeatureNorm::None => None,
        _ => site.map(|s| standardise(s, data)),
    };
    let features = standardised
        .as_ref()
        .map_or(&data.features, |d| &d.features);
    fedge_models::head::predict_flat(&release.head, &params, features).map_err(|e| e.to_string())
}

/// Accuracy, overall and per class, of `release`'s head on `setup`'s validation data (all of
/// an evaluation-only device's samples), already aligned to the release's classes; with
/// `against` (the release served and its site statistics), also the paired counts of the
/// images only one of the two gets right.
pub fn score(
    setup: &AgentSetup,
    release: &ModelRelease,
    site: Option<&FeatureStats>,
    against: Option<(&ModelRelease, Option<&FeatureStats>)>,
) -> Result<(SiteEvaluation, Option<PairedScore>), String> {
    let predicted = predictions(setup, release, site)?;
    let labels = &setup.val.labels;
    let k = release.head.classes;
    let (mut right, mut seen) = (vec![0u32; k], vec![0u32; k]);
    for (&p, &y) in predicted.iter().zip(labels) {
        let y = y as usize;
        if y < k {
            seen[y] += 1;
            right[y] += u32::from(p == y);
        }
    }
    let total: u32 = seen.iter().sum();
    let correct: u32 = right.iter().sum();
    let evaluation = SiteEvaluation {
        model_round: release.round,
        accuracy: if total == 0 {
            0.0
        } else {
            correct as f32 / total as f32
        },
        class_accuracy: (right.iter().zip(&seen))
            .map(|(&r, &n)| (n > 0).then(|| r as f32 / n as f32))
            .collect(),
        samples: total,
    };
    let paired = match against {
        Some((served, stats)) => Some(paired(
            &predicted,
            &predictions(setup, served, stats)?,
            labels,
            k,
            served,
        )),
        None => None,
    };
    Ok((evaluation, paired))
}

/// The paired counts of two releases' predictions on the same labelled rows (rows of a class
/// beyond `k` do not count, as in the score).
fn paired(
    candidate: &[usize],
    served: &[usize],
    labels: &[u32],
    k: usize,
    against: &ModelRelease,
) -> PairedScore {
    let mut score = PairedScore {
        against: against.sha256_hex(),
        ..PairedScore::default()
    };
    for ((&c, &s), &y) in candidate.iter().zip(served).zip(labels) {
        let y = y as usize;
        if y >= k {
            continue;
        }
        score.samples += 1;
        match (c == y, s == y) {
            (true, false) => score.gained += 1,
            (false, true) => score.lost += 1,
            _ => {}
        }
    }
    score
}
