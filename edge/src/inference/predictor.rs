//! Predictions of the released head on single images: the image is decoded and resized the
//! way training data is (`crate::data::decode`), passed through the frozen backbone, then the
//! head runs in plain f32.

use std::path::Path;
use std::sync::Arc;

use fedge_models::{Backbone, BackboneError};
use fedge_wire::{FeatureNorm, InvalidRelease, ModelRelease, SiteChoice, SiteVariant};
use serde::Serialize;

use super::scores::{logits, softmax};
use crate::data::decode::{decode_bytes_within, to_chw};
use fedge_device::site_choice::SiteServing;
use fedge_device::site_norm::FeatureStats;

/// The raw value of a fully-on 8-bit pixel, the scale image files are decoded to (as
/// ImageFolder training data is).
const RAW_MAX: f32 = 255.0;

/// Largest image a predictor decodes, checked on the header before any pixel is decoded, and
/// given to the decoder as its allocation limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest width and largest height, in pixels.
    pub max_side: u32,
    /// Largest width × height.
    pub max_pixels: u64,
    /// Most bytes the decoded image and its 8-bit conversion copy may take together.
    pub max_bytes: u64,
}

impl Default for ImageLimits {
    /// 8192 pixels a side, 16 Mpixel, 64 MiB decoded (a few megapixels is plenty for the
    /// 224² inputs backbones take).
    fn default() -> Self {
        Self {
            max_side: 8192,
            max_pixels: 16 << 20,
            max_bytes: 64 << 20,
        }
    }
}

impl ImageLimits {
    /// The limits for a device with `memory_budget_mb` (0: no budget, the defaults): a
    /// quarter of the budget for one decoded image and its conversion copy (at least 8 MiB,
    /// at most the default), so that a request cannot take the process past its budget.
    pub fn for_memory_budget(memory_budget_mb: u64) -> Self {
        let default = Self::default();
        if memory_budget_mb == 0 {
            return default;
        }
        let max_bytes = ((memory_budget_mb << 20) / 4).clamp(8 << 20, default.max_bytes);
        Self {
            max_bytes,
            // RGBA decoded, RGB converted: 7 bytes a pixel at most for an accepted image.
            max_pixels: (max_bytes / 7).min(default.max_pixels),
            ..default
        }
    }
}

/// A release that cannot be used with this backbone.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    /// A variant chosen for the site does not fit the release.
    #[error("the site's variant does not fit the release: {0}")]
    Variant(String),
    /// The release does not verify.
    #[error("the model release does not verify: {0}")]
    Release(#[from] InvalidRelease),
    /// The head's input size is not the backbone's feature size.
    #[error(
        "the model's head takes {head} features but the backbone {card:?} gives {card_features}: \
         point the profile's `backbone` at the card the federation trains with"
    )]
    Features {
        /// The card's name.
        card: String,
        /// The card's `feature_size`.
        card_features: usize,
        /// The head's `features`.
        head: usize,
    },
    /// The release trains a tail this backbone cannot give.
    #[error("the model trains the backbone's tail, and {0}")]
    Tail(String),
    /// The release names another backbone.
    #[error(
        "the model was trained on backbone {release:?} but this device runs {card:?}: point the \
         profile's `backbone` at the {release:?} card"
    )]
    Backbone {
        /// The card's name.
        card: String,
        /// The release's backbone.
        release: String,
    },
    /// The release standardises features per site and no site statistics were given.
    #[error(
        "the model standardises features with the predicting site's own statistics \
         (feature_norm = \"site\") and this site has none: give the device local data (its \
         profile's [data]) to compute them from"
    )]
    NoSiteStats,
    /// The site statistics do not fit the head.
    #[error("the site statistics hold {got} features, the model's head takes {expected}")]
    SiteStats {
        /// The head's `features`.
        expected: usize,
        /// The statistics' size.
        got: usize,
    },
}

/// An image that cannot be predicted.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    /// No bytes at all.
    #[error("the image is empty: send the bytes of a PNG or JPEG file")]
    Empty,
    /// Not a PNG or JPEG, or a damaged one.
    #[error("not a readable PNG or JPEG image ({0}): send the bytes of a PNG or JPEG file")]
    NotAnImage(String),
    /// The header declares more pixels or bytes than the limits allow.
    #[error(
        "the image is {width}x{height} pixels, larger than allowed ({max_side} a side, \
         {max_pixels} pixels, {max_bytes} bytes decoded): send a smaller image"
    )]
    TooLarge {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
        /// The limit on each side.
        max_side: u32,
        /// The limit on width × height.
        max_pixels: u64,
        /// The limit on the decoded bytes.
        max_bytes: u64,
    },
    /// More than 8 bits a channel.
    #[error(
        "the image has {bits} bits a channel: send an 8-bit PNG or JPEG (the backbone takes 8-bit \
         values, and a 16-bit image doubles what decoding it takes)"
    )]
    Depth {
        /// Bits a channel.
        bits: u16,
    },
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The backbone failed.
    #[error(transparent)]
    Backbone(#[from] BackboneError),
}

