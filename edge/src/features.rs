//! The feature cache: the frozen backbone runs once per sample.
//!
//! Features are computed in batches when a device starts and kept in memory for every round.
//! With a cache folder they are also written to disk, keyed by a hash of the backbone file
//! and the raw images, so a restarted device skips the backbone entirely.

use std::path::{Path, PathBuf};

use anyhow::Context;
use fedge_models::{Backbone, BackboneError, ModelCard, check_sample};

use crate::data::ImageSet;
use crate::train::FeatureSet;

/// Images per backbone call.
pub const BATCH: usize = 64;

/// Features of `images` through `backbone`, using `cache_dir` when given.
///
/// `backbone_id` identifies the backbone's weights (e.g. a hash of its ONNX bytes); it is part
/// of the cache key.
pub fn extract(
    backbone: &Backbone,
    backbone_id: u64,
    images: &ImageSet,
    cache_dir: Option<&Path>,
) -> Result<FeatureSet, BackboneError> {
    let dim = backbone.card().feature_size;
    let path = cache_dir.map(|dir| cache_path(dir, backbone_id, images));
    if let Some(path) = &path
        && let Some(features) = read_cache(path, images.len() * dim)
    {
        tracing::debug!(path = %path.display(), "feature cache hit");
        return Ok(FeatureSet {
            dim,
            features,
            labels: images.labels.clone(),
        });
    }
    let shape = (images.channels, images.height, images.width);
    let features = backbone.features_of(&images.images, shape, images.raw_max, BATCH)?;
    if let Some(path) = &path {
        let bytes: Vec<u8> = features.iter().flat_map(|v| v.to_le_bytes()).collect();
        let written = path
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| write_atomic(path, &bytes));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot write feature cache");
        }
    }
    Ok(FeatureSet {
        dim,
        features,
        labels: images.labels.clone(),
    })
}

/// Loads the backbone a model card describes (or an `.onnx` file with its card beside it),
/// checks it against its converter's sample when one lies next to the card (see
/// `fedge_models::sample`), and returns it with a hash of its ONNX bytes, the feature cache's
/// key.
pub fn load_backbone(path: &Path) -> anyhow::Result<(Backbone, u64)> {
    let card_path = if path.extension().is_some_and(|e| e == "onnx") {
        path.with_extension("toml")
    } else {
        path.to_owned()
    };
    anyhow::ensure!(
        card_path.exists(),
        "no model card {}: a backbone needs its card next to it \
         (models/tools/fetch-efficientnet-lite0.sh writes both)",
        card_path.display()
    );
    let card = ModelCard::load(&card_path)?;
    let onnx = card.onnx_path(&card_path);
    let bytes = std::fs::read(&onnx).with_context(|| format!("cannot read {}", onnx.display()))?;
    let backbone = Backbone::from_bytes(card, &bytes, &onnx)?;
    if let Some(check) = check_sample(&backbone, &card_path)? {
        anyhow::ensure!(
            check.agrees(),
            "{} disagrees with its converter's sample (largest difference {} for features up \
             to {}): convert it again",
            onnx.display(),
            check.max_abs_diff,
            check.max_abs
        );
    }
    Ok((backbone, Fnv64::of(&bytes)))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn cache_path(dir: &Path, backbone_id: u64, images: &ImageSet) -> PathBuf {
    let mut h = Fnv64::default();
    h.write(&backbone_id.to_le_bytes());
    for v in [images.channels, images.height, images.width, images.len()] {
        h.write(&(v as u64).to_le_bytes());
    }
    h.write(&images.raw_max.to_le_bytes());
    for v in &images.images {
        h.write(&v.to_le_bytes());
    }
    dir.join(format!("features-{:016x}.f32", h.0))
}

fn read_cache(path: &Path, expected: usize) -> Option<Vec<f32>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() != expected * 4 {
        return None;
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    values.iter().all(|v| v.is_finite()).then_some(values)
}

/// FNV-1a, 64 bit: a stable, dependency-free content hash for cache keys (not for security).
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(pub u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    /// Mixes `bytes` in.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Hash of one byte string.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.write(bytes);
        h.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};

    #[test]
    fn cached_features_equal_computed_ones_and_a_corrupt_cache_is_recomputed() {
        let backbone =
            Backbone::from_bytes(digits_conv_card(), DIGITS_CONV_ONNX, Path::new("d.onnx"))
                .unwrap();
        let images = ImageSet {
            channels: 1,
            height: 8,
            width: 8,
            class_names: vec!["a".into(), "b".into()],
            images: (0..3 * 64).map(|i| (i % 17) as f32).collect(),
            labels: vec![0, 1, 0],
            raw_max: 16.0,
            masks: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let id = Fnv64::of(DIGITS_CONV_ONNX);
        let first = extract(&backbone, id, &images, Some(dir.path())).unwrap();
        let path = cache_path(dir.path(), id, &images);
        assert!(path.exists());
        let second = extract(&backbone, id, &images, Some(dir.path())).unwrap();
        assert_eq!(first, second);
        std::fs::write(&path, b"short").unwrap();
        let third = extract(&backbone, id, &images, Some(dir.path())).unwrap();
        assert_eq!(first, third);
        assert_eq!(first.features.len(), 3 * 512);
    }
}
