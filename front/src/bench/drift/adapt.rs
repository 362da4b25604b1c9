//! Re-adaptation after a sensor switch (the second table of `fedge bench drift`).

use fedge_edge::data::{ImageSet, load_digits};
use fedge_models::Backbone;

use crate::datasets::{SENSORS, Sensor};

/// Accuracy of a deployed site's stream through the blurred sensor, for one seed, under three
/// sets of statistics (all in [0, 1]).
#[derive(Debug, Clone, PartialEq)]
pub struct Adapted {
    /// The seed.
    pub seed: u64,
    /// The site before the switch: its clean stream with the statistics it had.
    pub clean: f32,
    /// After the switch, still with the statistics estimated on its clean images.
    pub stale: f32,
    /// After the switch, with the federation's pooled statistics.
    pub pooled: f32,
    /// After re-adapting on the first `window` requests after the switch (the rest scored).
    pub adapted: f32,
}

/// Re-adaptation on `digits-sensor`: a head trained on the five federation sites' features
/// (one central training on their pooled statistics, standing in for the federation's rounds),
/// a clean deployed site whose statistics come from its own images (`balanced`, labelled by the
/// head), then its sensor switches to `blurred`: the stream is scored with the stale
/// statistics, with the pooled ones, and with statistics re-estimated from the first `window`
/// requests after the switch (unlabelled, `balanced`), as the device does on an alarm.
pub fn adaptation(
    backbone: &Backbone,
    seeds: &[u64],
    window: usize,
) -> anyhow::Result<Vec<Adapted>> {
    use fedge_device::site_norm::{SiteNorm, standardise};
    use fedge_device::{FeatureSet, TrainJob, train_head};
    use fedge_models::{HeadConfig, head::predict_flat, training_device};
    use fedge_wire::{FeatureNorm, TrainParams};

    let all = load_digits();
    let f = backbone.card().feature_size;
    let classes = all.class_names.len();
    let features = |set: &ImageSet| super::site::features_of(backbone, set);
    let blurred = SENSORS
        .iter()
        .find(|s| s.name == "blurred")
        .expect("a blurred sensor");
    let mut out = Vec::new();
    for &seed in seeds {
        let super::site::Federation {
            rows: federation,
            pooled,
            stats: pooled_stats,
            deployed,
        } = super::site::federation(backbone, &all, seed)?;
        let head = HeadConfig::new(f, classes).with_hidden(64);
        let init = head.init_flat(seed);
        let params = TrainParams {
            local_epochs: 30,
            feature_norm: FeatureNorm::Pooled,
            ..TrainParams::default()
        };
        let device = training_device(fedge_models::Backend::default());
        let job = TrainJob {
            stats: Some(&pooled_stats),
            seed,
            ..TrainJob::new(&head, &init, &federation, &params, &device)
        };
        let trained = train_head(&job)?.params;
        let norm = SiteNorm {
            norm: FeatureNorm::Balanced,
            pooled: Some(&pooled),
        };
        let accuracy =
            |stats: &fedge_wire::FeatureStats, set: &FeatureSet| -> anyhow::Result<f32> {
                let predicted = predict_flat(&head, &trained, &standardise(stats, set).features)?;
                let right = (predicted.iter().zip(&set.labels))
                    .filter(|(p, y)| **p == **y as usize)
                    .count();
                Ok(right as f32 / set.labels.len().max(1) as f32)
            };
        let (reference, served) = deployed.split(0.5, seed);
        let view = |sensor: &Sensor, set: &ImageSet| sensor.apply(set, seed ^ 0xd21f);
        let own = features(&view(&SENSORS[0], &reference))?;
        let clean_stream = features(&view(&SENSORS[0], &served))?;
        let blurred_stream = features(&view(blurred, &served))?;
        let unlabelled = |set: &FeatureSet| norm.unlabelled(set, &head, &trained);
        let site = unlabelled(&own).ok_or_else(|| anyhow::anyhow!("no site statistics"))?;
        // The first `window` requests after the switch re-estimate; the rest are scored.
        let window = window.min(blurred_stream.labels.len() / 2);
        let first = FeatureSet {
            dim: f,
            features: blurred_stream.features[..window * f].to_vec(),
            labels: vec![0; window],
        };
        let rest = FeatureSet {
            dim: f,
            features: blurred_stream.features[window * f..].to_vec(),
            labels: blurred_stream.labels[window..].to_vec(),
        };
        let adapted = unlabelled(&first).ok_or_else(|| anyhow::anyhow!("no new statistics"))?;
        out.push(Adapted {
            seed,
            clean: accuracy(&site, &clean_stream)?,
            stale: accuracy(&site, &rest)?,
            pooled: accuracy(&pooled_stats, &rest)?,
            adapted: accuracy(&adapted, &rest)?,
        });
    }
    Ok(out)
}