/// One class and its probability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassScore {
    /// Class name.
    pub class: String,
    /// Softmax probability.
    pub probability: f32,
}

/// The head's answer for one image.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// The most likely class's name.
    pub class: String,
    /// Its index in the release's class list.
    pub index: usize,
    /// Its softmax probability.
    pub probability: f32,
    /// The best classes, most likely first.
    pub top_k: Vec<ClassScore>,
    /// The head's outputs, one per class, in the release's class order.
    pub logits: Vec<f32>,
    /// The round of the release that answered.
    pub model_round: u64,
    /// The SHA-256 of the release that answered (hex), as `GET /v1/model`, the coordinator's
    /// `model/current` and the device's serving log name it.
    pub model_sha256: String,
    /// How far the image's features are from the nearest class the federation trained on, in
    /// within-class standard deviations (about 1 for an image like the training ones;
    /// docs/algorithms.md §7, "Unfamiliar inputs"); absent when the release carries no pooled
    /// summary (`feature_norm = "none"` or `"site"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distance: Option<f32>,
    /// Whether `distance` is above `[inference] unfamiliar_distance`: the model has seen
    /// nothing like this image (a blank frame, a covered lens, another kind of object), so its
    /// class and probability are not to be trusted whatever the probability says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfamiliar: Option<bool>,
    /// The variant of the release that answered at this site (`[inference] adapt`): the
    /// release as it is, its label-free adaptation or the site's correction.
    pub variant: SiteVariant,
}

/// Default `[inference] unfamiliar_distance`: on the built-in digits, 99.9 % of the training
/// sites' images measure below 2.7 and a blank white image 6.6.
pub const DEFAULT_UNFAMILIAR_DISTANCE: f32 = 3.0;

/// Told of every image a predictor answers over HTTP or MQTT (the site's labelling queue
/// keeps some of them), on the thread that predicted.
pub trait Served: Send + Sync + std::fmt::Debug {
    /// `image` the file's bytes, `prediction` the answer, `classes` the release's class list
    /// (the order of `prediction.logits`).
    fn served(&self, image: &[u8], prediction: &Prediction, classes: &[String]);
}

/// The released head over the device's backbone.
#[derive(Debug)]
pub struct Predictor {
    backbone: Arc<Backbone>,
    release: ModelRelease,
    /// The verified flat parameters.
    params: Vec<f32>,
    limits: ImageLimits,
    /// The site's feature statistics, applied when the release asks for site normalisation.
    site: Option<FeatureStats>,
    /// The release's pooled summary, for how unfamiliar an image is.
    familiarity: Option<fedge_wire::Familiarity>,
    /// Above this distance an image is unfamiliar; 0: never.
    unfamiliar_distance: f32,
    /// The drift alarm every prediction's distance goes to, when the device watches.
    drift: Option<Arc<super::DriftWatch>>,
    /// Told of every image answered, when the site keeps a labelling queue.
    served: Option<Arc<dyn Served>>,
    /// The release's SHA-256 in hex, named in every answer.
    sha256: String,
    /// With a release that trains the backbone's tail: the tail and the backbone up to its cut,
    /// which run instead of the whole backbone.
    tail: Option<Arc<crate::features::TailParts>>,
    /// The variant of the release served at this site, and why.
    variant: SiteVariant,
    variant_reason: String,
    /// Added to the head's logits (the label-free variant's prior correction).
    log_ratio: Option<Vec<f32>>,
    /// The release this one replaced, answering every request beside it, and the count of
    /// their answers (the canary's look at the head).
    shadow: Option<(Arc<super::Shadow>, Arc<super::HeadWatch>)>,
}

impl Predictor {
    /// Verifies `release` and checks that it fits `backbone`: the head's input is the card's
    /// feature size, and the backbone names agree when both are known. A release with
    /// `feature_norm = "site"` needs the predicting site's statistics (`site`, see
    /// `fedge_device::site_norm`); other releases ignore them.
    pub fn new(
        backbone: Arc<Backbone>,
        release: ModelRelease,
        site: Option<FeatureStats>,
    ) -> Result<Self, PredictorError> {
        Self::with_tail_parts(backbone, release, site, None)
    }

