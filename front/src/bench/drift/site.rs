//! One deployment of `fedge bench drift`: the familiarity distances its images measure.

use fedge_edge::data::ImageSet;
use fedge_models::Backbone;

use crate::datasets::{SENSORS, Sensor};

/// A way the deployed site's images can be seen: a sensor of `digits-sensor`, or a harsher one
/// that costs the site accuracy (a sensor applied `passes` times).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// Its name in the tables.
    pub name: &'static str,
    /// The sensor.
    pub sensor: Sensor,
    /// Times it is applied (a blur applied three times is a heavy blur).
    pub passes: u8,
}

const fn sensor(i: usize) -> View {
    View {
        name: SENSORS[i].name,
        sensor: SENSORS[i],
        passes: 1,
    }
}

/// The views of a deployment: the six sensors of `digits-sensor` (the clean one first), then a
/// heavy blur and a dark camera.
pub const VIEWS: [View; 8] = [
    sensor(0),
    sensor(1),
    sensor(2),
    sensor(3),
    sensor(4),
    sensor(5),
    View {
        name: "heavyblur",
        sensor: SENSORS[3],
        passes: 3,
    },
    View {
        name: "dark",
        sensor: Sensor {
            gain: 0.3,
            gamma: 1.5,
            ..Sensor::clean("dark")
        },
        passes: 1,
    },
];

impl View {
    /// `set` as seen this way (noise seeded by `seed`).
    pub fn apply(&self, set: &ImageSet, seed: u64) -> ImageSet {
        let mut seen = set.clone();
        for pass in 0..self.passes {
            seen = self.sensor.apply(&seen, seed ^ u64::from(pass) << 32);
        }
        seen
    }
}

/// One seed's site: the familiarity distance of each image the site serves, through every
/// view, and of its reference images; and what a head trained on the federation answers.
pub(super) struct Site {
    pub(super) reference: Vec<f32>,
    /// A blank black and a blank white frame.
    pub(super) blank: [f32; 2],
    /// `served[v][i]`: image `i` of the served half through view `v` of [`VIEWS`].
    pub(super) served: Vec<Vec<f32>>,
    /// The served images' classes.
    pub(super) labels: Vec<u32>,
    /// The share of the served images a head trained on the federation (30 epochs, pooled
    /// statistics) answers right through each view.
    pub(super) accuracy: Vec<f32>,
    /// That head's top probability for each served image through each view
    /// (`confidence[v][i]`), for the reference images, and for the blank frames.
    pub(super) confidence: Vec<Vec<f32>>,
    pub(super) reference_confidence: Vec<f32>,
    pub(super) blank_confidence: [f32; 2],
}

pub(super) fn site(backbone: &Backbone, all: &ImageSet, seed: u64) -> anyhow::Result<Site> {
    let federation = federation(backbone, all, seed)?;
    let familiarity = federation
        .pooled
        .familiarity()
        .ok_or_else(|| anyhow::anyhow!("no class with rows"))?;
    let head = trained(backbone, &federation, all.class_names.len(), seed, 30)?;
    let distances = |rows: &fedge_device::FeatureSet| -> Vec<f32> {
        (rows.features.chunks_exact(rows.dim))
            .map(|x| familiarity.distance(x).unwrap_or(f32::NAN))
            .collect()
    };
    let confidence = |rows: &fedge_device::FeatureSet| -> anyhow::Result<Vec<f32>> {
        let rows = fedge_device::site_norm::standardise(&federation.stats, rows);
        let tensors = head.0.split(&head.1)?;
        let mut forward = fedge_models::Forward::new(&head.0);
        Ok((rows.features.chunks_exact(rows.dim))
            .map(|x| {
                let logits = forward.logits(&tensors, x);
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                1.0 / logits.iter().map(|l| (l - max).exp()).sum::<f32>()
            })
            .collect())
    };
    let accuracy = |rows: &fedge_device::FeatureSet| -> anyhow::Result<f32> {
        let rows = fedge_device::site_norm::standardise(&federation.stats, rows);
        let predicted = fedge_models::head::predict_flat(&head.0, &head.1, &rows.features)?;
        let right = (predicted.iter().zip(&rows.labels))
            .filter(|(p, y)| **p == **y as usize)
            .count();
        Ok(right as f32 / rows.labels.len().max(1) as f32)
    };
    let (reference, served) = federation.deployed.split(0.5, seed);
    let mut blank = reference.subset(&[0, 0]);
    let len = blank.image_len();
    blank.images[len..].fill(blank.raw_max);
    blank.images[..len].fill(0.0);
    let blank_rows = features_of(backbone, &blank)?;
    let blank = distances(&blank_rows);
    let blank_confidence = confidence(&blank_rows)?;
    let mut served_distances = Vec::new();
    let mut accuracies = Vec::new();
    let mut confidences = Vec::new();
    for view in &VIEWS {
        let rows = features_of(backbone, &view.apply(&served, seed ^ 0xd21f))?;
        served_distances.push(distances(&rows));
        accuracies.push(accuracy(&rows)?);
        confidences.push(confidence(&rows)?);
    }
    let reference = features_of(backbone, &VIEWS[0].apply(&reference, seed ^ 0xd21f))?;
    Ok(Site {
        blank: [blank[0], blank[1]],
        reference: distances(&reference),
        served: served_distances,
        labels: served.labels.clone(),
        accuracy: accuracies,
        confidence: confidences,
        reference_confidence: confidence(&reference)?,
        blank_confidence: [blank_confidence[0], blank_confidence[1]],
    })
}

/// A head trained centrally on `federation`'s rows with their pooled statistics for `epochs`
/// epochs from a seeded start (standing in for the federation's rounds): its shape and
/// parameters.
pub(super) fn trained(
    backbone: &Backbone,
    federation: &Federation,
    classes: usize,
    seed: u64,
    epochs: u32,
) -> anyhow::Result<(fedge_models::HeadConfig, Vec<f32>)> {
    use fedge_device::{TrainJob, train_head};
    use fedge_wire::{FeatureNorm, TrainParams};
    let head = fedge_models::HeadConfig::new(backbone.card().feature_size, classes).with_hidden(64);
    let init = head.init_flat(seed);
    let params = TrainParams {
        local_epochs: epochs,
        feature_norm: FeatureNorm::Pooled,
        ..TrainParams::default()
    };
    let device = fedge_models::training_device(fedge_models::Backend::default());
    let job = TrainJob {
        stats: Some(&federation.stats),
        seed,
        ..TrainJob::new(&head, &init, &federation.rows, &params, &device)
    };
    let params = train_head(&job)?.params;
    Ok((head, params))
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
