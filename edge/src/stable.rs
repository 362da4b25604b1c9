//! Stable-FedADG's building blocks on the device (ALGORITHMS.md §5): the adversarial losses of
//! the feature extractor, discriminator and generator, and stable learning's sample weights
//! that decorrelate Random Fourier Features of the projector output.
//!
//! Convention: the discriminator `D(z | y) ∈ (0, 1)` says "generated" with 1. With `d_real =
//! D(z | y)` on real features and `d_fake = D(z' | y)` on generated ones:
//!
//! - `L_d = −(E[(1 − d_real)²] + E[d_fake²])` (the discriminator pushes real towards 0, fake
//!   towards 1),
//! - `L_f = E[(1 − d_real)²]` (the extractor makes real features look generated: aligned with
//!   the generator's class-conditional distribution, shared by all sites),
//! - `L_g = −E[(1 − d_fake)²]`.
//!
//! These pieces are tested here; the training schedule that combines them (E0 steps on the
//! weighted loss, then E1 adversarial steps) and the generator travelling with the head are the
//! next step of the Stable-FedADG work.

use burn::optim::momentum::MomentumConfig;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use rand::Rng;

/// Learning rate of the sample-weight optimiser (StableNet's choice, kept by the paper).
pub const WEIGHT_LR: f64 = 1.0;
/// Momentum of the sample-weight optimiser.
pub const WEIGHT_MOMENTUM: f64 = 0.9;
/// Inner iterations per batch.
pub const WEIGHT_ITERATIONS: usize = 20;

/// `L_d` from the discriminator's outputs on real (`[B]`) and generated (`[B']`) features.
pub fn discriminator_loss(d_real: Tensor<1>, d_fake: Tensor<1>) -> Tensor<1> {
    let real = d_real.neg().add_scalar(1.0).powi_scalar(2).mean();
    let fake = d_fake.powi_scalar(2).mean();
    (real + fake).neg()
}

/// `L_f` from the discriminator's outputs on real features.
pub fn extractor_loss(d_real: Tensor<1>) -> Tensor<1> {
    d_real.neg().add_scalar(1.0).powi_scalar(2).mean()
}

/// `L_g` from the discriminator's outputs on generated features.
pub fn generator_loss(d_fake: Tensor<1>) -> Tensor<1> {
    d_fake.neg().add_scalar(1.0).powi_scalar(2).mean().neg()
}

/// One draw of Random Fourier Features, one function per feature dimension:
/// `u_j(x) = √2 cos(ω_j x + φ_j)` with `ω_j ~ N(0, 1)` and `φ_j ~ U(0, 2π)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rff {
    /// Frequencies, one per dimension.
    pub omega: Vec<f32>,
    /// Phases, one per dimension.
    pub phi: Vec<f32>,
}

impl Rff {
    /// A fresh draw for `dims` dimensions.
    pub fn draw(dims: usize, rng: &mut impl Rng) -> Self {
        let normal = |rng: &mut dyn rand::RngCore| {
            // Box–Muller; `1 − u` keeps the logarithm finite.
            let (u1, u2): (f32, f32) = (rng.random(), rng.random());
            (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        };
        let omega = (0..dims).map(|_| normal(rng)).collect();
        let phi = (0..dims)
            .map(|_| rng.random::<f32>() * std::f32::consts::TAU)
            .collect();
        Self { omega, phi }
    }

    /// `u(x)` for the rows of `x` (`[n, dims]`, row-major).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let d = self.omega.len();
        x.iter()
            .enumerate()
            .map(|(i, v)| {
                let j = i % d;
                std::f32::consts::SQRT_2 * (self.omega[j] * v + self.phi[j]).cos()
            })
            .collect()
    }
}

/// Sum of squared off-diagonal entries of the weighted covariance of the columns of `u`
/// (`[n, d]`), with weights `w` (`[n]`, summing to 1): `C = Uᵀ diag(w) U − (Uᵀw)(Uᵀw)ᵀ`.
pub fn off_diagonal_covariance(u: Tensor<2>, w: Tensor<1>) -> Tensor<1> {
    let [n, d] = u.dims();
    let w = w.reshape([n, 1]);
    let weighted_mean = (u.clone() * w.clone()).sum_dim(0); // [1, d]
    let second = u.clone().transpose().matmul(u * w); // [d, d]
    let cov = second - weighted_mean.clone().transpose().matmul(weighted_mean);
    let diagonal_mask = Tensor::<2>::eye(d, &cov.device());
    (cov * (diagonal_mask.neg().add_scalar(1.0)))
        .powi_scalar(2)
        .sum()
}

