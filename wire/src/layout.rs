//! The flat parameter layout (docs/algorithms.md §0): what the parameter vectors of round tasks,
//! updates, checkpoints and momentum buffers hold, without any ML framework.
//!
//! # Head
//!
//! `θ` is one f32 vector, in this order, every matrix row-major:
//!
//! 1. projector weight `W1`, shape `[F, H]` (Burn's `Linear` stores `[d_in, d_out]`),
//! 2. projector bias `b1`, shape `[H]`,
//! 3. classifier weight `W`, shape `[H, K]`,
//! 4. classifier bias `b`, shape `[K]`.
//!
//! So `θ.len() = F·H + H + H·K + K`.
//!
//! # Trainable tail
//!
//! A head with a tail ([`TailConfig`]) is preceded by the tail's offsets from the backbone's
//! own weights, `ΔW_t [O, C, kh, kw]` then `Δb_t [O]` ([`tail`]); `F` is then the tail's
//! output size, and the head's four tensors follow unchanged, so the vector still ends with the
//! classifier.
//!
//! # Stable-FedADG's generator and discriminator
//!
//! Generator: `W_g1 [NOISE + K, H]`, `b_g1 [H]`, `W_g2 [H, H]`, `b_g2 [H]`. Discriminator:
//! `W_d1 [H + K, H]`, `b_d1 [H]`, `W_d2 [H, 1]`, `b_d2 [1]`. A Stable-FedADG model is the
//! head's flat vector followed by the generator's ([`ModelLayout`]); the discriminator never
//! leaves the device.
//!
//! `fedge-models` builds Burn modules from these layouts; the coordinator needs only the sizes.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

pub mod tail;
pub use tail::{TailActivation, TailConfig, TailPooling, TailTensors};

/// Size of Stable-FedADG's generator noise input `ε`.
pub const NOISE: usize = 16;

/// Default projector width `H`.
pub const DEFAULT_HIDDEN: usize = 64;

fn default_hidden() -> usize {
    DEFAULT_HIDDEN
}

/// Sizes of a head: backbone features `F`, projector width `H`, classes `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeadConfig {
    /// Backbone feature size `F` (the model card's `feature_size`), > 0.
    pub features: usize,
    /// Projector width `H`, > 0; the devices' `hidden` must be the same.
    #[serde(default = "default_hidden")]
    pub hidden: usize,
    /// Number of classes `K`, at least 2.
    pub classes: usize,
    /// The backbone's last convolution block, trained with the head (its output size is
    /// `features`); none for a head on frozen features. On the wire since protocol 10; in a
    /// configuration file, the `[head.tail]` table.
    #[serde(default)]
    pub tail: Option<TailConfig>,
}

/// A flat vector whose length does not match its layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("flat parameter vector has {got} values, the layout needs {expected}")]
pub struct FlatLayoutError {
    /// Required length.
    pub expected: usize,
    /// Length given.
    pub got: usize,
}

impl FlatLayoutError {
    /// `Ok` when `got == expected`.
    pub fn check(expected: usize, got: usize) -> Result<(), Self> {
        if expected == got {
            Ok(())
        } else {
            Err(Self { expected, got })
        }
    }
}

/// The widest projector [`ModelLayout::fitting`] tries.
pub const MAX_FITTED_HIDDEN: usize = 4096;

/// The four tensors of a flat head, row-major: `W1 [F, H]`, `b1 [H]`, `W [H, K]`, `b [K]`.
/// The one reading of the layout: training, prediction, export and the tests all split a head
/// through [`HeadConfig::split`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadTensors<'a, T> {
    /// The projector's weight `W1`, `[F, H]`.
    pub w1: &'a [T],
    /// The projector's bias `b1`, `[H]`.
    pub b1: &'a [T],
    /// The classifier's weight `W`, `[H, K]`.
    pub w: &'a [T],
    /// The classifier's bias `b`, `[K]`.
    pub b: &'a [T],
}

