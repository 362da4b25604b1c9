//! Model cards: the TOML file next to each `.onnx` that says how to feed it.
//!
//! ```toml
//! name = "digits-conv"
//! file = "digits-conv.onnx"     # relative to the card
//! input_name = "input"
//! layout = "nchw"               # or "nhwc"
//! channels = 1
//! height = 8
//! width = 8
//! scale = 0.0625                # raw value multiplier, applied first
//! mean = [0.0]                  # per channel, after scaling
//! std = [1.0]
//! output_name = "features"
//! feature_size = 512
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Memory layout of the backbone's image input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Batch, channels, height, width.
    Nchw,
    /// Batch, height, width, channels.
    Nhwc,
}

/// How to feed a backbone and what it returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// Short name, reported in device status.
    pub name: String,
    /// The ONNX file, relative to the card's folder.
    pub file: PathBuf,
    /// Name of the image input.
    pub input_name: String,
    /// Input layout.
    pub layout: Layout,
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Multiplier applied to raw values (e.g. 1/255 for 8-bit images).
    pub scale: f32,
    /// Per-channel mean subtracted after scaling.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation divided by after subtracting the mean.
    pub std: Vec<f32>,
    /// Name of the feature output.
    pub output_name: String,
    /// Length of the feature vector per input.
    pub feature_size: usize,
}

/// A card that cannot be read or does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// The file could not be read.
    #[error("cannot read model card {path}: {source}")]
    Io {
        /// Card path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not valid TOML for a card.
    #[error("model card {path} is not valid: {message}")]
    Parse {
        /// Card path.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// Fields that contradict each other.
    #[error("model card {path}: {message}")]
    Invalid {
        /// Card path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl ModelCard {
    /// Reads and checks a card.
    pub fn load(path: &Path) -> Result<Self, CardError> {
        let text = std::fs::read_to_string(path).map_err(|source| CardError::Io {
            path: path.to_owned(),
            source,
        })?;
        let card: ModelCard = toml::from_str(&text).map_err(|e| CardError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        card.check().map_err(|message| CardError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(card)
    }

    /// The card as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Number of raw values per input image.
    pub fn input_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    fn check(&self) -> Result<(), String> {
        if self.channels == 0 || self.height == 0 || self.width == 0 || self.feature_size == 0 {
            return Err("channels, height, width and feature_size must be positive".into());
        }
        if self.mean.len() != self.channels || self.std.len() != self.channels {
            return Err(format!(
                "mean and std need one value per channel ({}), got {} and {}",
                self.channels,
                self.mean.len(),
                self.std.len()
            ));
        }
        if self.std.iter().any(|s| !s.is_finite() || *s == 0.0) || !self.scale.is_finite() {
            return Err("std must be finite and non-zero, scale finite".into());
        }
        Ok(())
    }

    /// Applies scale, mean and std to one image given channel-first (`[C, H, W]`) and writes
    /// it in the card's layout.
    pub fn normalise_chw(&self, chw: &[f32], out: &mut Vec<f32>) {
        let plane = self.height * self.width;
        match self.layout {
            Layout::Nchw => {
                for (c, values) in chw.chunks_exact(plane).enumerate() {
                    let (m, s) = (self.mean[c], self.std[c]);
                    out.extend(values.iter().map(|v| (v * self.scale - m) / s));
                }
            }
            Layout::Nhwc => {
                for p in 0..plane {
                    for c in 0..self.channels {
                        let v = chw[c * plane + p];
                        out.push((v * self.scale - self.mean[c]) / self.std[c]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(layout: Layout) -> ModelCard {
        ModelCard {
            name: "t".into(),
            file: "t.onnx".into(),
            input_name: "input".into(),
            layout,
            channels: 2,
            height: 1,
            width: 2,
            scale: 0.5,
            mean: vec![1.0, 0.0],
            std: vec![1.0, 2.0],
            output_name: "features".into(),
            feature_size: 3,
        }
    }

    #[test]
    fn normalisation_follows_layout() {
        let chw = [2.0, 4.0, 8.0, 12.0];
        let mut out = Vec::new();
        card(Layout::Nchw).normalise_chw(&chw, &mut out);
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0]);
        out.clear();
        card(Layout::Nhwc).normalise_chw(&chw, &mut out);
        assert_eq!(out, [0.0, 2.0, 1.0, 3.0]);
    }

    #[test]
    fn card_round_trips_through_toml_and_rejects_bad_std() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, card(Layout::Nchw).to_toml()).unwrap();
        assert_eq!(ModelCard::load(&path).unwrap(), card(Layout::Nchw));
        let mut bad = card(Layout::Nchw);
        bad.std = vec![1.0];
        std::fs::write(&path, bad.to_toml()).unwrap();
        let err = ModelCard::load(&path).unwrap_err().to_string();
        assert!(err.contains("one value per channel"), "{err}");
    }
}
