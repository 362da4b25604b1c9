//! One deployment of `fedge bench drift`: the familiarity distances its images measure.

use fedge_edge::data::ImageSet;
use fedge_models::Backbone;

use crate::datasets::{SENSORS, Sensor};

/// One seed's site: the familiarity distance of each image the site serves, clean and through
/// every other sensor, and of its reference images.
pub(super) struct Site {
    pub(super) reference: Vec<f32>,
    /// A blank black and a blank white frame.
    pub(super) blank: [f32; 2],
    /// `served[s][i]`: image `i` of the served half through sensor `s` of [`SENSORS`].
    pub(super) served: Vec<Vec<f32>>,
    /// The served images' classes.
    pub(super) labels: Vec<u32>,
}

pub(super) fn site(backbone: &Backbone, all: &ImageSet, seed: u64) -> anyhow::Result<Site> {
    let mut parts = all.partition(SENSORS.len(), seed);
    let deployed = parts.pop().expect("six parts");
    let f = backbone.card().feature_size;
    let classes = all.class_names.len();
    let features = |set: &ImageSet| -> anyhow::Result<Vec<f32>> {
        let shape = (set.channels, set.height, set.width);
        Ok(backbone.features_of(&set.images, shape, set.raw_max, 64)?)
    };
    // The federation: five sites, each through its own sensor.
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
        rows.extend(features(&sensor.apply(part, seed ^ (i as u64 + 1)))?);
        labels.extend_from_slice(&part.labels);
    }
    let pooled = fedge_wire::FeatureSummary::of_rows(f, classes, rows.chunks_exact(f), &labels)
        .ok_or_else(|| anyhow::anyhow!("no pooled summary"))?;
    let familiarity = pooled
        .familiarity()
        .ok_or_else(|| anyhow::anyhow!("no class with rows"))?;
    let distances = |set: &ImageSet| -> anyhow::Result<Vec<f32>> {
        Ok(features(set)?
            .chunks_exact(f)
            .map(|x| familiarity.distance(x).unwrap_or(f32::NAN))
            .collect())
    };
    let (reference, served) = deployed.split(0.5, seed);
    let view = |sensor: &Sensor, set: &ImageSet| sensor.apply(set, seed ^ 0xd21f);
    let mut blank = reference.subset(&[0, 0]);
    let len = blank.image_len();
    blank.images[len..].fill(blank.raw_max);
    blank.images[..len].fill(0.0);
    let blank = distances(&blank)?;
    Ok(Site {
        blank: [blank[0], blank[1]],
        reference: distances(&view(&SENSORS[0], &reference))?,
        served: (SENSORS.iter())
            .map(|s| distances(&view(s, &served)))
            .collect::<anyhow::Result<_>>()?,
        labels: served.labels.clone(),
    })
}

/// The backbone's features of `set`, with its labels.
pub(super) fn features_of(
    backbone: &Backbone,
    set: &ImageSet,
) -> anyhow::Result<fedge_device::FeatureSet> {
    let shape = (set.channels, set.height, set.width);
    Ok(fedge_device::FeatureSet {
        dim: backbone.card().feature_size,
        features: backbone.features_of(&set.images, shape, set.raw_max, 64)?,
        labels: set.labels.clone(),
    })
}

/// One seed's federation, for the tables that train a head on it: the five sites' features
/// (each through its own sensor), their pooled summary and statistics, and the deployed
/// part's images.
pub(super) struct Federation {
    pub(super) rows: fedge_device::FeatureSet,
    pub(super) pooled: fedge_wire::FeatureSummary,
    pub(super) stats: fedge_wire::FeatureStats,
    pub(super) deployed: ImageSet,
}

pub(super) fn federation(
    backbone: &Backbone,
    all: &ImageSet,
    seed: u64,
) -> anyhow::Result<Federation> {
    let mut parts = all.partition(SENSORS.len(), seed);
    let deployed = parts.pop().expect("six parts");
    let mut rows = fedge_device::FeatureSet {
        dim: backbone.card().feature_size,
        ..fedge_device::FeatureSet::default()
    };
    for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
        let seen = features_of(backbone, &sensor.apply(part, seed ^ (i as u64 + 1)))?;
        rows.features.extend(seen.features);
        rows.labels.extend(seen.labels);
    }
    let pooled = fedge_device::site_norm::summary_of(&rows, all.class_names.len())
        .ok_or_else(|| anyhow::anyhow!("no pooled summary"))?;
    let stats = pooled
        .balanced_stats()
        .ok_or_else(|| anyhow::anyhow!("no pooled statistics"))?;
    Ok(Federation {
        rows,
        pooled,
        stats,
        deployed,
    })
}
