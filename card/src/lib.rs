//! fedge-card: model cards, the TOML file next to each `.onnx` that says how to feed it, and
//! the image arithmetic that follows from it (rescale, resize, channels, normalisation). No ML
//! framework: the device (through fedge-models), the coordinator's export and
//! `publish-backbone` read cards with this one parser.
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
//! raw_max = 16.0               # the raw value of a fully-on pixel (default 255)
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
    /// The raw value of a fully-on pixel that `scale`, `mean` and `std` were made for: 255 for
    /// 8-bit images (the default), 16 for the optical digits. Images on another scale are
    /// rescaled to it by [`ModelCard::adapt_chw`].
    #[serde(default = "default_raw_max")]
    pub raw_max: f32,
    /// Name of the feature output.
    pub output_name: String,
    /// Length of the feature vector per input.
    pub feature_size: usize,
    /// In a card `fedge-coordinator export` wrote (its model ends in the federation's head and
    /// `output_name` gives probabilities): the class of each output, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// In an exported card: the output holding the head's logits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_name: Option<String>,
    /// In an exported card: the release it holds (federation, round, strategy, backbone,
    /// sha256), for people; fedge does not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fedge: Option<toml::Table>,
}

fn default_raw_max() -> f32 {
    255.0
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
    #[error("model card {path}: {reason}")]
    Invalid {
        /// Card path.
        path: PathBuf,
        /// What is wrong.
        reason: InvalidCard,
    },
}

/// What is wrong with a card's fields.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidCard {
    /// A size is zero.
    #[error("channels, height, width and feature_size must be positive")]
    ZeroSize,
    /// `mean` or `std` has the wrong length.
    #[error("mean and std need one value per channel ({channels}), got {mean} and {std}")]
    PerChannel {
        /// Channels.
        channels: usize,
        /// Values in `mean`.
        mean: usize,
        /// Values in `std`.
        std: usize,
    },
    /// A `std` of zero or a non-finite value.
    #[error("std must be finite and non-zero, scale finite")]
    Scale,
    /// `raw_max` not positive.
    #[error("raw_max must be positive, got {0}")]
    RawMax(f32),
}

/// An image that cannot be brought to a card's input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdaptError {
    /// The values do not fill the stated shape.
    #[error("an image of {values} values is not {c}x{h}x{w}")]
    Shape {
        /// Values given.
        values: usize,
        /// Channels stated.
        c: usize,
        /// Height stated.
        h: usize,
        /// Width stated.
        w: usize,
    },
    /// A batch whose values are not a whole number of images.
    #[error("{values} values are not whole {shape:?} images")]
    NotWholeImages {
        /// Values given.
        values: usize,
        /// `(channels, height, width)` of one image.
        shape: (usize, usize, usize),
    },
    /// A detector's output is not whole boxes.
    #[error("a detector returns 4 values (x1, y1, x2, y2) per box; its card says {0} per image")]
    NotBoxes(usize),
    /// Channels that cannot be mapped (only 1 ↔ any is converted).
    #[error("{card} expects {expected} channels; images have {got} (only 1 <-> any is converted)")]
    Channels {
        /// The card's name.
        card: String,
        /// The card's channels.
        expected: usize,
        /// The images' channels.
        got: usize,
    },
}

