//! The per-site choice on synthetic Gaussian classes with the pool's Bayes head
//! (`site_norm::label_shift_tests`): each variant serves where it should, and nothing serves
//! worse than the release beyond noise.

use burn::prelude::Device;
use fedge_models::{Backend, training_device};
use fedge_wire::{FeatureNorm, ModelRelease, SiteVariant, TensorF32};

use super::*;
use crate::site_head::SiteHeadSettings;
use crate::site_norm::FeatureSummary;
use crate::site_norm::label_shift_tests::{K, NONE, SAME, bayes_head, pool, site};

fn release(pool: &FeatureSummary, norm: FeatureNorm) -> (ModelRelease, Vec<f32>) {
    let (head, params) = bayes_head(pool);
    let release = ModelRelease {
        pooled: Some(pool.clone()),
        federation: "f".into(),
        run: 1,
        round: 3,
        strategy: "fedavg".into(),
        classes: fedge_wire::numbered_classes(K),
        backbone: String::new(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: norm,
    };
    (release, params)
}

fn chosen(
    release: &ModelRelease,
    params: &[f32],
    unlabelled: &FeatureSet,
    labelled: &FeatureSet,
    device: &Device,
) -> SiteServing {
    let corrector = Corrector {
        head: &release.head,
        settings: SiteHeadSettings::default(),
        device,
    };
    let base = release.pooled.as_ref().and_then(|p| p.balanced_stats());
    let rows = SiteRows {
        unlabelled,
        labelled,
    };
    choose(release, params, base, rows, &corrector, 7)
}

/// The share of `test` that `served` gets right.
fn accuracy(
    release: &ModelRelease,
    params: &[f32],
    served: &SiteServing,
    test: &FeatureSet,
) -> f64 {
    f64::from(served.accuracy(&release.head, params, test).unwrap())
}

/// `set` with the features of classes 0 and 1 traded: what the federation learnt is wrong here.
fn swapped(set: &FeatureSet) -> FeatureSet {
    let labels = (set.labels.iter())
        .map(|&y| match y {
            0 => 1,
            1 => 0,
            y => y,
        })
        .collect();
    FeatureSet {
        labels,
        ..set.clone()
    }
}

#[test]
fn prior_em_serves_only_when_labelled_rows_find_it_better() {
    let device = training_device(Backend::default());
    let pool = pool();
    let (release, params) = release(&pool, FeatureNorm::Pooled);
    let shift = [3.0, -2.0, 0.5, 1.0];
    let none = FeatureSet::default();
    let as_is = SiteServing::release(pool.balanced_stats(), "");
    // 80 % of one class, moved as a whole. Without labels the release serves, whatever a fit
    // would explain, and the reason says so.
    let requests = site([160, 20, 20], SAME, shift, 11);
    let test = site([400, 50, 50], SAME, shift, 12);
    let unlabelled = chosen(&release, &params, &requests, &none, &device);
    assert_eq!(
        unlabelled.variant,
        SiteVariant::Release,
        "{}",
        unlabelled.reason
    );
    assert!(
        unlabelled
            .reason
            .contains("no prior-em: it serves only when better on labelled rows"),
        "{}",
        unlabelled.reason
    );
    // With 60 labelled rows a variant must win on them to serve, and one does: the fitted
    // prior differs from the pool's and corrects the release.
    let before = accuracy(&release, &params, &as_is, &test);
    let labelled = site([48, 6, 6], SAME, shift, 13);
    let judged = chosen(&release, &params, &requests, &labelled, &device);
    assert_ne!(judged.variant, SiteVariant::Release, "{}", judged.reason);
    assert!(judged.reason.contains("labelled rows"), "{}", judged.reason);
    assert!(accuracy(&release, &params, &judged, &test) > before + 0.1);
}

#[test]
fn a_site_where_the_release_is_wrong_is_served_its_correction() {
    let device = training_device(Backend::default());
    let pool = pool();
    let (release, params) = release(&pool, FeatureNorm::Pooled);
    let requests = swapped(&site([70, 70, 70], SAME, NONE, 21));
    let labelled = swapped(&site([20, 20, 20], SAME, NONE, 22));
    let test = swapped(&site([100, 100, 100], SAME, NONE, 23));
    let served = chosen(&release, &params, &requests, &labelled, &device);
    assert_eq!(served.variant, SiteVariant::Correction, "{}", served.reason);
    assert!(served.params.is_some() && served.log_ratio.is_none());
    let as_is = SiteServing::release(pool.balanced_stats(), "");
    let (before, after) = (
        accuracy(&release, &params, &as_is, &test),
        accuracy(&release, &params, &served, &test),
    );
    assert!(before < 0.5 && after > 0.8, "{before} → {after}");
}

#[test]
fn a_site_like_the_pool_keeps_the_release_and_so_do_sites_with_nothing_to_go_on() {
    let device = training_device(Backend::default());
    let pool = pool();
    let (release, params) = release(&pool, FeatureNorm::Pooled);
    let like = site([60, 60, 60], SAME, NONE, 31);
    let labelled = site([20, 20, 20], SAME, NONE, 32);
    let kept = chosen(&release, &params, &like, &labelled, &device);
    assert_eq!(kept.variant, SiteVariant::Release, "{}", kept.reason);
    assert!(
        kept.reason.contains("not better beyond noise"),
        "{}",
        kept.reason
    );
    assert_eq!(kept.stats, pool.balanced_stats());
    // No rows, three rows, one class: the release, and the reason says why.
    let none = FeatureSet::default();
    for rows in [
        none.clone(),
        site([3, 0, 0], SAME, NONE, 33),
        site([40, 0, 0], SAME, NONE, 34),
    ] {
        let served = chosen(&release, &params, &rows, &none, &device);
        assert_ne!(served.variant, SiteVariant::Correction, "{}", served.reason);
        assert!(served.reason.contains("no correction"), "{}", served.reason);
    }
    let empty = chosen(&release, &params, &none, &none, &device);
    assert_eq!(empty.variant, SiteVariant::Release, "{}", empty.reason);
    assert!(empty.reason.contains("no prior-em"), "{}", empty.reason);
}

#[test]
fn a_release_not_trained_on_pooled_statistics_or_with_a_tail_gets_no_label_free_variant() {
    let device = training_device(Backend::default());
    let pool = pool();
    let requests = site([160, 20, 20], SAME, [3.0, -2.0, 0.5, 1.0], 41);
    let none = FeatureSet::default();
    let (raw, params) = release(&pool, FeatureNorm::None);
    let served = chosen(&raw, &params, &requests, &none, &device);
    assert_eq!(served.variant, SiteVariant::Release);
    assert!(served.reason.contains("not none"), "{}", served.reason);
    let (mut tail, params) = release(&pool, FeatureNorm::Pooled);
    tail.head.tail = Some(fedge_wire::layout::TailConfig {
        input: [3, 2, 2],
        channels: tail.head.features,
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0; 4],
        activation: fedge_wire::layout::TailActivation::Relu6,
        pooling: fedge_wire::layout::TailPooling::GlobalAverage,
    });
    let served = chosen(&tail, &params, &requests, &none, &device);
    assert_eq!(served.variant, SiteVariant::Release);
    assert!(served.reason.contains("tail"), "{}", served.reason);
}

