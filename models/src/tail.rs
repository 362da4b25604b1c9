//! The trainable tail (docs/algorithms.md §0, "Trainable tail"): the backbone's last
//! convolution block, read from its ONNX file, run in plain f32 for evaluation and serving and
//! as a Burn module for training. Its sizes and the flat layout of its offsets are
//! `fedge_wire::layout::tail`.
//!
//! What fedge can train: the block that ends the graph at the card's output, a `Conv` (one
//! group, no dilation) on the cut, then optionally `Relu` or `Clip(0, 6)`, then optionally
//! `GlobalAveragePool`, then `Flatten` or `Reshape` to `[N, F]`: how EfficientNet-Lite0,
//! MobileNet-style backbones and the built-in `digits-conv` end. The cut is that `Conv`'s
//! input.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use prost::Message;
use tract_onnx::pb;

use crate::card::ModelCard;
pub use fedge_wire::layout::{TailActivation, TailConfig, TailPooling, TailTensors};

/// Why a backbone's tail cannot be trained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backbone {backbone}: {message}")]
pub struct TailError {
    /// Card name.
    pub backbone: String,
    /// What does not fit, and what to do.
    pub message: String,
}

/// A backbone's tail: where it is cut, the sizes, and the pretrained weights the flat vector's
/// offsets are added to.
#[derive(Debug, Clone, PartialEq)]
pub struct Tail {
    /// The tensor the tail starts from (the cut's activations).
    pub cut: String,
    /// Sizes.
    pub config: TailConfig,
    /// The backbone's convolution weight, `[O, C, kh, kw]`.
    pub weight: Vec<f32>,
    /// Its bias, `[O]` (zeros when the model has none).
    pub bias: Vec<f32>,
}