/// Stable learning's sample weights for one batch of projector features `z` (`[n, d]`,
/// row-major): `w = softmax(logits)`, logits starting at 1, minimising the off-diagonal
/// weighted RFF covariance plus `Σ w²` by SGD (lr 1, momentum 0.9, 20 iterations, a fresh RFF
/// draw each iteration). Returns weights summing to 1, as plain numbers (no gradient flows
/// into the network).
pub fn sample_weights(z: &[f32], dims: usize, rng: &mut impl Rng, device: &Device) -> Vec<f32> {
    let n = z.len() / dims.max(1);
    if n == 0 {
        return Vec::new();
    }
    let mut logits = vec![1.0f32; n];
    let mut velocity = vec![0.0f32; n];
    let momentum = MomentumConfig {
        momentum: WEIGHT_MOMENTUM,
        dampening: 0.0,
        nesterov: false,
    };
    let autodiff = device.clone().autodiff();
    for iteration in 0..WEIGHT_ITERATIONS {
        let u = Rff::draw(dims, rng).apply(z);
        let u = Tensor::<2>::from_data(TensorData::new(u, [n, dims]), &autodiff);
        let l =
            Tensor::<1>::from_data(TensorData::new(logits.clone(), [n]), &autodiff).require_grad();
        let w = softmax(l.clone(), 0);
        let loss = off_diagonal_covariance(u, w.clone()) + w.powi_scalar(2).sum();
        let grads = loss.backward();
        let Some(grad) = l.grad(&grads) else { break };
        let grad: Vec<f32> = grad
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap_or_default();
        // PyTorch's SGD with momentum: the buffer starts at the first gradient.
        for ((logit, v), g) in logits.iter_mut().zip(&mut velocity).zip(grad) {
            *v = if iteration == 0 {
                g
            } else {
                momentum.momentum as f32 * *v + g
            };
            *logit -= WEIGHT_LR as f32 * *v;
        }
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_models::{Backend, training_device};
    use rand::SeedableRng;

    fn device() -> Device {
        training_device(Backend::default())
    }

    fn t1(values: &[f32]) -> Tensor<1> {
        Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), &device())
    }

    fn value(t: Tensor<1>) -> f32 {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()[0]
    }

    #[test]
    fn adversarial_losses_on_a_tiny_case() {
        // d_real = [0.2, 0.6]: (1 − d)² = [0.64, 0.16], mean 0.4.
        // d_fake = [0.5, 0.9, 0.1]: d² = [0.25, 0.81, 0.01], mean 0.3566…;
        // (1 − d)² = [0.25, 0.01, 0.81], mean 0.3566… too.
        let real = [0.2, 0.6];
        let fake = [0.5, 0.9, 0.1];
        let close = |a: f32, b: f64| (f64::from(a) - b).abs() < 1e-6;
        assert!(close(value(extractor_loss(t1(&real))), 0.4));
        assert!(close(
            value(discriminator_loss(t1(&real), t1(&fake))),
            -(0.4 + 1.07 / 3.0)
        ));
        assert!(close(value(generator_loss(t1(&fake))), -1.07 / 3.0));
        // A perfect discriminator (real 0, fake 1) has the lowest L_d, −2.
        assert!(close(
            value(discriminator_loss(t1(&[0.0, 0.0]), t1(&[1.0]))),
            -2.0
        ));
    }

    #[test]
    fn off_diagonal_covariance_matches_a_direct_computation() {
        let u = [1.0f32, 2.0, 0.0, 3.0, 1.0, 1.0, -1.0, 0.0, 2.0]; // 3 rows, 3 columns
        let w = [0.5f32, 0.3, 0.2];
        let mut direct = 0.0f64;
        let col = |i: usize, j: usize| f64::from(u[i * 3 + j]);
        let mean: Vec<f64> = (0..3)
            .map(|j| (0..3).map(|i| f64::from(w[i]) * col(i, j)).sum())
            .collect();
        for a in 0..3 {
            for b in 0..3 {
                if a != b {
                    let c: f64 = (0..3)
                        .map(|i| f64::from(w[i]) * col(i, a) * col(i, b))
                        .sum::<f64>()
                        - mean[a] * mean[b];
                    direct += c * c;
                }
            }
        }
        let u = Tensor::<2>::from_data(TensorData::new(u.to_vec(), [3, 3]), &device());
        let got = value(off_diagonal_covariance(u, t1(&w)));
        assert!((f64::from(got) - direct).abs() < 1e-5, "{got} vs {direct}");
    }

    #[test]
    fn learned_weights_decorrelate_correlated_features() {
        // Two features that move together in most samples, independently in a few: weighting
        // the independent ones up lowers the covariance between them.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = 64;
        let mut z = Vec::with_capacity(n * 2);
        for i in 0..n {
            let a: f32 = rng.random::<f32>() * 2.0 - 1.0;
            let b = if i % 4 == 0 {
                rng.random::<f32>() * 2.0 - 1.0
            } else {
                a + 0.05 * (rng.random::<f32>() - 0.5)
            };
            z.extend([a, b]);
        }
        let w = sample_weights(&z, 2, &mut rng, &device());
        assert_eq!(w.len(), n);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-4);
        // Score both weightings on the same fresh RFF draws.
        let uniform = vec![1.0 / n as f32; n];
        let (mut learned_total, mut uniform_total) = (0.0, 0.0);
        for _ in 0..50 {
            let u = Rff::draw(2, &mut rng).apply(&z);
            let u = Tensor::<2>::from_data(TensorData::new(u, [n, 2]), &device());
            learned_total += value(off_diagonal_covariance(u.clone(), t1(&w)));
            uniform_total += value(off_diagonal_covariance(u, t1(&uniform)));
        }
        assert!(
            learned_total < 0.9 * uniform_total,
            "learned {learned_total} vs uniform {uniform_total}"
        );
        let independent: f32 = (0..n).step_by(4).map(|i| w[i]).sum();
        eprintln!("learned {learned_total}, uniform {uniform_total}, independent {independent}");
        assert!(
            independent > 0.25,
            "independent samples gain weight: {independent}"
        );
    }
}
