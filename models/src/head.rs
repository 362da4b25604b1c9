//! The trainable head (docs/algorithms.md §0) and its flat parameter layout.
//!
//! # Flat layout
//!
//! The layout is defined once, in `fedge_wire::layout` (`W1 [F,H]`, `b1`, `W [H,K]`, `b`, all
//! row-major); this module builds Burn modules from it and reads them back into it.

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::relu;

pub use fedge_wire::layout::{FlatLayoutError, HeadConfig, HeadTensors};

/// Burn modules for a [`HeadConfig`] (the sizes and the flat layout live in `fedge-wire`).
pub trait HeadModules {
    /// A head with Burn's default (Kaiming-uniform) initialisation.
    fn init(&self, device: &Device) -> Head;

    /// A head holding `flat` (see the module docs for the layout); a tail's offsets are read
    /// by [`crate::tail::Tail::module`], which also needs the backbone's weights.
    #[expect(
        clippy::wrong_self_convention,
        reason = "the sizes (`self`) and the values (`flat`) make the head; the name is the one \
                  callers used before the sizes moved to fedge-wire"
    )]
    fn from_flat(&self, flat: &[f32], device: &Device) -> Result<Head, FlatLayoutError>;
}

impl HeadModules for HeadConfig {
    fn init(&self, device: &Device) -> Head {
        Head {
            tail: None,
            projector: LinearConfig::new(self.features, self.hidden).init(device),
            classifier: LinearConfig::new(self.hidden, self.classes).init(device),
        }
    }

    fn from_flat(&self, flat: &[f32], device: &Device) -> Result<Head, FlatLayoutError> {
        let HeadTensors { w1, b1, w, b } = self.split(flat)?;
        let (f, h, k) = (self.features, self.hidden, self.classes);
        Ok(Head {
            tail: None,
            projector: linear_from(w1, b1, [f, h], device),
            classifier: linear_from(w, b, [h, k], device),
        })
    }
}

fn linear_from(weight: &[f32], bias: &[f32], shape: [usize; 2], device: &Device) -> Linear {
    let weight = Tensor::<2>::from_data(TensorData::new(weight.to_vec(), shape), device);
    let bias = Tensor::<1>::from_data(TensorData::new(bias.to_vec(), [shape[1]]), device);
    Linear {
        weight: Param::from_tensor(weight),
        bias: Some(Param::from_tensor(bias)),
    }
}

/// Projector and classifier on top of backbone features, and the backbone's trainable tail
/// before them when the head has one ([`Head::with_tail`]).
#[derive(Module, Debug)]
pub struct Head {
    /// The tail: the cut's activations to the features `x` (none on frozen features).
    pub tail: Option<crate::tail::TailModule>,
    /// `z = ReLU(W1ᵀ x + b1)`.
    pub projector: Linear,
    /// `o = Wᵀ z + b`.
    pub classifier: Linear,
}

impl Head {
    /// Projector features `z`.
    ///
    /// # Shapes
    /// - input: `[batch, F]` (`[batch, C·H·W]`, the cut's activations, with a tail)
    /// - output: `[batch, H]`
    pub fn features(&self, x: Tensor<2>) -> Tensor<2> {
        let x = match &self.tail {
            Some(tail) => tail.forward(x),
            None => x,
        };
        relu(self.projector.forward(x))
    }

    /// The same head behind `tail` (a head from [`HeadModules::from_flat`] on a layout with a
    /// tail has none until given one: only the device holds the backbone's weights).
    pub fn with_tail(mut self, tail: crate::tail::TailModule) -> Self {
        self.tail = Some(tail);
        self
    }

    /// Class logits.
    ///
    /// # Shapes
    /// - input: `[batch, F]`
    /// - output: `[batch, K]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.classifier.forward(self.features(x))
    }

    /// All parameters in the flat layout (the tail's offsets first).
    pub fn to_flat(&self) -> Vec<f32> {
        let mut out = self.tail.as_ref().map(|t| t.to_flat()).unwrap_or_default();
        for linear in [&self.projector, &self.classifier] {
            out.extend(tensor_values(linear.weight.val().into_data()));
            if let Some(bias) = &linear.bias {
                out.extend(tensor_values(bias.val().into_data()));
            }
        }
        out
    }
}

