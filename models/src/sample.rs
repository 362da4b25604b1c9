//! Does tract agree with the tool that made a backbone?
//!
//! A converter (such as `models/tools/efficientnet_lite0.py`) writes, next to the card
//! `NAME.toml`, a raw sample image `NAME-sample.f32` in the card's input shape and the features
//! it computed for it, `NAME-expected.f32` (both little-endian f32 without a header). Running the
//! sample through tract and comparing shows that the ONNX file, its card and tract's reading of
//! it say the same thing as the converter's own forward pass.

use std::path::{Path, PathBuf};

use crate::backbone::{Backbone, BackboneError};

/// The largest difference allowed, relative to the largest expected feature (or 1).
pub const SAMPLE_TOLERANCE: f32 = 1e-3;

/// The outcome of [`check_sample`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleCheck {
    /// Largest absolute difference between tract's and the converter's features.
    pub max_abs_diff: f32,
    /// Largest absolute expected feature.
    pub max_abs: f32,
}

impl SampleCheck {
    /// True when the difference is within [`SAMPLE_TOLERANCE`] of `max(1, max_abs)`.
    pub fn agrees(&self) -> bool {
        self.max_abs_diff <= SAMPLE_TOLERANCE * self.max_abs.max(1.0)
    }
}

/// The sample image and expected features next to `card_path`.
pub fn sample_paths(card_path: &Path) -> (PathBuf, PathBuf) {
    let stem = card_path.file_stem().unwrap_or_default().to_string_lossy();
    let dir = card_path.parent().unwrap_or(Path::new("."));
    (
        dir.join(format!("{stem}-sample.f32")),
        dir.join(format!("{stem}-expected.f32")),
    )
}

/// Runs the sample next to `card_path` through `backbone` and compares; `None` when there is
/// no sample.
pub fn check_sample(
    backbone: &Backbone,
    card_path: &Path,
) -> Result<Option<SampleCheck>, BackboneError> {
    let (sample_path, expected_path) = sample_paths(card_path);
    if !sample_path.exists() {
        return Ok(None);
    }
    let read = |path: &Path| -> Result<Vec<f32>, BackboneError> {
        let bytes = std::fs::read(path).map_err(|e| BackboneError::Run {
            name: backbone.card().name.clone(),
            message: format!("cannot read {}: {e}", path.display()),
        })?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    };
    let sample = read(&sample_path)?;
    let expected = read(&expected_path)?;
    let got = backbone.features(&sample, 1)?;
    if got.len() != expected.len() {
        return Err(BackboneError::Run {
            name: backbone.card().name.clone(),
            message: format!(
                "{} holds {} features, the backbone gives {}",
                expected_path.display(),
                expected.len(),
                got.len()
            ),
        });
    }
    let max_abs_diff = got
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let max_abs = expected.iter().map(|v| v.abs()).fold(0f32, f32::max);
    Ok(Some(SampleCheck {
        max_abs_diff,
        max_abs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::write_digits_conv;

    #[test]
    fn the_sample_check_catches_a_disagreement() {
        let dir = tempfile::tempdir().unwrap();
        let card_path = write_digits_conv(dir.path()).unwrap();
        let backbone = Backbone::load(&card_path).unwrap();
        assert_eq!(check_sample(&backbone, &card_path).unwrap(), None);
        let sample: Vec<f32> = (0..64).map(|v| (v % 17) as f32).collect();
        let mut features = backbone.features(&sample, 1).unwrap();
        let (s, e) = sample_paths(&card_path);
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        std::fs::write(&s, bytes(&sample)).unwrap();
        std::fs::write(&e, bytes(&features)).unwrap();
        let ok = check_sample(&backbone, &card_path).unwrap().unwrap();
        assert!(ok.agrees() && ok.max_abs_diff == 0.0, "{ok:?}");
        features[7] += 0.5 * ok.max_abs.max(1.0);
        std::fs::write(&e, bytes(&features)).unwrap();
        let bad = check_sample(&backbone, &card_path).unwrap().unwrap();
        assert!(!bad.agrees(), "{bad:?}");
    }
}
