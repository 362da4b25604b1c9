//! What the demo's unseen site is served after the run: the per-site choice of a serving
//! device (`fedge_device::site_choice`, the rule `fedge-edge` applies with `[inference] adapt =
//! "choose"`) on the final release. The site holds a quarter of its images labelled (every
//! fourth), which the choice judges on, and is scored on the other three quarters; its
//! label-free adaptation reads all of its images without their labels, as a serving site reads
//! its requests.

use fedge_device::FeatureSet;
use fedge_device::site_choice::{SiteRows, SiteServing, choose_at_site};
use fedge_wire::{ModelRelease, SiteVariant};
use serde::Serialize;

/// The choice at the unseen site and what it is worth there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Served {
    /// The variant served.
    pub variant: SiteVariant,
    /// Why.
    pub reason: String,
    /// Labelled images the choice judged on, and images scored.
    pub labelled: usize,
    pub scored: usize,
    /// Accuracy on the scored images of the release as it is, and of what is served.
    pub release: f32,
    pub served: f32,
}

/// The choice on `release` at the site whose images are `target`, trained on `backend`.
pub fn at_site(
    target: &FeatureSet,
    release: &ModelRelease,
    backend: fedge_models::Backend,
    seed: u64,
) -> Option<Served> {
    let params = release.verify().ok()?;
    let (labelled, scored): (Vec<usize>, Vec<usize>) = (0..target.len()).partition(|i| i % 4 == 0);
    let (labelled, scored) = (target.rows(&labelled), target.rows(&scored));
    let device = fedge_models::training_device(backend);
    let rows = SiteRows {
        unlabelled: target,
        labelled: &labelled,
    };
    let (served, base) = choose_at_site(&device, release, &FeatureSet::default(), rows, seed);
    let accuracy = |s: &SiteServing| s.accuracy(&release.head, &params, &scored);
    Some(Served {
        release: accuracy(&SiteServing::release(base, ""))?,
        served: accuracy(&served)?,
        variant: served.variant,
        reason: served.reason,
        labelled: labelled.len(),
        scored: scored.len(),
    })
}
