//! `fedge-edge predict`: one JSON line per image, with the release the device keeps and the
//! variant of it the device serves at its site.

use std::io::Write;
use std::path::{Path, PathBuf};

use fedge_edge::config::EdgeConfig;

/// One line of `fedge-edge predict`'s output.
#[derive(serde::Serialize)]
struct Predicted<'a> {
    file: &'a Path,
    #[serde(flatten)]
    prediction: fedge_edge::inference::Prediction,
}

/// `fedge-edge predict`: one JSON line per image; false when an image could not be predicted.
pub fn predict(
    profile: &Path,
    model: Option<&Path>,
    top_k: usize,
    as_released: bool,
    images: &[PathBuf],
) -> anyhow::Result<bool> {
    use anyhow::Context;
    use fedge_edge::inference::{Predictor, store, variant_store};

    let config = EdgeConfig::load(profile)?;
    let model_path = match model {
        Some(path) => path.to_owned(),
        None => {
            let Some(cache_dir) = &config.cache_dir else {
                anyhow::bail!(
                    "{} has no cache_dir, where the agent keeps the released model: set one and \
                     run the agent until a round aggregates, or pass --model state/model.bin \
                     from the coordinator's state folder",
                    profile.display()
                );
            };
            store::model_path(cache_dir, &config.client_id)
        }
    };
    let Some(release) = store::load(&model_path)? else {
        anyhow::bail!(
            "no model at {}: {}",
            model_path.display(),
            if model.is_some() {
                "give the coordinator's state/model.bin (written after each aggregated round)"
            } else {
                "no release has been received yet; run the agent (`fedge-edge run`) until a \
                 round aggregates, or pass --model state/model.bin from the coordinator's state \
                 folder"
            }
        );
    };
    let (backbone, _) = fedge_edge::features::load_backbone_with(
        &config.backbone,
        &config.model,
        config.resources.threads,
    )
    .with_context(|| format!("loading the backbone {}", config.backbone.display()))?;
    // A normalised head needs this site's statistics: from the profile's own data (its
    // features are cached after the agent's first start); a pooled release without the
    // site's data uses the federation's.
    let site = match (release.feature_norm, &release.pooled) {
        (fedge_wire::FeatureNorm::None, _) => None,
        // A site without data of its own serves a pooled release with the federation's
        // statistics.
        (norm, Some(pooled)) if norm.pools() => match config.setup() {
            Ok(setup) => fedge_device::site_norm::release_stats(&release, &setup.train, &setup.val),
            Err(e) => {
                eprintln!(
                    "note: no data of this site ({e:#}); standardising with the federation's \
                     pooled statistics the release carries"
                );
                pooled.balanced_stats()
            }
        },
        _ => {
            let setup = config
                .setup()
                .context("loading the site's data for its feature statistics")?;
            fedge_device::site_norm::release_stats(&release, &setup.train, &setup.val)
        }
    };
    let sha256 = release.sha256_hex();
    let mut predictor = Predictor::new(std::sync::Arc::new(backbone), release, site)
        .with_context(|| format!("using {}", model_path.display()))?
        .with_unfamiliar_distance(config.inference.unfamiliar_distance);
    // The variant of the release the running device serves at this site, as it kept it.
    if !as_released {
        match variant_store::load(&model_path, &sha256) {
            Ok(Some(kept)) => {
                let path = variant_store::variant_path(&model_path);
                predictor = predictor
                    .adapted(kept.serving())
                    .with_context(|| format!("using {}", path.display()))?;
            }
            Ok(None) => {}
            Err(e) => eprintln!("note: {e}"),
        }
    }
    let mut all_ok = true;
    let mut out = std::io::stdout().lock();
    for image in images {
        let line = match predictor.predict_file(image, top_k) {
            Ok(prediction) => serde_json::to_string(&Predicted {
                file: image,
                prediction,
            })?,
            Err(e) => {
                all_ok = false;
                serde_json::json!({ "file": image, "error": e.to_string() }).to_string()
            }
        };
        writeln!(out, "{line}")?;
    }
    Ok(all_ok)
}