impl HeadConfig {
    /// The tensors of the head `flat` (exactly [`HeadConfig::num_params`] values).
    pub fn split<'a, T>(&self, flat: &'a [T]) -> Result<HeadTensors<'a, T>, FlatLayoutError> {
        FlatLayoutError::check(self.num_params(), flat.len())?;
        let (f, h, k) = (self.features, self.hidden, self.classes);
        let (_, head) = flat.split_at(self.tail_params());
        let (w1, rest) = head.split_at(f * h);
        let (b1, rest) = rest.split_at(h);
        let (w, b) = rest.split_at(h * k);
        Ok(HeadTensors { w1, b1, w, b })
    }

    /// The tail's offsets in `flat` (`None` without a tail; an error when `flat` does not
    /// fit the layout).
    pub fn split_tail<'a, T>(
        &self,
        flat: &'a [T],
    ) -> Result<Option<TailTensors<'a, T>>, FlatLayoutError> {
        FlatLayoutError::check(self.num_params(), flat.len())?;
        Ok(self.tail.map(|tail| {
            let (weight, rest) = flat.split_at(tail.weight_len());
            TailTensors {
                weight,
                bias: &rest[..tail.channels],
            }
        }))
    }

    /// A head with `features` inputs, `classes` outputs and the default width.
    pub fn new(features: usize, classes: usize) -> Self {
        Self {
            features,
            hidden: DEFAULT_HIDDEN,
            classes,
            tail: None,
        }
    }

    /// The same head on `tail`'s output (its feature size becomes the tail's).
    pub fn with_tail(mut self, tail: TailConfig) -> Self {
        self.features = tail.features();
        self.tail = Some(tail);
        self
    }

    /// Values per example the head takes in: the cut's activations with a tail, else `F`.
    pub fn input_size(&self) -> usize {
        self.tail.map_or(self.features, |t| t.input_size())
    }

    /// Values of the tail's offsets in the flat layout (0 without a tail).
    pub fn tail_params(&self) -> usize {
        self.tail.map_or(0, |t| t.num_params())
    }

    /// The same head with projector width `hidden`.
    pub fn with_hidden(mut self, hidden: usize) -> Self {
        self.hidden = hidden;
        self
    }

    /// `(fan_in, fan_out)` of the projector and the classifier.
    pub fn shapes(&self) -> [[usize; 2]; 2] {
        [[self.features, self.hidden], [self.hidden, self.classes]]
    }

    /// Number of values in the flat layout.
    pub fn num_params(&self) -> usize {
        self.tail_params() + count(&self.shapes())
    }

    /// Where the classifier weight `W` (`[H, K]`, row-major) sits in the flat vector.
    pub fn classifier_range(&self) -> std::ops::Range<usize> {
        let start = self.tail_params() + self.features * self.hidden + self.hidden;
        start..start + self.hidden * self.classes
    }

    /// Where the classifier weight `W` (`[H, K]`) sits in a flat vector of `len` values that
    /// ends with the classifier, counted from its end (`None` when `len` is too short): the
    /// same range as [`HeadConfig::classifier_range`] for a whole head, for a reader that
    /// knows `H` and `K` but not `F` (the coordinator's FedDIM side).
    pub fn classifier_range_from_end(
        len: usize,
        hidden: usize,
        classes: usize,
    ) -> Option<std::ops::Range<usize>> {
        let start = len.checked_sub(classes + hidden * classes)?;
        Some(start..start + hidden * classes)
    }

    /// Seeded initial parameters in the flat layout, drawn as PyTorch's `nn.Linear` does:
    /// weights and biases uniform in `±1/sqrt(fan_in)`; a tail's offsets start at 0 (the
    /// backbone's own weights), and the head's draws are the same with or without one.
    pub fn init_flat(&self, seed: u64) -> Vec<f32> {
        let mut out = vec![0.0; self.tail_params()];
        out.extend(init_uniform(&self.shapes(), seed));
        out
    }
}

/// Sizes of Stable-FedADG's generator and discriminator for a head with `H` features and `K`
/// classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdversarialConfig {
    /// Projector width `H` (the size of `z` and `z'`).
    pub hidden: usize,
    /// Classes `K`.
    pub classes: usize,
}

impl AdversarialConfig {
    /// The sizes that fit `head`.
    pub fn for_head(head: &HeadConfig) -> Self {
        Self {
            hidden: head.hidden,
            classes: head.classes,
        }
    }

    /// `(fan_in, fan_out)` of the generator's two layers.
    pub fn generator_shapes(&self) -> [[usize; 2]; 2] {
        let h = self.hidden;
        [[NOISE + self.classes, h], [h, h]]
    }

    /// `(fan_in, fan_out)` of the discriminator's two layers.
    pub fn discriminator_shapes(&self) -> [[usize; 2]; 2] {
        let h = self.hidden;
        [[h + self.classes, h], [h, 1]]
    }

    /// Values in the generator's flat layout.
    pub fn generator_params(&self) -> usize {
        count(&self.generator_shapes())
    }

