//! The feature cache: the frozen backbone runs once per sample into a [`FeatureSet`] (the
//! cached features and labels every objective trains on, defined in `fedge-device`).
//!
//! Features are computed in batches when a device starts and kept in memory for every round.
//! With a cache folder they are also written to disk (through the one durable atomic write,
//! `fedge_daemon::write_atomically`), keyed by a hash of the backbone file and the raw images,
//! so a restarted device skips the backbone entirely. It does not train.

use std::path::{Path, PathBuf};

use fedge_daemon::{Visibility, write_atomically};
use fedge_device::{FeatureSet, Fnv64};
use fedge_models::{Backbone, BackboneError, CardError, ModelCard, RuntimeConfig, check_sample};

use crate::data::ImageSet;
use crate::data::progress::{Phase, Progress};

/// Why a backbone could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadBackboneError {
    /// The model card is missing.
    #[error(
        "no model card {}: a backbone needs its card next to it \
         (models/tools/fetch-efficientnet-lite0.sh writes both)",
        .0.display()
    )]
    NoCard(PathBuf),
    /// The model card is unreadable or invalid.
    #[error(transparent)]
    Card(#[from] CardError),
    /// The ONNX file is unreadable.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The ONNX file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The backbone does not load or run.
    #[error(transparent)]
    Backbone(#[from] BackboneError),
    /// The profile trains a tail this backbone does not end with.
    #[error("train_tail = true: {0}")]
    Tail(#[from] fedge_models::TailError),
    /// The backbone's features differ from its converter's sample.
    #[error(
        "{} disagrees with its converter's sample (largest difference {max_abs_diff} for \
         features up to {max_abs}): convert it again",
        onnx.display()
    )]
    Disagrees {
        /// The ONNX file.
        onnx: PathBuf,
        /// Largest absolute difference.
        max_abs_diff: f32,
        /// Largest absolute feature value.
        max_abs: f32,
    },
}

/// A backbone's trainable tail and the backbone cut before it: what a device with
/// `train_tail = true` trains on, and what serves a release with a tail.
#[derive(Debug)]
pub struct TailParts {
    /// The tail, with the backbone's own weights of the block.
    pub tail: fedge_models::Tail,
    /// The backbone up to the tail's cut (its features are the cut's activations).
    pub cut: std::sync::Arc<Backbone>,
}

/// The ONNX file of `backbone`, read again from where it was loaded (`backbone.origin()`).
pub fn backbone_onnx(backbone: &Backbone) -> Result<Vec<u8>, LoadBackboneError> {
    std::fs::read(backbone.origin()).map_err(|source| LoadBackboneError::Read {
        path: backbone.origin().to_owned(),
        source,
    })
}

/// The tail of `backbone` and the backbone cut before it, in tract on `threads` threads.
pub fn split_tail(backbone: &Backbone, threads: usize) -> Result<TailParts, LoadBackboneError> {
    let (tail, cut) = fedge_models::Tail::split(backbone, &backbone_onnx(backbone)?, threads)?;
    Ok(TailParts {
        tail,
        cut: std::sync::Arc::new(cut),
    })
}

/// The feature cache's id of the activations at `tail`'s cut of the backbone `backbone_id`
/// (kept apart from the whole backbone's features).
pub fn cut_id(backbone_id: u64, tail: &fedge_models::Tail) -> u64 {
    backbone_id ^ Fnv64::of(tail.cut.as_bytes())
}

/// Images per backbone call: one. tract runs EfficientNet-Lite0 fastest one image at a time at
/// every input size measured (32×32: 1,021 images/s against 697–877 at batches 2–64; 224×224:
/// 44 against 16 at batch 8; larger batches add layout transposes), and the built-in
/// digits-conv loses 5 % (BENCHMARKS.md, "Feature extraction at the sizes cameras use").
pub const BATCH: usize = 1;

/// Images per piece of a long extraction: progress is reported between pieces.
const PIECE: usize = 256;

/// The backbone over every image, piece by piece, showing how far it got
/// (`crate::data::progress`: a bar with an ETA on a terminal, log lines every few seconds once
/// it takes a second, and the process's report, which the agent's status reads), since a large
/// folder on a gateway takes minutes.
fn with_progress(backbone: &Backbone, images: &ImageSet) -> Result<Vec<f32>, BackboneError> {
    let shape = (images.channels, images.height, images.width);
    let (n, len) = (images.len(), images.image_len());
    let report = crate::data::LoadReport::process();
    let mut progress = Progress::start(&report, Phase::Features, n as u64, "computing features");
    let mut features = Vec::with_capacity(n * backbone.card().feature_size);
    for first in (0..n).step_by(PIECE) {
        let last = (first + PIECE).min(n);
        let piece = &images.images[first * len..last * len];
        features.extend(backbone.features_of(piece, shape, images.raw_max, BATCH)?);
        progress.advance((last - first) as u64);
    }
    progress.end(&format!("features computed: {n} images"));
    Ok(features)
}

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
    let features = with_progress(backbone, images)?;
    if let Some(path) = &path {
        let bytes: Vec<u8> = features.iter().flat_map(|v| v.to_le_bytes()).collect();
        // The durable write creates the folder; a cache file that cannot be written costs the
        // next start a backbone pass, nothing more.
        if let Err(e) = write_atomically(path, &bytes, Visibility::Private) {
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
pub fn load_backbone(path: &Path) -> Result<(Backbone, u64), LoadBackboneError> {
    load_backbone_with(path, &RuntimeConfig::tract(), 0)
}

/// As [`load_backbone`], into the engine `runtime` names (ONNX Runtime with `threads` threads
/// per run, 0: its default); the converter's sample is checked with that engine.
pub fn load_backbone_with(
    path: &Path,
    runtime: &RuntimeConfig,
    threads: usize,
) -> Result<(Backbone, u64), LoadBackboneError> {
    let card_path = if path.extension().is_some_and(|e| e == "onnx") {
        path.with_extension("toml")
    } else {
        path.to_owned()
    };
    if !card_path.exists() {
        return Err(LoadBackboneError::NoCard(card_path));
    }
    let card = ModelCard::load(&card_path)?;
    let onnx = card.onnx_path(&card_path);
    let bytes = std::fs::read(&onnx).map_err(|source| LoadBackboneError::Read {
        path: onnx.clone(),
        source,
    })?;
    let backbone = Backbone::from_bytes_with(card, &bytes, &onnx, runtime, threads)?;
    if let Some(check) = check_sample(&backbone, &card_path)?
        && !check.agrees()
    {
        return Err(LoadBackboneError::Disagrees {
            onnx,
            max_abs_diff: check.max_abs_diff,
            max_abs: check.max_abs,
        });
    }
    Ok((backbone, Fnv64::of(&bytes)))
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
