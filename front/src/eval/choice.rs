//! The device's per-site choice (`fedge_device::site_choice`, what `fedge-edge` serves with
//! `[inference] adapt = "choose"`) scored at the held-out site: `/tta=choose` gives it the
//! site's calibration rows without their labels, as a site that has labelled nothing;
//! `/tta=choose-labelled` also reads those rows' labels, as a site that labelled the images it
//! calibrated on. Either way it runs on the release a device of the federation receives (the
//! round's aggregate with the pool its head was trained with) and is scored on the site's
//! other rows, which it never reads.

use std::sync::atomic::{AtomicU64, Ordering};

use fedge_device::FeatureSet;
use fedge_device::site_choice::{SiteRows, choose_at_site};
use fedge_wire::{ModelRelease, SiteVariant};

use super::TargetSite;

/// How often each variant served in this process so far (release, prior-em, correction): one
/// count per scoring, every aggregated round of every run.
static SERVED: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

fn slot(variant: SiteVariant) -> usize {
    match variant {
        SiteVariant::Release => 0,
        SiteVariant::PriorEm => 1,
        SiteVariant::Correction => 2,
    }
}

/// Scorings so far where the choice served the release as it is, `prior-em` and the
/// correction, for the summary `fedge eval` prints.
pub fn served_counts() -> [(SiteVariant, u64); 3] {
    [
        SiteVariant::Release,
        SiteVariant::PriorEm,
        SiteVariant::Correction,
    ]
    .map(|v| (v, SERVED[slot(v)].load(Ordering::Relaxed)))
}

/// The accuracy on `site`'s scored rows of what the per-site choice serves of `release`, the
/// calibration rows' labels read only when `labelled`; with the variant served.
pub fn choice_accuracy(
    release: &ModelRelease,
    site: &TargetSite,
    labelled: bool,
    seed: u64,
) -> anyhow::Result<(f32, SiteVariant)> {
    let calibration = &site.calibration;
    let no_labels = FeatureSet {
        dim: calibration.dim,
        ..FeatureSet::default()
    };
    let rows = SiteRows {
        unlabelled: calibration,
        labelled: if labelled { calibration } else { &no_labels },
    };
    // A site with no training rows of its own, as an evaluation site is.
    let device = fedge_models::training_device(fedge_models::Backend::default());
    let (served, _) = choose_at_site(&device, release, &FeatureSet::default(), rows, seed);
    SERVED[slot(served.variant)].fetch_add(1, Ordering::Relaxed);
    let accuracy = (served.accuracy(&release.head, &release.params.to_vec(), &site.scored))
        .ok_or_else(|| anyhow::anyhow!("the release's parameters do not fit its head"))?;
    Ok((accuracy, served.variant))
}