    /// [`Predictor::new`], with the backbone's tail and cut already at hand (`tail`, a
    /// `train_tail` device's, so a release does not load them again); without them, a release
    /// with a tail has them made from the backbone's ONNX file.
    pub fn with_tail_parts(
        backbone: Arc<Backbone>,
        release: ModelRelease,
        site: Option<FeatureStats>,
        tail: Option<Arc<crate::features::TailParts>>,
    ) -> Result<Self, PredictorError> {
        let params = release.verify()?;
        let site = match (release.feature_norm, site) {
            (FeatureNorm::None, _) => None,
            (_, None) => return Err(PredictorError::NoSiteStats),
            (_, Some(stats)) if stats.mean.len() != release.head.features => {
                return Err(PredictorError::SiteStats {
                    expected: release.head.features,
                    got: stats.mean.len(),
                });
            }
            (_, Some(stats)) => Some(stats),
        };
        let card = backbone.card();
        if release.head.features != card.feature_size {
            return Err(PredictorError::Features {
                card: card.name.clone(),
                card_features: card.feature_size,
                head: release.head.features,
            });
        }
        if !card.name.is_empty() && !release.backbone.is_empty() && card.name != release.backbone {
            return Err(PredictorError::Backbone {
                card: card.name.clone(),
                release: release.backbone.clone(),
            });
        }
        let tail = match (&release.head.tail, tail) {
            (None, _) => None,
            (Some(config), given) => {
                let parts = match given {
                    Some(parts) => parts,
                    None => Arc::new(
                        crate::features::split_tail(&backbone, 1)
                            .map_err(|e| PredictorError::Tail(e.to_string()))?,
                    ),
                };
                if parts.tail.config != *config {
                    return Err(PredictorError::Tail(format!(
                        "its sizes {config:?} are not this backbone's {:?}",
                        parts.tail.config
                    )));
                }
                Some(parts)
            }
        };
        let familiarity = release.pooled.as_ref().and_then(|p| p.familiarity());
        let sha256 = release.sha256_hex();
        Ok(Self {
            backbone,
            release,
            params,
            limits: ImageLimits::default(),
            site,
            familiarity,
            unfamiliar_distance: DEFAULT_UNFAMILIAR_DISTANCE,
            drift: None,
            served: None,
            sha256,
            tail,
            variant: SiteVariant::Release,
            variant_reason: String::new(),
            log_ratio: None,
            shadow: None,
        })
    }

    /// The same predictor serving `served`, a variant of its release chosen for this site
    /// (`fedge_device::site_choice`): its statistics, its head's parameters and the correction
    /// of the head's logits, each checked against the release's sizes.
    pub fn adapted(mut self, served: SiteServing) -> Result<Self, PredictorError> {
        served
            .fits(&self.release.head)
            .map_err(PredictorError::Variant)?;
        if let Some(params) = served.params {
            self.params = params;
        }
        self.site = served.stats;
        self.log_ratio = served.log_ratio;
        self.variant = served.variant;
        self.variant_reason = served.reason;
        Ok(self)
    }

    /// The variant it serves, of which release, and why.
    pub fn choice(&self) -> SiteChoice {
        SiteChoice {
            variant: self.variant,
            sha256: self.sha256.clone(),
            reason: self.variant_reason.clone(),
        }
    }

    /// The same predictor answering beside `shadow`, the release it replaced, every request
    /// counted in `watch`.
    pub fn with_shadow(mut self, shadow: Arc<super::Shadow>, watch: Arc<super::HeadWatch>) -> Self {
        self.shadow = Some((shadow, watch));
        self
    }

    /// The release it answers beside, if any.
    pub fn shadow(&self) -> Option<&Arc<super::Shadow>> {
        self.shadow.as_ref().map(|(s, _)| s)
    }

    /// This predictor as a shadow of the release that replaces it: `None` when it trains the
    /// backbone's tail (its head reads other features than a successor's).
    pub fn as_shadow(&self) -> Option<super::Shadow> {
        self.tail.is_none().then(|| super::Shadow {
            sha256: self.sha256.clone(),
            head: self.release.head.clone(),
            params: self.params.clone(),
            site: self.site.clone(),
            log_ratio: self.log_ratio.clone(),
        })
    }

    /// The same predictor feeding every prediction's distance to `watch`.
    pub fn with_drift(mut self, watch: Arc<super::DriftWatch>) -> Self {
        self.drift = Some(watch);
        self
    }

    /// The same predictor telling `served` of every image it answers from its bytes.
    pub fn with_served(mut self, served: Arc<dyn Served>) -> Self {
        self.served = Some(served);
        self
    }

    /// The familiarity distance of each row of `features` (`F` values each) under the
    /// release's pooled summary; `None` without one. What a drift watch's reference is made of.
    pub fn distances(&self, features: &[f32]) -> Option<Vec<f32>> {
        let familiarity = self.familiarity.as_ref()?;
        let f = self.release.head.features;
        Some(
            (features.chunks_exact(f))
                .filter_map(|row| familiarity.distance(row))
                .collect(),
        )
    }

