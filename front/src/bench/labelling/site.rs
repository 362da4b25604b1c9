//! The deployed site of `fedge bench labelling`: its data as features (the five training
//! sites, the blurred stream it serves and the images that score it), the statistics and
//! answers of what it serves, and what the device's per-site choice serves it
//! (`fedge_device::site_choice`).

use std::sync::Arc;

use fedge_device::FeatureSet;
use fedge_device::labelling::uncertainty;
use fedge_device::site_choice::{SiteRows, choose_at_site};
use fedge_device::site_norm::{FeatureNorm, FeatureStats, FeatureSummary, SiteNorm};
use fedge_device::train::DeviceData;
use fedge_edge::data::ImageSet;
use fedge_models::head::argmax;
use fedge_models::{Backbone, Forward, HeadConfig};
use fedge_wire::{ModelRelease, SiteVariant};

use crate::datasets::SENSORS;
use crate::eval::{VAL_FRACTION, split_features};

/// The deployed site's client id (and sensor).
pub const SITE: &str = "blurred";

/// One seed's data as features: the five training sites, the deployed site's stream and its
/// held-out images.
pub(super) struct SeedData {
    pub(super) sites: Vec<(String, DeviceData)>,
    pub(super) stream: FeatureSet,
    pub(super) test: FeatureSet,
    pub(super) classes: usize,
}

pub(super) fn seed_data(
    backbone: &Backbone,
    all: &ImageSet,
    seed: u64,
    stream: usize,
) -> anyhow::Result<SeedData> {
    let features = |set: &ImageSet| -> anyhow::Result<FeatureSet> {
        let shape = (set.channels, set.height, set.width);
        Ok(FeatureSet {
            dim: backbone.card().feature_size,
            features: backbone.features_of(&set.images, shape, set.raw_max, 64)?,
            labels: set.labels.clone(),
        })
    };
    let mut halves = all.partition(2, seed);
    let deployed = halves.pop().expect("two halves");
    let sensors = SENSORS.iter().filter(|s| s.name != SITE);
    let parts = halves[0].partition(sensors.clone().count(), seed ^ 0x5175);
    let mut sites = Vec::new();
    for (i, (part, sensor)) in parts.iter().zip(sensors).enumerate() {
        let seen = features(&sensor.apply(part, seed ^ (i as u64 + 1)))?;
        let (train, val) = split_features(&seen, VAL_FRACTION, seed ^ (i as u64 + 1));
        let data = DeviceData::new(Arc::new(train), Arc::new(val), None);
        sites.push((sensor.name.to_owned(), data));
    }
    let blurred = SENSORS
        .iter()
        .find(|s| s.name == SITE)
        .expect("a blurred sensor");
    let seen = features(&blurred.apply(&deployed, seed ^ 0xb1))?;
    anyhow::ensure!(
        stream < seen.len(),
        "--stream {stream}: the deployed site holds {} images, some of which must be left to \
         score it",
        seen.len()
    );
    let indices: Vec<usize> = (0..seen.len()).collect();
    let (served, held_out) = indices.split_at(stream);
    Ok(SeedData {
        sites,
        stream: seen.rows(served),
        test: seen.rows(held_out),
        classes: all.class_names.len(),
    })
}

/// The statistics a device with labelled rows `train` (or none, having served `served`)
/// standardises with under `norm` and a release's `pooled` summary, as
/// `site_norm::release_stats` gives them.
pub(super) fn serving_stats(
    norm: FeatureNorm,
    pooled: Option<&FeatureSummary>,
    train: &FeatureSet,
    served: &FeatureSet,
    head: &HeadConfig,
    params: &[f32],
) -> Option<FeatureStats> {
    let site = SiteNorm { norm, pooled };
    let rows = if train.is_empty() { served } else { train };
    match norm {
        FeatureNorm::None => None,
        FeatureNorm::Site => fedge_device::site_norm::stats_of(&[rows]),
        _ if !train.is_empty() => site.labelled(train, head.classes),
        _ => site.unlabelled(served, head, params),
    }
}

/// The margin uncertainty of each row of `set` under the head, and whether its prediction is
/// right, as the device's predictor computes its probabilities (softmax of the logits).
pub(super) fn served(
    head: &HeadConfig,
    params: &[f32],
    set: &FeatureSet,
) -> anyhow::Result<Vec<(f32, bool)>> {
    let tensors = head.split(params)?;
    let mut forward = Forward::new(head);
    Ok((set.features.chunks_exact(set.dim.max(1)))
        .zip(&set.labels)
        .map(|(x, &y)| {
            let logits = forward.logits(&tensors, x);
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = logits.iter().map(|l| (l - top).exp()).collect();
            let sum: f32 = exps.iter().sum();
            let probabilities: Vec<f32> = exps.iter().map(|e| e / sum).collect();
            (uncertainty(&probabilities), argmax(logits) == y as usize)
        })
        .collect())
}

/// What the device's per-site choice (`fedge_device::site_choice::choose_on`, as `fedge-edge`
/// runs it on a training device) serves the site of the final `release`, from the images it
/// labelled: its training rows `train`, every row `picked` (labels unread, for the label-free
/// variant) and its held-back share `held_back`, the labelled rows the release did not train
/// on, which the choice judges on; its accuracy on the held-out images, and the variant.
pub(super) fn serve_choice(
    data: &SeedData,
    release: &ModelRelease,
    (train, picked, held_back): (&FeatureSet, &FeatureSet, &FeatureSet),
    seed: u64,
) -> anyhow::Result<(f32, SiteVariant)> {
    let device = fedge_models::training_device(fedge_models::Backend::default());
    let rows = SiteRows {
        unlabelled: picked,
        labelled: held_back,
    };
    let (served, _) = choose_at_site(&device, release, train, rows, seed ^ 0x517e);
    let accuracy = (served.accuracy(&release.head, &release.params.to_vec(), &data.test))
        .ok_or_else(|| anyhow::anyhow!("the release's parameters do not fit its head"))?;
    Ok((accuracy, served.variant))
}
