//! The canary's look at the head on a serving device: once a release replaces another, the
//! one replaced answers every request beside it, and the device counts the confident answers
//! the new one changed (`fedge_wire::head_check`, in its status). A candidate whose classifier
//! columns are rotated by one class contradicts nearly all of them; an honest successor few.

use fedge::bench::drift::canary::rotate;
use fedge_device::{FeatureSet, TrainJob, train_head};
use fedge_edge::agent::serve;
use fedge_edge::inference::http::current;
use fedge_models::HeadConfig;
use fedge_wire::{FeatureNorm, ModelRelease, TensorF32, TrainParams};

use crate::common;

fn release(head: &HeadConfig, round: u64, params: &[f32]) -> ModelRelease {
    ModelRelease {
        pooled: None,
        federation: "demo".into(),
        run: 3,
        round,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| format!("digit-{k}")).collect(),
        backbone: "digits-conv".into(),
        sha256: ModelRelease::digest(params),
        params: TensorF32::from_slice(params),
        head: head.clone(),
        feature_norm: FeatureNorm::None,
    }
}

#[test]
fn a_release_is_counted_against_the_one_it_replaced_and_a_rotated_head_objects() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::serving_setup(dir.path());
    let backbone = setup.serving.backbone.clone().expect("kept to serve");
    let digits = fedge_edge::data::load_digits();
    let rows = FeatureSet {
        dim: 512,
        features: backbone
            .features_of(&digits.images, (1, 8, 8), digits.raw_max, 64)
            .unwrap(),
        labels: digits.labels.clone(),
    };
    // Two releases of one federation: a few epochs, then many more (an honest successor).
    let head = HeadConfig::new(512, 10).with_hidden(16);
    let init = head.init_flat(7);
    let device = fedge_models::training_device(fedge_models::Backend::default());
    let trained = |epochs: u32| {
        let params = TrainParams {
            local_epochs: epochs,
            feature_norm: FeatureNorm::None,
            ..TrainParams::default()
        };
        let job = TrainJob {
            seed: 7,
            ..TrainJob::new(&head, &init, &rows, &params, &device)
        };
        train_head(&job).unwrap().params
    };
    let (early, later) = (trained(3), trained(20));
    let first = release(&head, 4, &early);
    let honest = release(&head, 5, &later);
    let rotated = release(&head, 6, &rotate(&head, &later));
    let ask = |n: usize| {
        let predictor = current(&setup.serving.predictor).unwrap();
        for row in rows.features.chunks_exact(512).take(n) {
            predictor.predict_features(row, 1);
        }
    };
    serve::install(&setup, &first, None);
    ask(300);
    assert_eq!(setup.serving.head.snapshot(), None, "it replaced none");
    // The rotated candidate against the release it replaced.
    serve::install(&setup, &rotated, None);
    ask(300);
    let check = setup.serving.head.snapshot().unwrap();
    assert_eq!(check.release, rotated.sha256_hex());
    assert_eq!(check.against, first.sha256_hex());
    assert_eq!(check.requests, 300);
    assert!(check.objects(), "{check:?}");
    assert!(check.changed_share() > 0.95, "{check:?}");
    // Back to the first release (a rollback), then the honest successor: few changes.
    serve::install(&setup, &first, None);
    serve::install(&setup, &honest, None);
    ask(300);
    let check = setup.serving.head.snapshot().unwrap();
    assert_eq!(check.against, first.sha256_hex());
    assert!(check.confident >= 50, "{check:?}");
    assert!(!check.objects(), "{check:?}");
    assert!(check.changed_share() < 0.2, "{check:?}");
    // The honest release answers beside the first.
    let predictor = current(&setup.serving.predictor).unwrap();
    assert_eq!(
        predictor.shadow().map(|s| s.sha256.clone()),
        Some(first.sha256_hex())
    );
}
