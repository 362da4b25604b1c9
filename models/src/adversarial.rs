//! Stable-FedADG's generator and discriminator (ALGORITHMS.md §5) and the flat layout of a
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

use crate::head::{FlatLayoutError, HeadConfig};

/// Size of the generator's noise input `ε`.
pub const NOISE: usize = 16;

/// Sizes of the generator and discriminator of a head with `H` features and `K` classes.
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

    fn generator_shapes(&self) -> [[usize; 2]; 2] {
        let h = self.hidden;
        [[NOISE + self.classes, h], [h, h]]
    }

    fn discriminator_shapes(&self) -> [[usize; 2]; 2] {
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
        init(&self.generator_shapes(), seed)
    }

    /// Seeded discriminator parameters.
    pub fn init_discriminator(&self, seed: u64) -> Vec<f32> {
        init(&self.discriminator_shapes(), seed)
    }

    /// A generator holding `flat`.
    pub fn generator(&self, flat: &[f32], device: &Device) -> Result<Generator, FlatLayoutError> {
        let [first, second] = linears(&self.generator_shapes(), flat, device)?;
        Ok(Generator {
            first,
            second,
            classes: self.classes,
        })
    }

    /// A discriminator holding `flat`.
    pub fn discriminator(
        &self,
        flat: &[f32],
        device: &Device,
    ) -> Result<Discriminator, FlatLayoutError> {
        let [first, second] = linears(&self.discriminator_shapes(), flat, device)?;
        Ok(Discriminator { first, second })
    }
}

fn count(shapes: &[[usize; 2]]) -> usize {
    shapes.iter().map(|[i, o]| i * o + o).sum()
}

fn init(shapes: &[[usize; 2]], seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(count(shapes));
    for [fan_in, fan_out] in shapes {
        let bound = 1.0 / (*fan_in as f32).sqrt();
        out.extend((0..fan_in * fan_out + fan_out).map(|_| rng.random_range(-bound..bound)));
    }
    out
}

fn linears(
    shapes: &[[usize; 2]; 2],
    flat: &[f32],
    device: &Device,
) -> Result<[Linear; 2], FlatLayoutError> {
    let expected = count(shapes);
    if flat.len() != expected {
        return Err(FlatLayoutError {
            expected,
            got: flat.len(),
        });
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, training_device};

    #[test]
    fn flat_layouts_round_trip_and_the_model_vector_appends_the_generator() {
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

        let layout = ModelLayout::new(head.clone(), true);
        let flat = layout.init_flat(3);
        assert_eq!(flat.len(), head.num_params() + c.generator_params());
        assert_eq!(layout.head_part(&flat), head.init_flat(3).as_slice());
        assert_eq!(layout.generator_part(&flat).len(), c.generator_params());
        let plain = ModelLayout::new(head.clone(), false);
        assert_eq!(plain.init_flat(3), head.init_flat(3));
        assert!(plain.generator_part(&plain.init_flat(3)).is_empty());

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
