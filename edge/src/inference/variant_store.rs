//! Where a device keeps the variant of its release it serves at its site
//! (chosen by the agent): `<client_id>.variant.json` beside the model file, so that
//! `fedge-edge predict` answers as the running device does. JSON, written atomically; it names
//! the release it is a variant of and is ignored beside any other. A file that cannot be read
//! is reported and ignored: the release then serves as it is.

use std::io;
use std::path::{Path, PathBuf};

use fedge_daemon::{Visibility, write_atomically};
use fedge_device::site_choice::SiteServing;
use fedge_wire::{FeatureStats, SiteVariant};
use serde::{Deserialize, Serialize};

/// The file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptVariant {
    /// SHA-256 (hex) of the release it is a variant of.
    pub sha256: String,
    /// The variant.
    pub variant: SiteVariant,
    /// Why it was chosen.
    pub reason: String,
    /// What the features are standardised with.
    #[serde(default)]
    pub stats: Option<FeatureStats>,
    /// The head's parameters when they are not the release's.
    #[serde(default)]
    pub params: Option<Vec<f32>>,
    /// Added to the head's logits.
    #[serde(default)]
    pub log_ratio: Option<Vec<f32>>,
}

impl KeptVariant {
    /// `served`, a variant of the release `sha256`.
    pub fn new(sha256: &str, served: &SiteServing) -> Self {
        Self {
            sha256: sha256.to_owned(),
            variant: served.variant,
            reason: served.reason.clone(),
            stats: served.stats.clone(),
            params: served.params.clone(),
            log_ratio: served.log_ratio.clone(),
        }
    }

    /// What to serve (sizes are checked against the release when it is installed,
    /// `Predictor::adapted`).
    pub fn serving(self) -> SiteServing {
        SiteServing {
            variant: self.variant,
            stats: self.stats,
            params: self.params,
            log_ratio: self.log_ratio,
            reason: self.reason,
        }
    }
}

/// The variant file beside `model_file` (`<client_id>.model.bin` → `<client_id>.variant.json`).
pub fn variant_path(model_file: &Path) -> PathBuf {
    let name = model_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let stem = name
        .as_deref()
        .map(|n| n.strip_suffix(".model.bin").unwrap_or(n));
    model_file.with_file_name(format!("{}.variant.json", stem.unwrap_or("model")))
}

/// Keeps `kept` beside `model_file`, atomically.
pub fn save(model_file: &Path, kept: &KeptVariant) -> io::Result<()> {
    let json = serde_json::to_vec(kept).map_err(io::Error::other)?;
    write_atomically(&variant_path(model_file), &json, Visibility::Private)
}

/// The variant kept beside `model_file` for the release `sha256`: `Ok(None)` without a file
/// or for another release; an error saying what to do when the file cannot be used.
pub fn load(model_file: &Path, sha256: &str) -> Result<Option<KeptVariant>, String> {
    let path = variant_path(model_file);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let bad = |why: String| {
        format!(
            "{} cannot be used ({why}): the release is served as it is; delete the file, the \
             agent chooses the site's variant again at its next start",
            path.display()
        )
    };
    let kept: KeptVariant = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if kept.sha256 != sha256 {
        return Ok(None);
    }
    let values = (kept.stats.iter())
        .flat_map(|s| s.mean.iter().chain(&s.inv_std))
        .chain(kept.params.iter().flatten())
        .chain(kept.log_ratio.iter().flatten());
    if values.into_iter().any(|v| !v.is_finite()) {
        return Err(bad("a value is not finite".into()));
    }
    Ok(Some(kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_variant_comes_back_for_its_release_only_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("cam-1.model.bin");
        assert_eq!(variant_path(&model), dir.path().join("cam-1.variant.json"));
        assert_eq!(load(&model, "aa"), Ok(None));
        let served = SiteServing {
            variant: SiteVariant::PriorEm,
            stats: Some(FeatureStats {
                mean: vec![0.5, 1.0],
                inv_std: vec![2.0, 1.0],
            }),
            params: None,
            log_ratio: Some(vec![0.7, -0.7]),
            reason: "prior-em: why".into(),
        };
        save(&model, &KeptVariant::new("aa", &served)).unwrap();
        let kept = load(&model, "aa").unwrap().unwrap();
        assert_eq!(kept.clone().serving(), served);
        assert_eq!(load(&model, "bb"), Ok(None), "another release's");
        for damaged in [&b"{\"sha256\": \"aa\""[..], b"[1, 2]"] {
            std::fs::write(variant_path(&model), damaged).unwrap();
            let error = load(&model, "aa").unwrap_err();
            assert!(error.contains("delete the file"), "{error}");
        }
    }
}
