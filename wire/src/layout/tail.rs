//! The trainable tail: the backbone's last convolution block, trained with the head
//! (docs/algorithms.md §0, "Trainable tail").
//!
//! A backbone cut before its last convolution gives, per image, the cut's activations
//! `[C, H, W]` (what the device caches). The tail turns them into the head's features:
//! `x = pool(act(conv(a; W_t + ΔW_t, b_t + Δb_t)))`, with `W_t [O, C, kh, kw]` and `b_t [O]`
//! the backbone's own weights, read from its ONNX file on the device. The flat vector carries
//! only the offsets `ΔW_t`, `Δb_t` (zero at the start), in front of the head: so the
//! coordinator initialises, counts and aggregates a tail without reading any model file, and a
//! step's length (the norm guard, FedProx, weight decay) is its move away from the pretrained
//! weights.

use serde::{Deserialize, Serialize};

/// The tail's activation after its convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TailActivation {
    /// None.
    #[serde(rename = "none")]
    None,
    /// `max(0, v)`.
    #[serde(rename = "relu")]
    Relu,
    /// `min(max(0, v), 6)` (MobileNet's and EfficientNet-Lite's).
    #[serde(rename = "relu6")]
    Relu6,
}

impl TailActivation {
    /// The activation of one value.
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Self::None => v,
            Self::Relu => v.max(0.0),
            Self::Relu6 => v.clamp(0.0, 6.0),
        }
    }
}

/// How the tail's output map becomes the head's feature vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TailPooling {
    /// The mean over the map's positions: `O` features.
    #[serde(rename = "global-average")]
    GlobalAverage,
    /// The map flattened channel by channel: `O · H' · W'` features.
    #[serde(rename = "flatten")]
    Flatten,
}

/// The largest of a tail's sizes (channels, sides, kernel, stride, padding).
pub const MAX_TAIL_SIZE: usize = 1 << 16;
/// The most values a tail's convolution weight may hold (2²⁸, 1 GiB of f32).
pub const MAX_TAIL_WEIGHTS: usize = 1 << 28;

/// Sizes of a tail (its convolution's weights follow ONNX's `[O, C, kh, kw]` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TailConfig {
    /// The cut's activations per image: channels, height, width.
    pub input: [usize; 3],
    /// Output channels `O`.
    pub channels: usize,
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub stride: [usize; 2],
    /// Zero padding, ONNX's order: top, left, bottom, right.
    pub padding: [usize; 4],
    /// The activation after the convolution.
    pub activation: TailActivation,
    /// How the map becomes features.
    pub pooling: TailPooling,
}

impl TailConfig {
    /// Values per image at the cut, `C·H·W`.
    pub fn input_size(&self) -> usize {
        self.input.iter().product()
    }

    /// The output map's height and width (`None` when the kernel does not fit the padded
    /// input or a stride is 0).
    pub fn output_hw(&self) -> Option<[usize; 2]> {
        let side = |size: usize, pad: usize, kernel: usize, stride: usize| {
            let padded = size + pad;
            (stride > 0 && kernel > 0 && padded >= kernel).then(|| (padded - kernel) / stride + 1)
        };
        let [_, h, w] = self.input;
        let [top, left, bottom, right] = self.padding;
        Some([
            side(h, top + bottom, self.kernel[0], self.stride[0])?,
            side(w, left + right, self.kernel[1], self.stride[1])?,
        ])
    }

    /// The head's feature size `F` the tail gives.
    pub fn features(&self) -> usize {
        match self.pooling {
            TailPooling::GlobalAverage => self.channels,
            TailPooling::Flatten => self.channels * self.output_hw().map_or(0, |[h, w]| h * w),
        }
    }

    /// Values of the convolution's weight, `O·C·kh·kw`.
    pub fn weight_len(&self) -> usize {
        self.channels * self.input[0] * self.kernel[0] * self.kernel[1]
    }

    /// Values in the flat layout: the weight's offsets, then the bias's.
    pub fn num_params(&self) -> usize {
        self.weight_len() + self.channels
    }

    /// Why these sizes cannot make a tail, if they cannot (sizes read from the network are
    /// checked here before any arithmetic on them).
    pub fn check(&self) -> Result<(), String> {
        let sizes = (self.input.iter().chain(&self.kernel).chain(&self.stride))
            .chain(&self.padding)
            .chain([&self.channels]);
        if sizes.clone().any(|v| *v > MAX_TAIL_SIZE) {
            return Err(format!(
                "tail: every size must be at most {MAX_TAIL_SIZE}, got input {:?}, {} channels, \
                 kernel {:?}, stride {:?}, padding {:?}",
                self.input, self.channels, self.kernel, self.stride, self.padding
            ));
        }
        let weight = [self.input[0], self.kernel[0], self.kernel[1]]
            .iter()
            .try_fold(self.channels, |acc, v| acc.checked_mul(*v));
        if weight.is_none_or(|w| w > MAX_TAIL_WEIGHTS) {
            return Err(format!(
                "tail: the convolution's weight may hold at most {MAX_TAIL_WEIGHTS} values"
            ));
        }
        if self.input.contains(&0) || self.channels == 0 {
            return Err(format!(
                "tail: input {:?} and {} channels must all be positive",
                self.input, self.channels
            ));
        }
        if self.output_hw().is_none() {
            return Err(format!(
                "tail: a {:?} kernel with stride {:?} and padding {:?} does not fit a {:?} input",
                self.kernel, self.stride, self.padding, self.input
            ));
        }
        Ok(())
    }
}

/// The two offsets of a tail in a flat vector: `ΔW_t [O, C, kh, kw]`, `Δb_t [O]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TailTensors<'a, T> {
    /// The weight's offsets.
    pub weight: &'a [T],
    /// The bias's offsets.
    pub bias: &'a [T],
}