impl Tail {
    /// Finds the tail of the backbone `card` describes in `onnx`; `cut`, when given, must name
    /// the tail's input.
    pub fn read(card: &ModelCard, onnx: &[u8], cut: Option<&str>) -> Result<Self, TailError> {
        let fail = |message: String| TailError {
            backbone: card.name.clone(),
            message,
        };
        let model = pb::ModelProto::decode(onnx).map_err(|e| fail(format!("not ONNX: {e}")))?;
        let graph = model.graph.unwrap_or_default();
        let producer = |tensor: &str| {
            graph
                .node
                .iter()
                .find(|n| n.output.iter().any(|o| o == tensor))
        };
        let input_of = |node: &pb::NodeProto| node.input.first().cloned().unwrap_or_default();
        // From the output back to the convolution.
        let mut at = producer(&card.output_name)
            .ok_or_else(|| fail(format!("no node makes the output {:?}", card.output_name)))?;
        if matches!(at.op_type.as_str(), "Flatten" | "Reshape") {
            at =
                producer(&input_of(at)).ok_or_else(|| fail("nothing before the flatten".into()))?;
        }
        let mut pooling = TailPooling::Flatten;
        if at.op_type == "GlobalAveragePool" {
            pooling = TailPooling::GlobalAverage;
            at =
                producer(&input_of(at)).ok_or_else(|| fail("nothing before the pooling".into()))?;
        }
        let activation = match at.op_type.as_str() {
            "Relu" => Some(TailActivation::Relu),
            "Clip" if clip_bounds(at, &graph) == Some((0.0, 6.0)) => Some(TailActivation::Relu6),
            _ => None,
        };
        if activation.is_some() {
            at = producer(&input_of(at))
                .ok_or_else(|| fail("nothing before the activation".into()))?;
        }
        let activation = activation.unwrap_or(TailActivation::None);
        if at.op_type != "Conv" {
            return Err(fail(format!(
                "its output comes from {} {:?}, not from a convolution block fedge can train \
                 (Conv, then Relu or Clip(0, 6), then GlobalAveragePool, then Flatten)",
                at.op_type, at.name
            )));
        }
        let conv = at;
        let found = input_of(conv);
        if let Some(cut) = cut
            && cut != found
        {
            return Err(fail(format!(
                "the trainable tail starts at {found:?}, not at {cut:?}: set `cut = \"{found}\"` \
                 or leave it out"
            )));
        }
        let ints = |name: &str| {
            (conv.attribute.iter())
                .find(|a| a.name == name)
                .map(|a| a.ints.clone())
        };
        let group = (conv.attribute.iter())
            .find(|a| a.name == "group")
            .map_or(1, |a| a.i);
        if group != 1 || ints("dilations").is_some_and(|d| d.iter().any(|v| *v != 1)) {
            return Err(fail(format!(
                "the last convolution {:?} is grouped or dilated; fedge trains a plain one",
                conv.name
            )));
        }
        if (conv.attribute.iter())
            .any(|a| a.name == "auto_pad" && !a.s.is_empty() && a.s != b"NOTSET")
        {
            return Err(fail(
                "the last convolution pads with auto_pad; fedge needs explicit pads".into(),
            ));
        }
        let initializer = |name: &str| graph.initializer.iter().find(|t| t.name == name);
        let weight_name = conv.input.get(1).cloned().unwrap_or_default();
        let weight_tensor = initializer(&weight_name)
            .ok_or_else(|| fail(format!("the weight {weight_name:?} is not an initializer")))?;
        let dims: Vec<usize> = weight_tensor.dims.iter().map(|d| *d as usize).collect();
        let [out, c, kh, kw] = dims[..] else {
            return Err(fail(format!("the convolution's weight has shape {dims:?}")));
        };
        let weight = floats(weight_tensor).ok_or_else(|| fail("the weight is not f32".into()))?;
        let bias = match conv.input.get(2).filter(|b| !b.is_empty()) {
            Some(name) => initializer(name)
                .and_then(floats)
                .ok_or_else(|| fail(format!("the bias {name:?} is not an f32 initializer")))?,
            None => vec![0.0; out],
        };
        let to_usize = |v: Vec<i64>| v.into_iter().map(|x| x.max(0) as usize).collect::<Vec<_>>();
        let stride = to_usize(ints("strides").unwrap_or(vec![1, 1]));
        let pads = to_usize(ints("pads").unwrap_or(vec![0; 4]));
        let (Ok(stride), Ok(padding)) =
            (<[usize; 2]>::try_from(stride), <[usize; 4]>::try_from(pads))
        else {
            return Err(fail("the convolution is not two-dimensional".into()));
        };
        let [_, h, w] = shapes::cut_shape(card, onnx, &found).map_err(fail)?;
        let config = TailConfig {
            input: [c, h, w],
            channels: out,
            kernel: [kh, kw],
            stride,
            padding,
            activation,
            pooling,
        };
        config.check().map_err(fail)?;
        if weight.len() != config.weight_len() || bias.len() != out {
            return Err(fail(
                "the convolution's weight or bias has the wrong size".into(),
            ));
        }
        if config.features() != card.feature_size {
            return Err(fail(format!(
                "the tail gives {} features, the card promises {}",
                config.features(),
                card.feature_size
            )));
        }
        Ok(Self {
            cut: found,
            config,
            weight,
            bias,
        })
    }

    /// The tail of `backbone` (whose ONNX file is `onnx`) and the backbone cut before it, on
    /// `threads` threads: what a device runs to train or to serve a head with a tail. The cut
    /// runs in tract, which plans a graph to any of its tensors.
    pub fn split(
        backbone: &crate::Backbone,
        onnx: &[u8],
        threads: usize,
    ) -> Result<(Self, crate::Backbone), TailError> {
        let card = backbone.card();
        let tail = Self::read(card, onnx, None)?;
        let runtime = crate::RuntimeConfig::tract();
        let cut = crate::Backbone::from_bytes_with(
            tail.cut_card(card),
            onnx,
            backbone.origin(),
            &runtime,
            threads,
        )
        .map_err(|e| TailError {
            backbone: card.name.clone(),
            message: format!("cannot run the backbone up to {:?}: {e}", tail.cut),
        })?;
        Ok((tail, cut))
    }