#[test]
fn a_variant_of_other_sizes_does_not_fit_the_head() {
    let pool = pool();
    let (release, params) = release(&pool, FeatureNorm::Pooled);
    let good = SiteServing {
        variant: SiteVariant::Correction,
        stats: pool.balanced_stats(),
        params: Some(params.clone()),
        log_ratio: Some(vec![0.0; K]),
        reason: String::new(),
    };
    assert_eq!(good.fits(&release.head), Ok(()));
    let short = SiteServing {
        params: Some(params[1..].to_vec()),
        ..good.clone()
    };
    let error = short.fits(&release.head).unwrap_err();
    assert!(error.contains("parameters hold"), "{error}");
    let ratio = SiteServing {
        log_ratio: Some(vec![0.0; K + 1]),
        ..good.clone()
    };
    assert!(
        ratio
            .fits(&release.head)
            .unwrap_err()
            .contains("prior correction")
    );
    let stats = SiteServing {
        stats: Some(fedge_wire::FeatureStats {
            mean: vec![0.0; 1],
            inv_std: vec![1.0; 1],
        }),
        ..good
    };
    assert!(
        stats
            .fits(&release.head)
            .unwrap_err()
            .contains("statistics")
    );
}

/// Every device under local DP sends no feature summary, so a `pooled` release carries no
/// pool: no label-free variant, and the reason says why; the site's labels still correct it.
#[test]
fn a_release_without_a_pool_gets_no_label_free_variant_but_is_still_corrected() {
    let device = training_device(Backend::default());
    let pool = pool();
    let (mut release, params) = release(&pool, FeatureNorm::Pooled);
    release.pooled = None;
    let requests = swapped(&site([70, 70, 70], SAME, NONE, 31));
    let none = FeatureSet::default();
    let served = chosen(&release, &params, &requests, &none, &device);
    assert_eq!(served.variant, SiteVariant::Release);
    assert!(
        served.reason.contains("no pooled summary"),
        "{}",
        served.reason
    );
    let labelled = swapped(&site([20, 20, 20], SAME, NONE, 32));
    let served = chosen(&release, &params, &requests, &labelled, &device);
    assert_eq!(served.variant, SiteVariant::Correction, "{}", served.reason);
}