fn tensor_values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_default()
}

/// Predicted classes of `features` (`[n, F]`, row-major) under the head given by `flat`,
/// computed in plain f32 without Burn, for evaluation where no gradient is needed.
pub fn predict_flat(
    config: &HeadConfig,
    flat: &[f32],
    features: &[f32],
) -> Result<Vec<usize>, FlatLayoutError> {
    let head = config.split(flat)?;
    let mut forward = Forward::new(config);
    Ok(features
        .chunks_exact(config.features)
        .map(|x| argmax(forward.logits(&head, x)))
        .collect())
}

/// The head's forward pass in plain f32, `ReLU(x·W1 + b1)·W + b`, with its scratch space:
/// the one written out, used by evaluation ([`predict_flat`]) and by every prediction a
/// device serves. Its sums run in a fixed order, so the same input gives the same logits.
#[derive(Debug, Clone)]
pub struct Forward {
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl Forward {
    /// Scratch space for `config`'s head.
    pub fn new(config: &HeadConfig) -> Self {
        Self {
            hidden: vec![0.0; config.hidden],
            logits: vec![0.0; config.classes],
        }
    }

    /// The logits of one feature vector `x` (`F` values) under `head`.
    pub fn logits(&mut self, head: &HeadTensors<'_, f32>, x: &[f32]) -> &[f32] {
        let (h, k) = (head.b1.len(), head.b.len());
        self.hidden.resize(h, 0.0);
        self.logits.resize(k, 0.0);
        self.hidden.copy_from_slice(head.b1);
        for (xi, row) in x.iter().zip(head.w1.chunks_exact(h)) {
            if *xi != 0.0 {
                for (zj, wij) in self.hidden.iter_mut().zip(row) {
                    *zj += xi * wij;
                }
            }
        }
        self.logits.copy_from_slice(head.b);
        for (zj, row) in self.hidden.iter().zip(head.w.chunks_exact(k)) {
            let zj = zj.max(0.0);
            for (ok, wjk) in self.logits.iter_mut().zip(row) {
                *ok += zj * wjk;
            }
        }
        &self.logits
    }

    /// The projector's output `ReLU(x·W1 + b1)` of the last [`Forward::logits`] call.
    pub fn projected(&self) -> impl Iterator<Item = f32> + '_ {
        self.hidden.iter().map(|z| z.max(0.0))
    }
}

/// Index of the largest value (the first one on ties; 0 for an empty slice).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Backend, training_device};

    fn config() -> HeadConfig {
        HeadConfig::new(5, 3).with_hidden(4)
    }

    #[test]
    fn flat_round_trip_keeps_every_value_in_documented_order() {
        let device = training_device(Backend::Flex);
        let config = config();
        let flat: Vec<f32> = (0..config.num_params())
            .map(|i| i as f32 * 0.01 - 0.2)
            .collect();
        let head = config.from_flat(&flat, &device).unwrap();
        assert_eq!(head.to_flat(), flat);
        // W1 is [F, H] row-major: element (1, 2) is at 1 * H + 2.
        let w1 = head
            .projector
            .weight
            .val()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        assert_eq!(w1[4 + 2], flat[4 + 2]);
        assert_eq!(head.projector.weight.val().dims(), [5, 4]);
        assert_eq!(head.classifier.weight.val().dims(), [4, 3]);
    }

    #[test]
    fn from_flat_rejects_wrong_length() {
        let device = training_device(Backend::Flex);
        let err = config().from_flat(&[0.0; 3], &device).unwrap_err();
        assert_eq!(
            err,
            FlatLayoutError {
                expected: 39,
                got: 3
            }
        );
    }

    #[test]
    fn plain_prediction_matches_burn_forward() {
        let device = training_device(Backend::Flex);
        let config = config();
        let head = config.init(&device);
        let flat = head.to_flat();
        let x: Vec<f32> = (0..6 * 5)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let logits = head.forward(Tensor::<2>::from_data(
            TensorData::new(x.clone(), [6, 5]),
            &device,
        ));
        let logits = logits.into_data().try_into_vec::<f32>().unwrap();
        let expected: Vec<usize> = logits.chunks(3).map(argmax).collect();
        assert_eq!(predict_flat(&config, &flat, &x).unwrap(), expected);
    }
}