    /// Values in the discriminator's flat layout.
    pub fn discriminator_params(&self) -> usize {
        count(&self.discriminator_shapes())
    }

    /// Seeded generator parameters (uniform in `±1/√fan_in`, as PyTorch's `nn.Linear`).
    pub fn init_generator(&self, seed: u64) -> Vec<f32> {
        init_uniform(&self.generator_shapes(), seed)
    }

    /// Seeded discriminator parameters.
    pub fn init_discriminator(&self, seed: u64) -> Vec<f32> {
        init_uniform(&self.discriminator_shapes(), seed)
    }
}

/// What the flat parameter vector of a federation holds: the head, and for Stable-FedADG the
/// generator after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayout {
    /// The head's sizes.
    pub head: HeadConfig,
    /// The generator's sizes, when the vector carries one.
    pub generator: Option<AdversarialConfig>,
}

impl ModelLayout {
    /// The layout of `head`, followed by a generator when `with_generator`.
    pub fn new(head: HeadConfig, with_generator: bool) -> Self {
        let generator = with_generator.then(|| AdversarialConfig::for_head(&head));
        Self { head, generator }
    }

    /// Length of the flat vector.
    pub fn num_params(&self) -> usize {
        self.head.num_params() + self.generator.map_or(0, |g| g.generator_params())
    }

    /// The layout of `head`'s features and classes whose flat vector holds `len` values: `head`
    /// itself when it fits, else the same head with the projector width that makes it fit (at
    /// most [`MAX_FITTED_HIDDEN`]), e.g. the federation's when a device's profile says another.
    /// `None` when no width fits.
    pub fn fitting(head: &HeadConfig, with_generator: bool, len: usize) -> Option<Self> {
        let layout = Self::new(head.clone(), with_generator);
        if layout.num_params() == len {
            return Some(layout);
        }
        (1..=MAX_FITTED_HIDDEN)
            .map(|hidden| Self::new(head.clone().with_hidden(hidden), with_generator))
            .find(|layout| layout.num_params() == len)
    }

    /// Seeded initial parameters: the head's [`HeadConfig::init_flat`], then the generator's.
    pub fn init_flat(&self, seed: u64) -> Vec<f32> {
        let mut out = self.head.init_flat(seed);
        if let Some(g) = &self.generator {
            out.extend(g.init_generator(seed ^ 0x6e6e_7261_746f_7200));
        }
        out
    }

    /// The head's part of `flat` (all of it when `flat` is shorter than the head).
    pub fn head_part<'a>(&self, flat: &'a [f32]) -> &'a [f32] {
        &flat[..self.head.num_params().min(flat.len())]
    }

    /// The generator's part of `flat` (empty without a generator).
    pub fn generator_part<'a>(&self, flat: &'a [f32]) -> &'a [f32] {
        &flat[self.head.num_params().min(flat.len())..]
    }

    /// The tail's offsets at the front of `flat` (empty without a tail).
    pub fn tail_part<'a>(&self, flat: &'a [f32]) -> &'a [f32] {
        &flat[..self.head.tail_params().min(flat.len())]
    }
}

/// Values of dense layers with these `(fan_in, fan_out)` shapes, biases included.
pub fn count(shapes: &[[usize; 2]]) -> usize {
    shapes.iter().map(|[i, o]| i * o + o).sum()
}

