//! Stable-FedADG's generator and discriminator (docs/algorithms.md §5) and the flat layout of a
//! model that carries the generator after the head.
//!
//! - Generator `G(ε, y) → z'`: `z' = ReLU(W_g2ᵀ ReLU(W_g1ᵀ [ε, onehot(y)] + b_g1) + b_g2)` with
//!   `ε ~ U[0, 1)^NOISE`. **Choice**: the output goes through a ReLU because the projector
//!   features `z` it imitates are ReLU outputs; the hidden width is `H`.
//! - Discriminator `D(z | y) = σ(W_d2ᵀ ReLU(W_d1ᵀ [z, onehot(y)] + b_d1) + b_d2)`, hidden width
//!   `H`. It never leaves the device.
//!
//! # Flat layouts
//!
//! Generator: `W_g1 [NOISE + K, H]`, `b_g1 [H]`, `W_g2 [H, H]`, `b_g2 [H]`. Discriminator:
//! `W_d1 [H + K, H]`, `b_d1 [H]`, `W_d2 [H, 1]`, `b_d2 [1]`. A Stable-FedADG model is the
//! head's flat vector followed by the generator's ([`ModelLayout`]); strategies average it like
//! any other parameters, so the generator is averaged by sample counts under FedAvg.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::{relu, sigmoid};

use crate::head::FlatLayoutError;

pub use fedge_wire::layout::{AdversarialConfig, ModelLayout, NOISE};

/// Burn modules for an [`AdversarialConfig`] (the sizes and flat layouts live in
/// `fedge-wire`).
pub trait AdversarialModules {
    /// A generator holding `flat`.
    fn generator(&self, flat: &[f32], device: &Device) -> Result<Generator, FlatLayoutError>;

    /// A discriminator holding `flat`.
    fn discriminator(
        &self,
        flat: &[f32],
        device: &Device,
    ) -> Result<Discriminator, FlatLayoutError>;
}

impl AdversarialModules for AdversarialConfig {
    fn generator(&self, flat: &[f32], device: &Device) -> Result<Generator, FlatLayoutError> {
        let [first, second] = linears(&self.generator_shapes(), flat, device)?;
        Ok(Generator {
            first,
            second,
            classes: self.classes,
        })
    }

    fn discriminator(
        &self,
        flat: &[f32],
        device: &Device,
    ) -> Result<Discriminator, FlatLayoutError> {
        let [first, second] = linears(&self.discriminator_shapes(), flat, device)?;
        Ok(Discriminator { first, second })
    }
}

fn linears(
    shapes: &[[usize; 2]; 2],
    flat: &[f32],
    device: &Device,
) -> Result<[Linear; 2], FlatLayoutError> {
    FlatLayoutError::check(fedge_wire::layout::count(shapes), flat.len())?;
    let mut rest = flat;
    let mut take = |[i, o]: [usize; 2]| {
        let (w, tail) = rest.split_at(i * o);
        let (b, tail) = tail.split_at(o);
        rest = tail;
        let weight = Tensor::<2>::from_data(TensorData::new(w.to_vec(), [i, o]), device);
        let bias = Tensor::<1>::from_data(TensorData::new(b.to_vec(), [o]), device);
        Linear {
            weight: Param::from_tensor(weight),
            bias: Some(Param::from_tensor(bias)),
        }
    };
    Ok([take(shapes[0]), take(shapes[1])])
}

fn linear_values(linears: [&Linear; 2]) -> Vec<f32> {
    let mut out = Vec::new();
    for linear in linears {
        let mut push = |d: TensorData| {
            out.extend(d.convert::<f32>().try_into_vec::<f32>().unwrap_or_default())
        };
        push(linear.weight.val().into_data());
        if let Some(bias) = &linear.bias {
            push(bias.val().into_data());
        }
    }
    out
}

/// One-hot rows `[B, K]` for `labels`.
pub fn one_hot(labels: &[u32], classes: usize, device: &Device) -> Tensor<2> {
    let mut values = vec![0f32; labels.len() * classes];
    for (row, &y) in labels.iter().enumerate() {
        if let Some(v) = values.get_mut(row * classes + y as usize) {
            *v = 1.0;
        }
    }
    Tensor::from_data(TensorData::new(values, [labels.len(), classes]), device)
}

/// The class-conditional feature generator.
#[derive(Module, Debug)]
pub struct Generator {
    first: Linear,
    second: Linear,
    classes: usize,
}

impl Generator {
    /// `z' = G(ε, y)` for noise `[B, NOISE]` and one-hot labels `[B, K]`; output `[B, H]`.
    pub fn forward(&self, noise: Tensor<2>, one_hot: Tensor<2>) -> Tensor<2> {
        let x = Tensor::cat(vec![noise, one_hot], 1);
        relu(self.second.forward(relu(self.first.forward(x))))
    }

    /// Parameters in the generator's flat layout.
    pub fn to_flat(&self) -> Vec<f32> {
        linear_values([&self.first, &self.second])
    }
}

/// The class-conditional discriminator; says "generated" with 1.
#[derive(Module, Debug)]
pub struct Discriminator {
    first: Linear,
    second: Linear,
}

impl Discriminator {
    /// `D(z | y)` for features `[B, H]` and one-hot labels `[B, K]`; output `[B]` in (0, 1).
    pub fn forward(&self, z: Tensor<2>, one_hot: Tensor<2>) -> Tensor<1> {
        let x = Tensor::cat(vec![z, one_hot], 1);
        let logits = self.second.forward(relu(self.first.forward(x)));
        let [b, _] = logits.dims();
        sigmoid(logits).reshape([b])
    }

    /// Parameters in the discriminator's flat layout.
    pub fn to_flat(&self) -> Vec<f32> {
        linear_values([&self.first, &self.second])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::HeadConfig;
    use crate::{Backend, training_device};

    #[test]
    fn generator_and_discriminator_round_trip_through_their_flat_layouts() {
        let device = training_device(Backend::default());
        let head = HeadConfig::new(5, 3).with_hidden(4);
        let c = AdversarialConfig::for_head(&head);
        assert_eq!(c.generator_params(), (NOISE + 3) * 4 + 4 + 4 * 4 + 4);
        assert_eq!(c.discriminator_params(), (4 + 3) * 4 + 4 + 4 + 1);
        let g = c.init_generator(1);
        assert_eq!(c.generator(&g, &device).unwrap().to_flat(), g);
        let d = c.init_discriminator(2);
        assert_eq!(c.discriminator(&d, &device).unwrap().to_flat(), d);
        assert!(c.generator(&d, &device).is_err());

        // Shapes and ranges of the modules' outputs.
        let gen_ = c.generator(&g, &device).unwrap();
        let noise = Tensor::<2>::ones([2, NOISE], &device);
        let z = gen_.forward(noise, one_hot(&[0, 2], 3, &device));
        assert_eq!(z.dims(), [2, 4]);
        let disc = c.discriminator(&d, &device).unwrap();
        let out: Vec<f32> = disc
            .forward(z, one_hot(&[0, 2], 3, &device))
            .into_data()
            .convert::<f32>()
            .try_into_vec()
            .unwrap();
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|p| *p > 0.0 && *p < 1.0));
    }
}
