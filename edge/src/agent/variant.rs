//! The variant of each release the site serves (`[inference] adapt`,
//! `fedge_device::site_choice`): chosen on a blocking thread after the release is installed
//! as it is, so that a new release or a rollback serves at once, and put in front of requests
//! when it is done, if that release still serves.

use std::sync::Arc;

use fedge_device::FeatureSet;
use fedge_device::site_choice::{SiteRows, SiteServing, choose_on};
use fedge_device::train::DeviceData;
use fedge_wire::{ModelRelease, SiteAdapt, SiteChoice};
use tokio::sync::mpsc;

use super::setup::AgentSetup;
use crate::inference::{Predictor, http, variant_store};

/// A variant chosen for a release (its SHA-256 in hex).
#[derive(Debug)]
pub struct Chosen {
    /// The release it is a variant of.
    pub sha256: String,
    /// What to serve.
    pub served: SiteServing,
}

/// Chooses the variant of `release` the site serves, off the loop, and sends it to `done`;
/// nothing when the device serves no predictions, or under `adapt = "off"`. The rows: every
/// row of the site, labels unread (`train` and `val`), and the labelled rows the release did
/// not train on (`val`: a training device's held-back share, an evaluation site's samples),
/// which count only when the device's labels are numbered as the release's classes.
pub fn spawn_choice(
    setup: &AgentSetup,
    data: &DeviceData,
    release: &ModelRelease,
    done: &mpsc::UnboundedSender<Chosen>,
) {
    if setup.serving.backbone.is_none() || setup.serving.inference.adapt == SiteAdapt::Off {
        return;
    }
    let Ok(params) = release.verify() else {
        return;
    };
    let aligned = setup.class_names == release.classes;
    let (train, val) = (Arc::clone(data.train()), Arc::clone(data.val()));
    let base = data.serving_stats(release).map(|s| (*s).clone());
    let release = release.clone();
    let device = setup.device.device.clone();
    let seed = setup.seed ^ release.round;
    let done = done.clone();
    tokio::task::spawn_blocking(move || {
        let unlabelled = FeatureSet {
            dim: val.dim,
            features: [&train.features[..], &val.features[..]].concat(),
            labels: vec![0; train.len() + val.len()],
        };
        let none = FeatureSet::default();
        let labelled = if aligned { &*val } else { &none };
        let rows = SiteRows {
            unlabelled: &unlabelled,
            labelled,
        };
        let served = choose_on(&device, &release, &params, base, rows, seed);
        let _ = done.send(Chosen {
            sha256: release.sha256_hex(),
            served,
        });
    });
}

/// Puts `chosen` in front of requests when its release is still the one served; what the site
/// then serves (`None`: another release took over meanwhile, or the variant does not fit).
pub fn adopt(setup: &AgentSetup, chosen: Chosen) -> Option<SiteChoice> {
    let current = http::current(&setup.serving.predictor)?;
    if current.choice().sha256 != chosen.sha256 {
        return None;
    }
    let backbone = setup.serving.backbone.as_ref()?;
    let (variant, reason) = (chosen.served.variant, chosen.served.reason.clone());
    let kept = variant_store::KeptVariant::new(&chosen.sha256, &chosen.served);
    let built = Predictor::with_tail_parts(
        Arc::clone(backbone),
        current.release().clone(),
        chosen.served.stats.clone(),
        setup.tail.clone(),
    )
    .and_then(|p| p.adapted(chosen.served));
    let predictor = match built {
        Ok(predictor) => predictor,
        Err(e) => {
            tracing::warn!(client = %setup.client_id, "cannot serve the site's variant {}: {e}", variant.name());
            return None;
        }
    };
    let predictor = super::serve::served_by(setup, predictor)
        .with_limits(crate::inference::ImageLimits::for_memory_budget(
            setup.memory_budget_mb,
        ))
        .with_unfamiliar_distance(setup.serving.inference.unfamiliar_distance)
        .with_drift(Arc::clone(&setup.serving.drift));
    let predictor = super::serve::beside_previous(setup, predictor, Some(&current));
    let choice = predictor.choice();
    http::install(&setup.serving.predictor, predictor);
    setup.serving.drift.head_changed();
    // Kept for `fedge-edge predict`, which answers as the device does.
    if let Some(model_file) = &setup.serving.model_file
        && let Err(e) = variant_store::save(model_file, &kept)
    {
        tracing::warn!(client = %setup.client_id, error = %e, "the site's variant was not kept on disk");
    }
    setup.serving.metrics.site_variant(variant);
    tracing::info!(client = %setup.client_id, sha256 = %choice.sha256, variant = variant.name(), "serving {reason}");
    Some(choice)
}

/// Puts the variant of `release` the device kept on disk in front of requests, when it kept
/// one for that release (at a start: the site is served what it was before the restart while
/// the choice runs again).
pub fn adopt_kept(setup: &AgentSetup, release: &ModelRelease) {
    let Some(model_file) = &setup.serving.model_file else {
        return;
    };
    let sha256 = release.sha256_hex();
    match variant_store::load(model_file, &sha256) {
        Ok(Some(kept)) => {
            adopt(
                setup,
                Chosen {
                    sha256,
                    served: kept.serving(),
                },
            );
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(client = %setup.client_id, "{e}"),
    }
}