/// Seeded values for dense layers of these shapes, each weight then its bias, uniform in
/// `±1/√fan_in`.
fn init_uniform(shapes: &[[usize; 2]], seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(count(shapes));
    for [fan_in, fan_out] in shapes {
        let bound = 1.0 / (*fan_in as f32).sqrt();
        out.extend((0..fan_in * fan_out + fan_out).map(|_| rng.random_range(-bound..bound)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_layout_counts_and_places_the_classifier() {
        let head = HeadConfig::new(5, 3).with_hidden(4);
        assert_eq!(head.num_params(), 5 * 4 + 4 + 4 * 3 + 3);
        assert_eq!(head.classifier_range(), 24..36);
        assert_eq!(
            HeadConfig::classifier_range_from_end(head.num_params(), 4, 3),
            Some(head.classifier_range())
        );
        assert_eq!(HeadConfig::classifier_range_from_end(14, 4, 3), None);
        let flat = head.init_flat(7);
        assert_eq!(flat.len(), head.num_params());
        assert!(flat[..20].iter().all(|v| v.abs() <= 1.0 / 5f32.sqrt()));
        assert!(flat[24..].iter().all(|v| v.abs() <= 0.5));
        assert_eq!(flat, head.init_flat(7));
        assert_ne!(flat, head.init_flat(8));
    }

    #[test]
    fn the_model_vector_appends_the_generator_after_the_head() {
        let head = HeadConfig::new(5, 3).with_hidden(4);
        let c = AdversarialConfig::for_head(&head);
        assert_eq!(c.generator_params(), (NOISE + 3) * 4 + 4 + 4 * 4 + 4);
        assert_eq!(c.discriminator_params(), (4 + 3) * 4 + 4 + 4 + 1);
        let layout = ModelLayout::new(head.clone(), true);
        let flat = layout.init_flat(3);
        assert_eq!(flat.len(), head.num_params() + c.generator_params());
        assert_eq!(layout.head_part(&flat), head.init_flat(3).as_slice());
        assert_eq!(layout.generator_part(&flat).len(), c.generator_params());
        let plain = ModelLayout::new(head.clone(), false);
        assert_eq!(plain.init_flat(3), head.init_flat(3));
        assert!(plain.generator_part(&plain.init_flat(3)).is_empty());
    }

    #[test]
    fn a_tail_goes_in_front_of_the_head_and_starts_at_the_backbone_s_weights() {
        // EfficientNet-Lite0's last block at 96x96: 320 channels of 3x3 into 1280, pooled.
        let tail = TailConfig {
            input: [320, 3, 3],
            channels: 1280,
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0; 4],
            activation: TailActivation::Relu6,
            pooling: TailPooling::GlobalAverage,
        };
        assert_eq!((tail.input_size(), tail.features()), (2880, 1280));
        let plain = HeadConfig::new(1280, 10).with_hidden(8);
        let head = plain.clone().with_tail(tail);
        assert_eq!(head.features, 1280);
        assert_eq!(head.input_size(), 2880);
        assert_eq!(head.tail_params(), 320 * 1280 + 1280);
        assert_eq!(head.num_params(), head.tail_params() + plain.num_params());
        let flat = head.init_flat(5);
        assert!(flat[..head.tail_params()].iter().all(|v| *v == 0.0));
        assert_eq!(&flat[head.tail_params()..], plain.init_flat(5).as_slice());
        // The head's tensors and the classifier keep their place from the vector's end.
        let split = head.split(&flat).unwrap();
        assert_eq!(split, plain.split(&flat[head.tail_params()..]).unwrap());
        let from_end = HeadConfig::classifier_range_from_end(flat.len(), 8, 10).unwrap();
        assert_eq!(from_end, head.classifier_range());
        let offsets = head.split_tail(&flat).unwrap().unwrap();
        assert_eq!(
            (offsets.weight.len(), offsets.bias.len()),
            (320 * 1280, 1280)
        );
        let layout = ModelLayout::new(head.clone(), false);
        assert_eq!(layout.tail_part(&flat).len(), head.tail_params());
        // digits-conv's last block: 3x3, padding 1, flattened.
        let digits = TailConfig {
            input: [16, 4, 4],
            channels: 32,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1; 4],
            activation: TailActivation::Relu,
            pooling: TailPooling::Flatten,
        };
        assert_eq!(digits.features(), 512);
        assert!(digits.check().is_ok());
        let too_big = TailConfig {
            kernel: [7, 7],
            padding: [0; 4],
            ..digits
        };
        assert!(too_big.check().unwrap_err().contains("does not fit"));
        // In files (the coordinator's `[head.tail]` table) and JSON, the tail is a nested
        // table; a head without one reads as before.
        let text = r#"{"features": 512, "classes": 10, "tail": {"input": [16, 4, 4],
            "channels": 32, "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1, 1, 1],
            "activation": "relu", "pooling": "flatten"}}"#;
        let read: HeadConfig = serde_json::from_str(text).unwrap();
        assert_eq!(read, HeadConfig::new(512, 10).with_tail(digits));
        let json = serde_json::to_string(&read).unwrap();
        assert_eq!(serde_json::from_str::<HeadConfig>(&json).unwrap(), read);
    }

    #[test]
    fn a_head_section_reads_with_the_default_width_and_refuses_unknown_keys() {
        let head: HeadConfig = serde_json::from_str(r#"{"features": 8, "classes": 2}"#).unwrap();
        assert_eq!(head, HeadConfig::new(8, 2));
        assert!(serde_json::from_str::<HeadConfig>(r#"{"features": 8, "clases": 2}"#).is_err());
    }
}