    /// The same predictor flagging images above `distance` as unfamiliar (0: never).
    pub fn with_unfamiliar_distance(mut self, distance: f32) -> Self {
        self.unfamiliar_distance = distance;
        self
    }

    /// The same predictor with other image limits.
    pub fn with_limits(mut self, limits: ImageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The release it answers with.
    pub fn release(&self) -> &ModelRelease {
        &self.release
    }

    /// The drift watch its predictions feed, if any.
    pub fn drift(&self) -> Option<&Arc<super::DriftWatch>> {
        self.drift.as_ref()
    }

    /// The site statistics it standardises features with, if the release asks for any.
    pub fn site_stats(&self) -> Option<&FeatureStats> {
        self.site.as_ref()
    }

    /// The backbone it runs.
    pub fn backbone(&self) -> &Backbone {
        &self.backbone
    }

    /// Predicts a PNG or JPEG held in memory, listing the `top_k` best classes (at most all).
    pub fn predict_bytes(&self, bytes: &[u8], top_k: usize) -> Result<Prediction, PredictError> {
        if bytes.is_empty() {
            return Err(PredictError::Empty);
        }
        self.check_header(bytes)?;
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(self.limits.max_side);
        limits.max_image_height = Some(self.limits.max_side);
        limits.max_alloc = Some(self.limits.max_bytes);
        let image = decode_bytes_within(bytes, limits)
            .map_err(|e| PredictError::NotAnImage(e.to_string()))?;
        let card = self.backbone.card();
        let (c, h, w) = (card.channels, card.height, card.width);
        let (Ok(h32), Ok(w32)) = (u32::try_from(h), u32::try_from(w)) else {
            return Err(PredictError::NotAnImage(format!(
                "the card's input {h}x{w} is too large"
            )));
        };
        let chw = to_chw(image, c, h32, w32);
        let features = match &self.tail {
            None => self.backbone.features_of(&chw, (c, h, w), RAW_MAX, 1)?,
            Some(parts) => {
                let (tail, cut) = (&parts.tail, &parts.cut);
                let activations = cut.features_of(&chw, (c, h, w), RAW_MAX, 1)?;
                // `new` verified the parameters against the head with this tail: the offsets
                // come first.
                let (weight, rest) = self.params.split_at(tail.config.weight_len());
                let offsets = fedge_wire::layout::TailTensors {
                    weight,
                    bias: &rest[..tail.config.channels],
                };
                tail.apply(&offsets, &activations)
            }
        };
        let prediction = self.predict_features(&features, top_k);
        if let Some(served) = &self.served {
            served.served(bytes, &prediction, &self.release.classes);
        }
        Ok(prediction)
    }

    /// Reads and predicts an image file.
    pub fn predict_file(&self, path: &Path, top_k: usize) -> Result<Prediction, PredictError> {
        let bytes = std::fs::read(path).map_err(|source| PredictError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.predict_bytes(&bytes, top_k)
    }

    /// The head's answer for one image's backbone features (`F` values).
    ///
    /// # Panics
    ///
    /// Panics if `features` does not hold the head's `F` values.
    pub fn predict_features(&self, features: &[f32], top_k: usize) -> Prediction {
        assert_eq!(
            features.len(),
            self.release.head.features,
            "one image's features"
        );
        let distance = (self.familiarity.as_ref()).and_then(|f| f.distance(features));
        let unfamiliar =
            distance.map(|d| self.unfamiliar_distance > 0.0 && d > self.unfamiliar_distance);
        let raw = features;
        let standardised;
        let features = match &self.site {
            Some(stats) => {
                standardised = {
                    let mut f = features.to_vec();
                    stats.apply_in_place(&mut f);
                    f
                };
                &standardised[..]
            }
            None => features,
        };
        let mut logits = logits(&self.release.head, &self.params, features);
        if let Some(ratio) = &self.log_ratio {
            logits.iter_mut().zip(ratio).for_each(|(l, r)| *l += r);
        }
        let probabilities = softmax(&logits);
        let index = fedge_models::head::argmax(&logits);
        if let Some(watch) = &self.drift {
            watch.observe(raw, distance, probabilities[index]);
        }
        if let Some((shadow, watch)) = &self.shadow
            && shadow.head.features == raw.len()
            && shadow.head.classes == logits.len()
        {
            let (before, probability) = shadow.answer(raw);
            watch.count(before, probability, index);
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Stable: equal probabilities keep the class order, so the first is `index`.
        order.sort_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
        let classes = &self.release.classes;
        Prediction {
            class: classes[index].clone(),
            index,
            probability: probabilities[index],
            top_k: order
                .into_iter()
                .take(top_k)
                .map(|k| ClassScore {
                    class: classes[k].clone(),
                    probability: probabilities[k],
                })
                .collect(),
            logits,
            model_round: self.release.round,
            model_sha256: self.sha256.clone(),
            distance,
            unfamiliar,
            variant: self.variant,
        }
    }

    /// Refuses images whose header declares more pixels or decoded bytes than the limits, or
    /// more than 8 bits a channel, before decoding.
    fn check_header(&self, bytes: &[u8]) -> Result<(), PredictError> {
        use image::ImageDecoder;
        let decoder = image::ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| PredictError::NotAnImage(e.to_string()))?
            .into_decoder()
            .map_err(|e| PredictError::NotAnImage(e.to_string()))?;
        let (width, height) = decoder.dimensions();
        let color = decoder.color_type();
        let channels = u16::from(color.channel_count().max(1));
        let bits = color.bits_per_pixel() / channels;
        if bits > 8 {
            return Err(PredictError::Depth { bits });
        }
        let limits = self.limits;
        let pixels = u64::from(width) * u64::from(height);
        // The decoded image, then its conversion to the card's channels.
        let converted = self.backbone.card().channels.min(3) as u64;
        let decoded = pixels * (u64::from(color.bytes_per_pixel()) + converted);
        if width > limits.max_side
            || height > limits.max_side
            || pixels > limits.max_pixels
            || decoded > limits.max_bytes
        {
            return Err(PredictError::TooLarge {
                width,
                height,
                max_side: limits.max_side,
                max_pixels: limits.max_pixels,
                max_bytes: limits.max_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use burn::prelude::{Tensor, TensorData};
    use fedge_wire::TensorF32;
    use image::{GrayImage, ImageFormat};
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::data::digits_domains;
    use fedge_models::HeadConfig;

    fn backbone() -> Arc<Backbone> {
        let card = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/assets/digits-conv.toml");
        Arc::new(crate::features::load_backbone(&card).unwrap().0)
    }

    fn release_of(head: HeadConfig, params: Vec<f32>, backbone: &str) -> ModelRelease {
        ModelRelease {
            pooled: None,
            federation: "digits".into(),
            run: 1,
            round: 7,
            strategy: "fedavg".into(),
            classes: (0..head.classes).map(|k| format!("digit-{k}")).collect(),
            backbone: backbone.into(),
            sha256: ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            head,
            feature_norm: fedge_wire::FeatureNorm::None,
        }
    }

    /// Encodes a digits image (8x8, 0..=16) as an 8-bit grayscale file.
    fn encode_digit(raw: &[f32], format: ImageFormat) -> Vec<u8> {
        let pixels = raw
            .iter()
            .map(|v| (v * 255.0 / 16.0).round() as u8)
            .collect();
        let image = GrayImage::from_raw(8, 8, pixels).unwrap();
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// A nearest-class-mean head over the backbone's features of `set`: `W1 = I`, and class
    /// `k`'s logit `z·μ_k - |μ_k|²/2`, the largest for the closest mean.
    fn centroid_head(backbone: &Backbone, set: &crate::data::ImageSet) -> (HeadConfig, Vec<f32>) {
        let f = backbone.card().feature_size;
        let features = backbone
            .features_of(&set.images, (1, 8, 8), set.raw_max, 64)
            .unwrap();
        let k = set.class_names.len();
        let mut means = vec![0f32; k * f];
        let mut counts = vec![0f32; k];
        for (x, &label) in features.chunks_exact(f).zip(&set.labels) {
            let label = label as usize;
            counts[label] += 1.0;
            for (m, v) in means[label * f..(label + 1) * f].iter_mut().zip(x) {
                *m += v.max(0.0);
            }
        }
        for (mean, count) in means.chunks_exact_mut(f).zip(&counts) {
            mean.iter_mut().for_each(|m| *m /= count.max(1.0));
        }
        let head = HeadConfig::new(f, k).with_hidden(f);
        let mut params = vec![0f32; head.num_params()];
        for j in 0..f {
            params[j * f + j] = 1.0;
        }
        let w_start = f * f + f;
        for j in 0..f {
            for c in 0..k {
                params[w_start + j * k + c] = means[c * f + j];
            }
        }
        for c in 0..k {
            let norm: f32 = means[c * f..(c + 1) * f].iter().map(|m| m * m).sum();
            params[w_start + f * k + c] = -0.5 * norm;
        }
        (head, params)
    }

    #[test]
    fn a_blank_frame_is_unfamiliar_and_the_training_sites_images_are_not() {
        let backbone = backbone();
        let f = backbone.card().feature_size;
        // The federation trained on the first five rotations; rot75 is a site it never saw.
        let mut domains = digits_domains(&crate::data::DIGITS_ANGLES, 3);
        let unseen = domains.pop().unwrap().data;
        let features: Vec<(Vec<f32>, Vec<u32>)> = (domains.iter())
            .map(|d| {
                let x =
                    (backbone.features_of(&d.data.images, (1, 8, 8), d.data.raw_max, 64)).unwrap();
                (x, d.data.labels.clone())
            })
            .collect();
        let rows = features.iter().flat_map(|(x, _)| x.chunks_exact(f));
        let labels: Vec<u32> = features.iter().flat_map(|(_, y)| y.clone()).collect();
        let pooled = fedge_wire::FeatureSummary::of_rows(f, 10, rows, &labels).unwrap();
        let set = &domains[0].data;
        let (head, params) = centroid_head(&backbone, set);
        let release = ModelRelease {
            pooled: Some(pooled),
            ..release_of(head.clone(), params.clone(), "")
        };
        let predictor = Predictor::new(Arc::clone(&backbone), release, None).unwrap();
        let flagged = |set: &crate::data::ImageSet| {
            let mut flagged = 0;
            for raw in set.images.chunks_exact(64).take(200) {
                let p = predictor.predict_bytes(&encode_digit(raw, ImageFormat::Png), 1);
                let p = p.unwrap();
                assert!(p.distance.unwrap() > 0.0);
                flagged += usize::from(p.unfamiliar.unwrap());
            }
            flagged
        };
        let source = flagged(&domains[2].data);
        assert!(source <= 2, "{source} of 200 training-site images flagged");
        // An unseen site is less familiar, but mostly still recognised as digits.
        let unseen = flagged(&unseen);
        assert!(unseen > source && unseen < 100, "{unseen} of 200");
        // A blank white frame of any size still gets a class, and is flagged.
        let white = GrayImage::from_pixel(640, 480, image::Luma([255]));
        let mut png = Cursor::new(Vec::new());
        white.write_to(&mut png, ImageFormat::Png).unwrap();
        let p = predictor.predict_bytes(&png.into_inner(), 1).unwrap();
        assert_eq!(p.unfamiliar, Some(true), "{p:?}");
        // Turned off, nothing is flagged; a release without a pooled summary measures nothing.
        let off = Predictor::new(Arc::clone(&backbone), predictor.release().clone(), None)
            .unwrap()
            .with_unfamiliar_distance(0.0);
        let white = off.predict_features(&vec![0.0; f], 1);
        assert_eq!(white.unfamiliar, Some(false));
        let plain = Predictor::new(backbone, release_of(head, params, ""), None).unwrap();
        let p = plain.predict_features(&vec![0.0; f], 1);
        assert_eq!((p.distance, p.unfamiliar), (None, None));
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("unfamiliar"), "{json}");
    }

    #[test]
    fn a_digit_image_gets_its_class() {
        let backbone = backbone();
        let set = digits_domains(&[0.0], 3).remove(0).data;
        let (head, params) = centroid_head(&backbone, &set);
        let predictor = Predictor::new(
            Arc::clone(&backbone),
            release_of(head.clone(), params.clone(), ""),
            None,
        )
        .unwrap();
        let image_len = 64;
        let (mut right, mut total) = (0, 0);
        for (raw, &label) in set.images.chunks_exact(image_len).zip(&set.labels).take(60) {
            let png = encode_digit(raw, ImageFormat::Png);
            let p = predictor.predict_bytes(&png, 3).unwrap();
            assert_eq!(p.logits.len(), 10);
            assert_eq!(p.class, format!("digit-{}", p.index));
            assert_eq!(p.model_round, 7);
            assert_eq!(p.top_k.len(), 3);
            assert_eq!(p.top_k[0].class, p.class);
            assert!(
                p.top_k
                    .windows(2)
                    .all(|w| w[0].probability >= w[1].probability)
            );
            let sum: f32 = softmax(&p.logits).iter().sum();
            assert!((sum - 1.0).abs() < 1e-5 && p.probability > 0.0 && p.probability <= 1.0);
            // The same winner as the plain-f32 evaluation the trainer uses.
            let chw = to_chw(crate::data::decode::decode_bytes(&png).unwrap(), 1, 8, 8);
            let x = backbone.features_of(&chw, (1, 8, 8), 255.0, 1).unwrap();
            let flat = fedge_models::head::predict_flat(&head, &params, &x).unwrap();
            assert_eq!(flat, vec![p.index]);
            right += usize::from(p.index == label as usize);
            total += 1;
        }
        // Nearest class mean on these features: 53 of the 60 (seed 3).
        assert!(right * 10 >= total * 8, "{right} of {total} digits right");

        // A JPEG of a digit is read too, and all classes can be asked for.
        let jpeg = encode_digit(&set.images[..image_len], ImageFormat::Jpeg);
        let p = predictor.predict_bytes(&jpeg, 99).unwrap();
        assert_eq!(p.top_k.len(), 10);
        assert_eq!(predictor.predict_bytes(&jpeg, 1).unwrap().top_k.len(), 1);
    }

    #[test]
    fn releases_that_do_not_fit_the_backbone_are_refused() {
        let backbone = backbone();
        let head = HeadConfig::new(512, 3).with_hidden(4);
        let params = head.init_flat(1);
        assert!(
            Predictor::new(
                Arc::clone(&backbone),
                release_of(head.clone(), params.clone(), "digits-conv"),
                None
            )
            .is_ok()
        );
        let err = Predictor::new(
            Arc::clone(&backbone),
            release_of(head.clone(), params.clone(), "efficientnet-lite0"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, PredictorError::Backbone { .. }), "{err}");
        assert!(err.to_string().contains("efficientnet-lite0"), "{err}");
        let small = HeadConfig::new(16, 3).with_hidden(4);
        let err = Predictor::new(
            Arc::clone(&backbone),
            release_of(small.clone(), small.init_flat(1), ""),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                PredictorError::Features {
                    head: 16,
                    card_features: 512,
                    ..
                }
            ),
            "{err}"
        );
        let mut tampered = release_of(head, params, "");
        tampered.round += 1;
        tampered.sha256[0] ^= 1;
        let err = Predictor::new(backbone, tampered, None).unwrap_err();
        assert!(
            matches!(err, PredictorError::Release(InvalidRelease::Digest)),
            "{err}"
        );
    }

    #[test]
    fn a_site_normalised_head_predicts_on_the_sites_standardised_features() {
        let head = HeadConfig::new(512, 3).with_hidden(4);
        let params = head.init_flat(5);
        let release = ModelRelease {
            feature_norm: FeatureNorm::Site,
            ..release_of(head.clone(), params.clone(), "")
        };
        assert!(matches!(
            Predictor::new(backbone(), release.clone(), None),
            Err(PredictorError::NoSiteStats)
        ));
        let short = FeatureStats {
            mean: vec![0.0; 3],
            inv_std: vec![1.0; 3],
        };
        let err = Predictor::new(backbone(), release.clone(), Some(short)).unwrap_err();
        assert!(err.to_string().contains("512"), "{err}");
        let stats = FeatureStats {
            mean: (0..512).map(|j| j as f32 * 0.01).collect(),
            inv_std: (0..512).map(|j| 1.0 + (j % 3) as f32).collect(),
        };
        let predictor = Predictor::new(backbone(), release.clone(), Some(stats.clone())).unwrap();
        let features: Vec<f32> = (0..512).map(|j| (j % 7) as f32).collect();
        let mut standardised = features.clone();
        stats.apply_in_place(&mut standardised);
        let expected = logits(&head, &params, &standardised);
        let got = predictor.predict_features(&features, 3);
        assert_eq!(
            got.class,
            release.classes[fedge_models::head::argmax(&expected)]
        );
        // A release without site normalisation ignores statistics.
        let plain = release_of(head.clone(), params.clone(), "");
        let p = Predictor::new(backbone(), plain, Some(stats)).unwrap();
        let raw = logits(&head, &params, &features);
        assert_eq!(
            p.predict_features(&features, 3).class,
            release.classes[fedge_models::head::argmax(&raw)]
        );
    }

    #[test]
    fn bad_bytes_are_typed_errors_never_panics() {
        let head = HeadConfig::new(512, 3).with_hidden(4);
        let predictor = Predictor::new(
            backbone(),
            release_of(head.clone(), head.init_flat(2), ""),
            None,
        )
        .unwrap();
        assert!(matches!(
            predictor.predict_bytes(&[], 3),
            Err(PredictError::Empty)
        ));
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let png = encode_digit(&[8.0; 64], ImageFormat::Png);
        let jpeg = encode_digit(&[8.0; 64], ImageFormat::Jpeg);
        for round in 0..300 {
            let len = rng.random_range(1..2048);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            // Some with a real signature, so the decoders, not the guesser, see the garbage.
            match round % 3 {
                1 => bytes.splice(0..0, png[..16].iter().copied()).for_each(drop),
                2 => bytes.splice(0..0, jpeg[..4].iter().copied()).for_each(drop),
                _ => {}
            }
            match predictor.predict_bytes(&bytes, 3) {
                Err(PredictError::NotAnImage(_) | PredictError::TooLarge { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        for file in [&png, &jpeg] {
            for cut in [1, 8, 20, 33, file.len() / 2] {
                let err = predictor.predict_bytes(&file[..cut], 3).unwrap_err();
                assert!(
                    matches!(err, PredictError::NotAnImage(_)),
                    "cut at {cut}: {err:?}"
                );
                assert!(err.to_string().contains("PNG or JPEG"), "{err}");
            }
            // Cut in the trailer: the pixels are all there, a decoder may accept it or not.
            for cut in [file.len() - 13, file.len() - 1] {
                let answer = predictor.predict_bytes(&file[..cut], 3);
                assert!(matches!(answer, Ok(_) | Err(PredictError::NotAnImage(_))));
            }
        }
    }

    #[test]
    fn oversized_images_are_refused_before_decoding() {
        let head = HeadConfig::new(512, 3).with_hidden(4);
        let predictor = Predictor::new(
            backbone(),
            release_of(head.clone(), head.init_flat(2), ""),
            None,
        )
        .unwrap();
        for format in [ImageFormat::Png, ImageFormat::Jpeg] {
            let mut wide = Cursor::new(Vec::new());
            GrayImage::new(9000, 1).write_to(&mut wide, format).unwrap();
            let err = predictor.predict_bytes(wide.get_ref(), 3).unwrap_err();
            assert!(
                matches!(
                    err,
                    PredictError::TooLarge {
                        width: 9000,
                        height: 1,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        let small = predictor.with_limits(ImageLimits {
            max_side: 100,
            max_pixels: 63,
            max_bytes: 1 << 20,
        });
        let digit = encode_digit(&[4.0; 64], ImageFormat::Png);
        assert!(matches!(
            small.predict_bytes(&digit, 3),
            Err(PredictError::TooLarge { .. })
        ));
    }

    /// A PNG of `width` x `height` pixels of `bit_depth` bits and PNG colour type `colour`
    /// (6: RGBA), as its header says; the image data that follows is a few zero bytes, as in an
    /// image bomb whose pixels compress to almost nothing.
    fn png_header(width: u32, height: u32, bit_depth: u8, colour: u8) -> Vec<u8> {
        let crc32 = |bytes: &[u8]| crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(bytes);
        let chunk = |kind: &[u8], data: &[u8]| {
            let mut out = (data.len() as u32).to_be_bytes().to_vec();
            let body = [kind, data].concat();
            out.extend(&body);
            out.extend(crc32(&body).to_be_bytes());
            out
        };
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend(height.to_be_bytes());
        ihdr.extend([bit_depth, colour, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(chunk(b"IHDR", &ihdr));
        png.extend(chunk(
            b"IDAT",
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ));
        png.extend(chunk(b"IEND", &[]));
        png
    }

    #[test]
    fn an_image_bomb_is_refused_on_its_header_within_the_memory_budget() {
        let backbone = backbone();
        let set = digits_domains(&[0.0], 3).remove(0).data;
        let (head, params) = centroid_head(&backbone, &set);
        let predictor = Predictor::new(backbone, release_of(head, params, ""), None)
            .unwrap()
            .with_limits(ImageLimits::for_memory_budget(320));
        // 8192 x 8192 RGBA: 256 MiB decoded and a 192 MiB conversion copy, from a few hundred
        // bytes. The shipped evaluation-site profile runs in 320 MB.
        let bomb = png_header(8192, 8192, 8, 6);
        assert!(bomb.len() < 100);
        match predictor.predict_bytes(&bomb, 1) {
            Err(e @ PredictError::TooLarge { .. }) => {
                assert!(e.to_string().contains("8192x8192"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // 4000 x 4000 RGBA passes the side and pixel defaults, not a 320 MB device's bytes.
        assert!(matches!(
            predictor.predict_bytes(&png_header(4000, 4000, 8, 6), 1),
            Err(PredictError::TooLarge { .. })
        ));
        // 16 bits a channel: refused, whatever the size.
        match predictor.predict_bytes(&png_header(64, 64, 16, 2), 1) {
            Err(e @ PredictError::Depth { bits: 16 }) => assert!(e.to_string().contains("8-bit")),
            other => panic!("{other:?}"),
        }
        // An ordinary image is still answered.
        let digit = encode_digit(&[4.0; 64], ImageFormat::Png);
        assert!(predictor.predict_bytes(&digit, 1).is_ok());
        let limits = ImageLimits::for_memory_budget(320);
        assert_eq!(limits.max_bytes, 64 << 20);
        assert_eq!(ImageLimits::for_memory_budget(64).max_bytes, 16 << 20);
        assert_eq!(ImageLimits::for_memory_budget(0), ImageLimits::default());
    }

    #[test]
    fn logits_match_burns_head() {
        let device = fedge_models::training_device(fedge_models::Backend::Flex);
        let head = HeadConfig::new(6, 4).with_hidden(5);
        let params = head.init_flat(5);
        let x = [0.5f32, -1.0, 0.0, 2.0, 0.25, -0.75];
        let burn_head = fedge_models::HeadModules::from_flat(&head, &params, &device).unwrap();
        let input = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [1, 6]), &device);
        let expected: Vec<f32> = burn_head
            .forward(input)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        let got = logits(&head, &params, &x);
        for (a, b) in got.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5, "{got:?} vs {expected:?}");
        }
    }
}
