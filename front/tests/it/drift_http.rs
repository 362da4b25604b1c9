//! The drift alarm on a deployed device over HTTP, for the changes that cost its site ten
//! points of accuracy or more: a heavy blur, a dark camera and a covered lens. The release is a
//! head trained on a federation of five `digits-sensor` sites; the device's reference is half
//! of its own images, the head's confidence is learnt on its first requests, and then its
//! camera changes.

use std::sync::Arc;

use fedge::bench::drift::VIEWS;
use fedge::datasets::SENSORS;
use fedge_device::{FeatureSet, TrainJob, train_head};
use fedge_edge::inference::http::{install, shared};
use fedge_edge::inference::{DriftWatch, Predictor};
use fedge_models::HeadConfig;
use fedge_wire::{FeatureNorm, ModelRelease, TensorF32, TrainParams};

use crate::inference::{Server, answer, backbone, client, json, png_of};

#[test]
fn changes_that_cost_ten_points_are_caught_over_http_within_300_requests() {
    let backbone = backbone();
    let all = fedge_edge::data::load_digits();
    let mut parts = all.partition(SENSORS.len(), 41);
    let deployed = parts.pop().unwrap();
    let features = |set: &fedge_edge::data::ImageSet| FeatureSet {
        dim: 512,
        features: backbone
            .features_of(&set.images, (1, 8, 8), set.raw_max, 64)
            .unwrap(),
        labels: set.labels.clone(),
    };
    let mut federation = FeatureSet {
        dim: 512,
        ..FeatureSet::default()
    };
    for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
        let seen = features(&sensor.apply(part, i as u64 + 1));
        federation.features.extend(seen.features);
        federation.labels.extend(seen.labels);
    }
    let pooled = fedge_device::site_norm::summary_of(&federation, 10).unwrap();
    let stats = pooled.balanced_stats().unwrap();
    let head = HeadConfig::new(512, 10).with_hidden(64);
    let init = head.init_flat(41);
    let device = fedge_models::training_device(fedge_models::Backend::default());
    let params = TrainParams {
        local_epochs: 30,
        feature_norm: FeatureNorm::Pooled,
        ..TrainParams::default()
    };
    let job = TrainJob {
        stats: Some(&stats),
        seed: 41,
        ..TrainJob::new(&head, &init, &federation, &params, &device)
    };
    let trained = train_head(&job).unwrap().params;
    let release = ModelRelease {
        pooled: Some(pooled),
        federation: "demo".into(),
        run: 3,
        round: 20,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| format!("digit-{k}")).collect(),
        backbone: "digits-conv".into(),
        sha256: ModelRelease::digest(&trained),
        params: TensorF32::from_slice(&trained),
        head,
        feature_norm: FeatureNorm::Pooled,
    };
    let (reference, served) = deployed.split(0.5, 41);
    let clean = VIEWS[0].apply(&served, 9);
    let view = |name: &str| VIEWS.iter().find(|v| v.name == name).unwrap();
    let mut covered = clean.clone();
    covered.images.fill(0.0);
    for (name, changed) in [
        ("heavyblur", view("heavyblur").apply(&served, 9)),
        ("dark", view("dark").apply(&served, 9)),
        ("covered lens", covered),
    ] {
        let watch = Arc::new(DriftWatch::new(None));
        let predictor =
            Predictor::new(Arc::clone(&backbone), release.clone(), Some(stats.clone())).unwrap();
        watch.restart(predictor.distances(&features(&VIEWS[0].apply(&reference, 9)).features));
        let state = shared(None);
        install(&state, predictor.with_drift(Arc::clone(&watch)));
        let server = Server::start(Arc::clone(&state));
        let http = client();
        let url = format!("{}/v1/predict", server.base);
        let post = |raw: &[f32]| {
            let (status, body) = answer(http.post(&url).send(&png_of(raw, clean.raw_max)[..]));
            assert_eq!(status, 200, "{body}");
            json(&body)["index"].as_u64().unwrap() as u32
        };
        // The site as it was: 600 requests, its images in turn, and no alarm.
        let mut right = 0;
        for i in 0..600 {
            let k = i % clean.len();
            right += u32::from(post(&clean.images[k * 64..(k + 1) * 64]) == clean.labels[k]);
        }
        assert_eq!(watch.snapshot().unwrap().alarms, 0, "{name}");
        let before = right as f32 / 600.0;
        // The change: an alarm within 300 requests, and what it costs.
        let (mut right, mut caught) = (0, None);
        for i in 0..300 {
            let k = i % changed.len();
            right += u32::from(post(&changed.images[k * 64..(k + 1) * 64]) == changed.labels[k]);
            if caught.is_none() && watch.snapshot().unwrap().alarms > 0 {
                caught = Some(i + 1);
            }
        }
        let cost = (before - right as f32 / 300.0) * 100.0;
        assert!(cost >= 10.0, "{name} costs {cost:.1} points only");
        let caught = caught.unwrap_or_else(|| panic!("{name}: no alarm in 300 requests"));
        eprintln!("{name}: {cost:.1} points lost, caught after {caught} requests");
        assert_eq!(
            watch.snapshot().unwrap().level,
            1.0,
            "{name}: still drifted"
        );
        server.stop();
    }
}