impl ModelCard {
    /// Reads and checks a card.
    pub fn load(path: &Path) -> Result<Self, CardError> {
        let text = std::fs::read_to_string(path).map_err(|source| CardError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks a card's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, CardError> {
        let card: ModelCard = toml::from_str(text).map_err(|e| CardError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        card.check().map_err(|reason| CardError::Invalid {
            path: path.to_owned(),
            reason,
        })?;
        Ok(card)
    }

    /// The ONNX file of the card stored at `card_path` (its `file` is relative to the card).
    pub fn onnx_path(&self, card_path: &Path) -> PathBuf {
        card_path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&self.file)
    }

    /// The card as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Number of raw values per input image.
    pub fn input_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    fn check(&self) -> Result<(), InvalidCard> {
        if self.channels == 0 || self.height == 0 || self.width == 0 || self.feature_size == 0 {
            return Err(InvalidCard::ZeroSize);
        }
        if self.mean.len() != self.channels || self.std.len() != self.channels {
            return Err(InvalidCard::PerChannel {
                channels: self.channels,
                mean: self.mean.len(),
                std: self.std.len(),
            });
        }
        if self.std.iter().any(|s| !s.is_finite() || *s == 0.0) || !self.scale.is_finite() {
            return Err(InvalidCard::Scale);
        }
        if !(self.raw_max.is_finite() && self.raw_max > 0.0) {
            return Err(InvalidCard::RawMax(self.raw_max));
        }
        Ok(())
    }

    /// Brings one raw image given as `[c, h, w]` values on the scale `0..=source_max` to the
    /// card's input: rescaled to `0..=raw_max`, resized to `height × width` (bilinear, pixel
    /// centres aligned, as image libraries do), and with the card's channel count (a grayscale
    /// image is replicated to every channel; a colour image becomes grayscale by the mean of
    /// its channels). Appends `input_len()` values in CHW order to `out`.
    ///
    /// Fails when the image does not have `c * h * w` values or its channels cannot be mapped.
    pub fn adapt_chw(
        &self,
        image: &[f32],
        (c, h, w): (usize, usize, usize),
        source_max: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), AdaptError> {
        if image.len() != c * h * w || c == 0 || h == 0 || w == 0 {
            return Err(AdaptError::Shape {
                values: image.len(),
                c,
                h,
                w,
            });
        }
        if c != self.channels && c != 1 && self.channels != 1 {
            return Err(AdaptError::Channels {
                card: self.name.clone(),
                expected: self.channels,
                got: c,
            });
        }
        let factor = if source_max > 0.0 {
            self.raw_max / source_max
        } else {
            1.0
        };
        let plane = h * w;
        let gray: Vec<f32>;
        let planes: Vec<&[f32]> = if self.channels == 1 && c > 1 {
            gray = (0..plane)
                .map(|p| (0..c).map(|k| image[k * plane + p]).sum::<f32>() / c as f32)
                .collect();
            vec![&gray]
        } else {
            image.chunks_exact(plane).collect()
        };
        for k in 0..self.channels {
            let src = planes[k.min(planes.len() - 1)];
            resize_bilinear(src, (h, w), (self.height, self.width), factor, out);
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

/// Resizes one `h × w` plane to `oh × ow` with bilinear interpolation (half-pixel centres,
/// edges clamped), multiplies by `factor` and appends the result to `out`. Equal sizes copy.
fn resize_bilinear(
    src: &[f32],
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    factor: f32,
    out: &mut Vec<f32>,
) {
    if (h, w) == (oh, ow) {
        out.extend(src.iter().map(|v| v * factor));
        return;
    }
    // Source coordinate and weight of the upper neighbour along one axis.
    let axis = |i: usize, n: usize, on: usize| {
        let x = ((i as f32 + 0.5) * n as f32 / on as f32 - 0.5).clamp(0.0, (n - 1) as f32);
        let x0 = x.floor() as usize;
        (x0, (x0 + 1).min(n - 1), x - x0 as f32)
    };
    for r in 0..oh {
        let (y0, y1, fy) = axis(r, h, oh);
        for c in 0..ow {
            let (x0, x1, fx) = axis(c, w, ow);
            let top = src[y0 * w + x0] * (1.0 - fx) + src[y0 * w + x1] * fx;
            let bottom = src[y1 * w + x0] * (1.0 - fx) + src[y1 * w + x1] * fx;
            out.push((top * (1.0 - fy) + bottom * fy) * factor);
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
            raw_max: 255.0,
            output_name: "features".into(),
            feature_size: 3,
            classes: Vec::new(),
            logits_name: None,
            fedge: None,
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
    fn adaptation_replicates_gray_resizes_and_rescales() {
        let mut c = card(Layout::Nchw);
        (c.channels, c.height, c.width, c.raw_max) = (3, 4, 4, 16.0);
        // A 2x2 grayscale image on 0..=255, upsampled to 4x4 and rescaled to 0..=16.
        let image = [0.0, 255.0, 255.0, 0.0];
        let mut out = Vec::new();
        c.adapt_chw(&image, (1, 2, 2), 255.0, &mut out).unwrap();
        assert_eq!(out.len(), 48);
        let plane = &out[..16];
        let near = |a: f32, b: f32| (a - b).abs() < 1e-5;
        assert!(near(plane[0], 0.0), "corners keep their pixel: {plane:?}");
        assert!(near(plane[3], 16.0), "{plane:?}");
        assert!(
            near(plane[1], 4.0),
            "a quarter of the way from 0 to 16: {plane:?}"
        );
        assert!(
            near(plane[5], 4.0 * 0.75 + 12.0 * 0.25),
            "bilinear inside: {plane:?}"
        );
        assert_eq!(&out[16..32], plane, "gray replicated to every channel");
        assert_eq!(&out[32..], plane);
        // Colour to gray is the mean of the channels; equal sizes copy.
        (c.channels, c.height, c.width) = (1, 1, 2);
        out.clear();
        c.adapt_chw(&[3.0, 6.0, 9.0, 0.0, 0.0, 0.0], (3, 1, 2), 16.0, &mut out)
            .unwrap();
        assert_eq!(out, [4.0, 2.0]);
        let err = c
            .adapt_chw(&[1.0; 5], (3, 1, 2), 16.0, &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not 3x1x2"), "{err}");
        c.channels = 2;
        let err = c
            .adapt_chw(&[1.0; 6], (3, 1, 2), 16.0, &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expects 2 channels"), "{err}");
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
