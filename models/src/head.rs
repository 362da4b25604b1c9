//! The trainable head (ALGORITHMS.md §0) and its flat parameter layout.
//!
//! # Flat layout
//!
//! `θ` is one f32 vector, in this order, every matrix row-major:
//!
//! 1. projector weight `W1`, shape `[F, H]` (Burn's `Linear` stores `[d_in, d_out]`),
//! 2. projector bias `b1`, shape `[H]`,
//! 3. classifier weight `W`, shape `[H, K]`,
//! 4. classifier bias `b`, shape `[K]`.
//!
//! So `θ.len() = F·H + H + H·K + K`. Deltas, momentum buffers and checkpoints all use it.

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::relu;

/// Sizes of a head.
#[derive(Config, Debug, PartialEq, Eq)]
pub struct HeadConfig {
    /// Backbone feature size `F`.
    pub features: usize,
    /// Projector width `H`.
    #[config(default = 64)]
    pub hidden: usize,
    /// Number of classes `K`.
    pub classes: usize,
}

/// A flat vector whose length does not match the head.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("flat parameter vector has {got} values, the head needs {expected}")]
pub struct FlatLayoutError {
    /// Required length.
    pub expected: usize,
    /// Length given.
    pub got: usize,
}

impl HeadConfig {
    /// Number of values in the flat layout.
    pub fn num_params(&self) -> usize {
        self.features * self.hidden + self.hidden + self.hidden * self.classes + self.classes
    }

    /// Where the classifier weight `W` (`[H, K]`, row-major) sits in the flat vector.
    pub fn classifier_range(&self) -> std::ops::Range<usize> {
        let start = self.features * self.hidden + self.hidden;
        start..start + self.hidden * self.classes
    }

    /// Seeded initial parameters in the flat layout, drawn as PyTorch's `nn.Linear` does:
    /// weights and biases uniform in `±1/sqrt(fan_in)`.
    pub fn init_flat(&self, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(self.num_params());
        for (fan_in, fan_out) in [(self.features, self.hidden), (self.hidden, self.classes)] {
            let bound = 1.0 / (fan_in as f32).sqrt();
            out.extend((0..fan_in * fan_out + fan_out).map(|_| rng.random_range(-bound..bound)));
        }
        out
    }

    /// A head with Burn's default (Kaiming-uniform) initialisation.
    pub fn init(&self, device: &Device) -> Head {
        Head {
            projector: LinearConfig::new(self.features, self.hidden).init(device),
            classifier: LinearConfig::new(self.hidden, self.classes).init(device),
        }
    }

    /// A head holding `flat` (see the module docs for the layout).
    pub fn from_flat(&self, flat: &[f32], device: &Device) -> Result<Head, FlatLayoutError> {
        if flat.len() != self.num_params() {
            return Err(FlatLayoutError {
                expected: self.num_params(),
                got: flat.len(),
            });
        }
        let (f, h, k) = (self.features, self.hidden, self.classes);
        let (w1, rest) = flat.split_at(f * h);
        let (b1, rest) = rest.split_at(h);
        let (w, b) = rest.split_at(h * k);
        Ok(Head {
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

/// Projector and classifier on top of backbone features.
#[derive(Module, Debug)]
pub struct Head {
    /// `z = ReLU(W1ᵀ x + b1)`.
    pub projector: Linear,
    /// `o = Wᵀ z + b`.
    pub classifier: Linear,
}

impl Head {
    /// Projector features `z`.
    ///
    /// # Shapes
    /// - input: `[batch, F]`
    /// - output: `[batch, H]`
    pub fn features(&self, x: Tensor<2>) -> Tensor<2> {
        relu(self.projector.forward(x))
    }

    /// Class logits.
    ///
    /// # Shapes
    /// - input: `[batch, F]`
    /// - output: `[batch, K]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.classifier.forward(self.features(x))
    }

    /// All parameters in the flat layout.
    pub fn to_flat(&self) -> Vec<f32> {
        let mut out = Vec::new();
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
    if flat.len() != config.num_params() {
        return Err(FlatLayoutError {
            expected: config.num_params(),
            got: flat.len(),
        });
    }
    let (f, h, k) = (config.features, config.hidden, config.classes);
    let (w1, rest) = flat.split_at(f * h);
    let (b1, rest) = rest.split_at(h);
    let (w, b) = rest.split_at(h * k);
    let mut z = vec![0f32; h];
    let mut o = vec![0f32; k];
    Ok(features
        .chunks_exact(f)
        .map(|x| {
            z.copy_from_slice(b1);
            for (xi, row) in x.iter().zip(w1.chunks_exact(h)) {
                if *xi != 0.0 {
                    for (zj, wij) in z.iter_mut().zip(row) {
                        *zj += xi * wij;
                    }
                }
            }
            o.copy_from_slice(b);
            for (zj, row) in z.iter().zip(w.chunks_exact(k)) {
                let zj = zj.max(0.0);
                for (ok, wjk) in o.iter_mut().zip(row) {
                    *ok += zj * wjk;
                }
            }
            argmax(&o)
        })
        .collect())
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