    /// Whether this is the tail `head`'s layout has (the same sizes).
    pub fn fits(&self, head: &fedge_wire::layout::HeadConfig) -> bool {
        head.tail == Some(self.config)
    }

    /// The card of the backbone up to the cut: it returns the cut's activations, `C·H·W` values
    /// per image, named `<name>@<cut>` (its features are cached apart from the whole
    /// backbone's).
    pub fn cut_card(&self, card: &ModelCard) -> ModelCard {
        ModelCard {
            name: format!("{}@{}", card.name, self.cut),
            output_name: self.cut.clone(),
            feature_size: self.config.input_size(),
            ..card.clone()
        }
    }

    /// The head's features of `rows` (cut activations, `C·H·W` values each), with the tail's
    /// `offsets` added to the pretrained weights; plain f32, for evaluation and serving.
    pub fn apply(&self, offsets: &TailTensors<'_, f32>, rows: &[f32]) -> Vec<f32> {
        let t = &self.config;
        let weight: Vec<f32> = self
            .weight
            .iter()
            .zip(offsets.weight)
            .map(|(a, b)| a + b)
            .collect();
        let bias: Vec<f32> = self
            .bias
            .iter()
            .zip(offsets.bias)
            .map(|(a, b)| a + b)
            .collect();
        let [c, h, w] = t.input;
        let [oh, ow] = t.output_hw().unwrap_or([0, 0]);
        let [kh, kw] = t.kernel;
        let [top, left, _, _] = t.padding;
        let per_row = t.input_size();
        let mut out = Vec::with_capacity(rows.len() / per_row.max(1) * t.features());
        let mut map = vec![0f32; t.channels * oh * ow];
        for x in rows.chunks_exact(per_row) {
            for (o, plane) in map.chunks_exact_mut(oh * ow).enumerate() {
                plane.fill(bias[o]);
                for ci in 0..c {
                    let kernel = &weight[(o * c + ci) * kh * kw..][..kh * kw];
                    let input = &x[ci * h * w..][..h * w];
                    for (p, value) in plane.iter_mut().enumerate() {
                        let (py, px) = (p / ow, p % ow);
                        for ky in 0..kh {
                            let Some(y) =
                                (py * t.stride[0] + ky).checked_sub(top).filter(|y| *y < h)
                            else {
                                continue;
                            };
                            for kx in 0..kw {
                                if let Some(xx) =
                                    (px * t.stride[1] + kx).checked_sub(left).filter(|v| *v < w)
                                {
                                    *value += kernel[ky * kw + kx] * input[y * w + xx];
                                }
                            }
                        }
                    }
                }
            }
            let active = map.iter().map(|v| t.activation.apply(*v));
            match t.pooling {
                TailPooling::Flatten => out.extend(active),
                TailPooling::GlobalAverage => {
                    let values: Vec<f32> = active.collect();
                    let n = (oh * ow) as f32;
                    out.extend(
                        values
                            .chunks_exact(oh * ow)
                            .map(|p| p.iter().sum::<f32>() / n),
                    );
                }
            }
        }
        out
    }

    /// The Burn module for training: the pretrained weights as constants, `offsets` as the
    /// parameters.
    pub fn module(&self, offsets: &TailTensors<'_, f32>, device: &Device) -> TailModule {
        let t = &self.config;
        let shape = [t.channels, t.input[0], t.kernel[0], t.kernel[1]];
        let tensor4 =
            |v: &[f32]| Tensor::<4>::from_data(TensorData::new(v.to_vec(), shape), device);
        let tensor1 =
            |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [t.channels]), device);
        TailModule {
            weight: Param::from_tensor(tensor4(offsets.weight)),
            bias: Param::from_tensor(tensor1(offsets.bias)),
            base_weight: tensor4(&self.weight),
            base_bias: tensor1(&self.bias),
            config: *t,
        }
    }
}

/// `Clip`'s bounds, from its inputs (opset 11 on) or its attributes (before).
fn clip_bounds(node: &pb::NodeProto, graph: &pb::GraphProto) -> Option<(f32, f32)> {
    let constant = |i: usize| {
        let name = node.input.get(i).filter(|n| !n.is_empty())?;
        let tensor = graph.initializer.iter().find(|t| t.name == *name)?;
        floats(tensor)?.first().copied()
    };
    let attribute = |name: &str| node.attribute.iter().find(|a| a.name == name).map(|a| a.f);
    let low = constant(1).or_else(|| attribute("min"))?;
    let high = constant(2).or_else(|| attribute("max"))?;
    Some((low, high))
}

/// An f32 tensor's values, from `float_data` or little-endian `raw_data`.
fn floats(tensor: &pb::TensorProto) -> Option<Vec<f32>> {
    const FLOAT: i32 = 1;
    if tensor.data_type != FLOAT {
        return None;
    }
    if !tensor.float_data.is_empty() {
        return Some(tensor.float_data.clone());
    }
    let raw = &tensor.raw_data;
    Some(
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// tract's shape analysis, apart: its prelude and Burn's both name a `Tensor`.
mod shapes {
    use tract_onnx::prelude::*;
    use tract_onnx::tract_hir::internal::DimLike;

    use crate::card::ModelCard;

    /// `[C, H, W]` of the tensor `cut` for one image of the card's input, by tract's shape
    /// analysis.
    pub(super) fn cut_shape(
        card: &ModelCard,
        onnx: &[u8],
        cut: &str,
    ) -> Result<[usize; 3], String> {
        let message = |e: TractError| format!("cannot find the shape at {cut:?}: {e:#}");
        let mut model = tract_onnx::onnx()
            .model_for_read(&mut &onnx[..])
            .map_err(message)?;
        let shape: TVec<usize> = match card.layout {
            crate::card::Layout::Nchw => tvec![1, card.channels, card.height, card.width],
            crate::card::Layout::Nhwc => tvec![1, card.height, card.width, card.channels],
        };
        model.select_outputs_by_name([cut]).map_err(message)?;
        let typed = model
            .with_input_fact(0, InferenceFact::dt_shape(f32::datum_type(), shape))
            .and_then(|m| m.into_typed())
            .map_err(message)?;
        let fact = typed.output_fact(0).map_err(message)?;
        let dims: Vec<usize> = (fact.shape.iter())
            .map(|d| d.to_usize().unwrap_or(0))
            .collect();
        match dims[..] {
            [1, c, h, w] => Ok([c, h, w]),
            _ => Err(format!(
                "the tensor {cut:?} has shape {dims:?}, not [1, C, H, W]"
            )),
        }
    }
}

/// The tail in Burn: `pool(act(conv(a; W_t + ΔW_t, b_t + Δb_t)))`; only the offsets train.
#[derive(Module, Debug)]
pub struct TailModule {
    /// `ΔW_t`, `[O, C, kh, kw]`.
    pub weight: Param<Tensor<4>>,
    /// `Δb_t`, `[O]`.
    pub bias: Param<Tensor<1>>,
    /// `W_t`, a constant.
    base_weight: Tensor<4>,
    /// `b_t`, a constant.
    base_bias: Tensor<1>,
    #[module(skip)]
    config: TailConfig,
}

impl TailModule {
    /// The head's features of a batch of cut activations.
    ///
    /// # Shapes
    /// - input: `[batch, C·H·W]`
    /// - output: `[batch, F]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let t = &self.config;
        let [batch, _] = x.dims();
        let [c, h, w] = t.input;
        let [top, left, bottom, right] = t.padding;
        let options =
            ConvOptions::new_with_padding(t.stride, [(top, bottom), (left, right)], [1, 1], 1);
        let weight = self.base_weight.clone() + self.weight.val();
        let bias = self.base_bias.clone() + self.bias.val();
        let map = conv2d(x.reshape([batch, c, h, w]), weight, Some(bias), options);
        let map = match t.activation {
            TailActivation::None => map,
            TailActivation::Relu => burn::tensor::activation::relu(map),
            TailActivation::Relu6 => map.clamp(0.0, 6.0),
        };
        match t.pooling {
            TailPooling::Flatten => map.flatten(1, 3),
            TailPooling::GlobalAverage => map.flatten::<3>(2, 3).mean_dim(2).flatten(1, 2),
        }
    }

    /// The offsets in the flat layout: `ΔW_t`, then `Δb_t`.
    pub fn to_flat(&self) -> Vec<f32> {
        let mut out = values(self.weight.val().into_data());
        out.extend(values(self.bias.val().into_data()));
        out
    }
}

fn values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backbone::Backbone;
    use crate::device::{Backend, training_device};
    use crate::generate::{DIGITS_CONV_ONNX, digits_conv_card};

    /// Digit-like inputs: 8×8 values on the card's 0..=16 scale.
    fn images(n: usize) -> Vec<f32> {
        (0..n * 64)
            .map(|i| ((i * 7919 + i / 64 * 31) % 17) as f32)
            .collect()
    }

    fn gap(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn digits_conv_s_tail_is_its_last_convolution_and_gives_its_features_back() {
        let card = digits_conv_card();
        let tail = Tail::read(&card, DIGITS_CONV_ONNX, None).unwrap();
        assert_eq!(tail.cut, "p1");
        let t = tail.config;
        assert_eq!(
            (t.input, t.channels, t.kernel, t.padding),
            ([16, 4, 4], 32, [3, 3], [1; 4])
        );
        assert_eq!(
            (t.activation, t.pooling),
            (TailActivation::Relu, TailPooling::Flatten)
        );
        let origin = std::path::Path::new("digits-conv.onnx");
        let whole = Backbone::from_bytes(card.clone(), DIGITS_CONV_ONNX, origin).unwrap();
        let cut = Backbone::from_bytes(tail.cut_card(&card), DIGITS_CONV_ONNX, origin).unwrap();
        let x = images(5);
        let features = whole.features(&x, 5).unwrap();
        let activations = cut.features(&x, 5).unwrap();
        assert_eq!(activations.len(), 5 * 256);
        let zero = vec![0.0; t.num_params()];
        let offsets = TailTensors {
            weight: &zero[..t.weight_len()],
            bias: &zero[t.weight_len()..],
        };
        // The tail with no offset is the backbone's own last block, in plain f32 and in Burn.
        let plain = tail.apply(&offsets, &activations);
        assert!(gap(&plain, &features) < 1e-4, "{}", gap(&plain, &features));
        let device = training_device(Backend::Flex);
        let module = tail.module(&offsets, &device);
        let input = Tensor::<2>::from_data(TensorData::new(activations.clone(), [5, 256]), &device);
        let burn = values(module.forward(input).into_data());
        assert!(gap(&burn, &features) < 1e-4, "{}", gap(&burn, &features));
        assert_eq!(module.to_flat(), zero);
        // Offsets move it: the same in both.
        let moved: Vec<f32> = (0..t.num_params())
            .map(|i| ((i % 13) as f32 - 6.0) * 1e-2)
            .collect();
        let offsets = TailTensors {
            weight: &moved[..t.weight_len()],
            bias: &moved[t.weight_len()..],
        };
        let plain = tail.apply(&offsets, &activations);
        assert!(gap(&plain, &features) > 1e-2);
        let input = Tensor::<2>::from_data(TensorData::new(activations, [5, 256]), &device);
        let burn = values(tail.module(&offsets, &device).forward(input).into_data());
        assert!(gap(&burn, &plain) < 1e-4, "{}", gap(&burn, &plain));
    }

    #[test]
    fn a_cut_elsewhere_or_a_backbone_without_a_trainable_end_is_refused_with_the_reason() {
        let card = digits_conv_card();
        let err = Tail::read(&card, DIGITS_CONV_ONNX, Some("r1")).unwrap_err();
        assert!(err.message.contains("starts at \"p1\""), "{err}");
        let detector = crate::bright_box::bright_box_onnx(8, 8, 0.5);
        let card = crate::bright_box::bright_box_card(8, 8, 16.0);
        let err = Tail::read(&card, &detector, None).unwrap_err();
        assert!(
            err.message.contains("not from a convolution block"),
            "{err}"
        );
    }
}
