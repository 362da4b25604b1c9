//! Stable-FedADG's building blocks on the device (docs/algorithms.md §5): the adversarial losses of
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
//! [`train_round`] is one local round: `E0` batches on the weighted loss `L_S` alone, then
//! adversarial batches (at least `E1`; **Choice**: every further batch of the round's local
//! epochs is adversarial too, so a round sees as many batches as a cross-entropy round, and at
//! least `E0 + E1`). An adversarial batch steps the head on `λ0 L_f + λ1 L_S`, the
//! discriminator on `L_d` and the generator on `L_g`, each with its own SGD (the round's
//! learning rate and momentum; weight decay only on the head). **Choice**: one learning rate
//! for all three; the paper gives the generator and discriminator 5–50× the extractor's rate,
//! a knob fedge leaves out. With `λ1 = 0.15` the classifier learns several times slower than
//! under plain cross-entropy (BENCHMARKS.md has the figures).
//!
//! **Choice** (the global memory): stable learning scores each batch together with
//! [`MEMORY_ROWS`] saved rows of features and weights. The saved weights are fixed while the
//! batch's are learned; the combined weights are `(M/(M+B))·w_mem ⊕ (B/(M+B))·softmax(logits)`
//! so they sum to 1. After the batch, memory row `r` becomes `0.9·old + 0.1·new` with `new` the
//! batch row `r mod B` (the first batch fills the memory by repeating its rows), and the memory
//! weights are renormalised to sum to 1.

use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::log_softmax;
use fedge_models::adversarial::{NOISE, one_hot};
use fedge_models::{Discriminator, Generator, Head};
use fedge_wire::TrainParams;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::sgd::{batch_tensors, sgd};
use crate::features::FeatureSet;

/// Learning rate of the sample-weight optimiser (StableNet's choice, kept by the paper).
pub const WEIGHT_LR: f64 = 1.0;
/// Momentum of the sample-weight optimiser.
pub const WEIGHT_MOMENTUM: f64 = 0.9;
/// Inner iterations per batch.
pub const WEIGHT_ITERATIONS: usize = 20;
/// Rows of the saved global memory.
pub const MEMORY_ROWS: usize = 128;
/// Share of the old memory kept at each update.
pub const MEMORY_DECAY: f32 = 0.9;

/// Stable learning's saved features and weights ("saving and reloading"), kept by the device
/// between batches and rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// `MEMORY_ROWS × dims` features, row-major.
    pub features: Vec<f32>,
    /// One weight per row, summing to 1.
    pub weights: Vec<f32>,
    /// Feature size.
    pub dims: usize,
}

impl Memory {
    /// Folds a batch (`z`: `[B, dims]`, its learned weights `w`) into the memory, or fills a new
    /// memory with it (see the module docs).
    pub fn update(memory: Option<Memory>, z: &[f32], w: &[f32], dims: usize) -> Option<Memory> {
        let b = w.len();
        if b == 0 || z.len() != b * dims {
            return memory;
        }
        let row = |r: usize| &z[(r % b) * dims..(r % b + 1) * dims];
        let mut memory = match memory {
            Some(m) if m.dims == dims && m.weights.len() == MEMORY_ROWS => {
                let mut m = m;
                for r in 0..MEMORY_ROWS {
                    let new = row(r);
                    for (old, v) in m.features[r * dims..(r + 1) * dims].iter_mut().zip(new) {
                        *old = MEMORY_DECAY * *old + (1.0 - MEMORY_DECAY) * v;
                    }
                    m.weights[r] = MEMORY_DECAY * m.weights[r] + (1.0 - MEMORY_DECAY) * w[r % b];
                }
                m
            }
            _ => Memory {
                features: (0..MEMORY_ROWS).flat_map(row).copied().collect(),
                weights: (0..MEMORY_ROWS).map(|r| w[r % b]).collect(),
                dims,
            },
        };
        let total: f32 = memory.weights.iter().sum();
        if total > 0.0 && total.is_finite() {
            memory.weights.iter_mut().for_each(|v| *v /= total);
        } else {
            memory.weights.fill(1.0 / MEMORY_ROWS as f32);
        }
        Some(memory)
    }
}

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
/// weighted RFF covariance (of the batch together with `memory`, if any) plus `Σ w²` by SGD
/// (lr 1, momentum 0.9, 20 iterations, a fresh RFF draw each iteration). Returns the batch's
/// weights summing to 1, as plain numbers (no gradient flows into the network).
///
/// The gradient is written out ([`covariance_gradient`]) rather than taken by autodiff: 20
/// inner iterations per batch made Burn's graph bookkeeping the largest cost of a
/// Stable-FedADG round.
pub fn sample_weights(
    z: &[f32],
    dims: usize,
    memory: Option<&Memory>,
    rng: &mut impl Rng,
) -> Vec<f32> {
    let n = z.len() / dims.max(1);
    if n == 0 {
        return Vec::new();
    }
    let memory = memory.filter(|m| m.dims == dims && m.weights.len() * dims == m.features.len());
    let saved = memory.map_or(0, |m| m.weights.len());
    let share = n as f32 / (n + saved) as f32;
    let all: Vec<f32> = match memory {
        Some(m) => m.features.iter().chain(z).copied().collect(),
        None => z.to_vec(),
    };
    let mut weights: Vec<f32> = match memory {
        Some(m) => m.weights.iter().map(|v| v * (1.0 - share)).collect(),
        None => Vec::new(),
    };
    weights.resize(saved + n, 0.0);
    let mut logits = vec![1.0f32; n];
    let mut velocity = vec![0.0f32; n];
    let mut gradient = vec![0.0f32; saved + n];
    for iteration in 0..WEIGHT_ITERATIONS {
        let s = softmax_host(&logits);
        for (w, s) in weights[saved..].iter_mut().zip(&s) {
            *w = share * s;
        }
        let u = Rff::draw(dims, rng).apply(&all);
        covariance_gradient(&u, dims, &weights, saved, &mut gradient);
        // Through `w_batch = share · s` and `+ Σ s²`, then the softmax's Jacobian.
        let h: Vec<f32> = gradient[saved..]
            .iter()
            .zip(&s)
            .map(|(g, s)| share * g + 2.0 * s)
            .collect();
        let mean: f32 = s.iter().zip(&h).map(|(s, h)| s * h).sum();
        // PyTorch's SGD with momentum: the buffer starts at the first gradient.
        for (j, (logit, v)) in logits.iter_mut().zip(&mut velocity).enumerate() {
            let g = s[j] * (h[j] - mean);
            *v = if iteration == 0 {
                g
            } else {
                WEIGHT_MOMENTUM as f32 * *v + g
            };
            *logit -= WEIGHT_LR as f32 * *v;
        }
    }
    softmax_host(&logits)
}

fn softmax_host(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// The value of [`off_diagonal_covariance`] for `u` (`[n, d]`) and weights `w`, and its
/// gradient with respect to `w[from..]` written into `gradient[from..]`:
/// `∂/∂w_i = 2 (u_iᵀ C′ u_i − 2 u_iᵀ C′ m)` with `m = Uᵀw` and `C′` the covariance with a
/// zero diagonal.
pub fn covariance_gradient(
    u: &[f32],
    d: usize,
    w: &[f32],
    from: usize,
    gradient: &mut [f32],
) -> f32 {
    let mut mean = vec![0f32; d];
    let mut cov = vec![0f32; d * d];
    for (row, &wi) in u.chunks_exact(d).zip(w) {
        for (a, &ua) in row.iter().enumerate() {
            let scaled = wi * ua;
            mean[a] += scaled;
            for (c, &ub) in cov[a * d..(a + 1) * d].iter_mut().zip(row) {
                *c += scaled * ub;
            }
        }
    }
    let mut loss = 0f32;
    for a in 0..d {
        for b in 0..d {
            let c = &mut cov[a * d + b];
            *c = if a == b { 0.0 } else { *c - mean[a] * mean[b] };
            loss += *c * *c;
        }
    }
    // C′m once; then per row u_iᵀ C′ u_i − 2 u_iᵀ (C′m).
    let cm: Vec<f32> = cov
        .chunks_exact(d)
        .map(|row| row.iter().zip(&mean).map(|(c, m)| c * m).sum())
        .collect();
    let mut cu = vec![0f32; d];
    for (row, g) in u.chunks_exact(d).zip(gradient.iter_mut()).skip(from) {
        cu.fill(0.0);
        for (a, &ua) in row.iter().enumerate() {
            for (x, &c) in cu.iter_mut().zip(&cov[a * d..(a + 1) * d]) {
                *x += ua * c;
            }
        }
        let quadratic: f32 = row.iter().zip(&cu).map(|(u, c)| u * c).sum();
        let linear: f32 = row.iter().zip(&cm).map(|(u, c)| u * c).sum();
        *g = 2.0 * (quadratic - 2.0 * linear);
    }
    loss
}

/// What one Stable-FedADG round produced.
pub struct StableRound {
    /// The trained head.
    pub head: Head,
    /// The trained generator (travels to the coordinator).
    pub generator: Generator,
    /// The trained discriminator (stays on the device).
    pub discriminator: Discriminator,
    /// Mean `L_S` over the round's last `ceil(n / B)` batches.
    pub loss: f32,
    /// Batches trained.
    pub steps: usize,
    /// Stopped before its last batch (see `crate::train::TrainJob::cancel`).
    pub cancelled: bool,
}

/// The modules a round starts from.
pub struct StableModules {
    /// The global head.
    pub head: Head,
    /// The global generator.
    pub generator: Generator,
    /// The device's discriminator.
    pub discriminator: Discriminator,
}

/// One Stable-FedADG round on `data` (see the module docs for the schedule); `memory` is the
/// device's saved memory, updated in place.
pub fn train_round(
    modules: StableModules,
    data: &FeatureSet,
    classes: usize,
    params: &TrainParams,
    memory: &mut Option<Memory>,
    rng: &mut StdRng,
    (device, cancel): (&Device, Option<&std::sync::atomic::AtomicBool>),
) -> StableRound {
    let StableModules {
        mut head,
        mut generator,
        mut discriminator,
    } = modules;
    let lr = f64::from(params.learning_rate);
    let mut head_optim = sgd(params, true).init();
    let mut generator_optim = sgd(params, false).init();
    let mut discriminator_optim = sgd(params, false).init();
    let batch = params.batch_size.max(1) as usize;
    let per_epoch = data.len().div_ceil(batch);
    let warmup = params.warmup_batches as usize;
    let total = (per_epoch * params.local_epochs as usize)
        .max(warmup + params.adversarial_batches as usize);
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut batches = Vec::with_capacity(total);
    while batches.len() < total {
        order.shuffle(rng);
        batches.extend(order.chunks(batch).map(<[usize]>::to_vec));
    }
    batches.truncate(total);
    let (mut recent, mut steps) = (Vec::new(), 0);
    let mut cancelled = false;
    for (b, idx) in batches.iter().enumerate() {
        if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            cancelled = true;
            break;
        }
        let (x, targets, labels) = batch_tensors(data, idx, device);
        let n = idx.len();
        let z = head.features(x);
        let logits = head.classifier.forward(z.clone());
        let ce = log_softmax(logits, 1)
            .gather(1, targets.reshape([n, 1]))
            .reshape([n])
            .neg();
        let z_values = values(z.clone().detach());
        let hidden = z_values.len() / n;
        let w = sample_weights(&z_values, hidden, memory.as_ref(), rng);
        *memory = Memory::update(memory.take(), &z_values, &w, hidden);
        let w = Tensor::<1>::from_data(TensorData::new(w, [n]), device);
        let weighted = (ce * w).sum();
        recent.push(values(weighted.clone().detach())[0]);
        let adversarial = b >= warmup;
        let labels_1h = one_hot(&labels, classes, device);
        let loss = if adversarial {
            let d_real = discriminator.forward(z.clone(), labels_1h.clone());
            // The paper's convex combination as it stands. Dividing by λ1 (so that the task
            // loss keeps the round's learning rate) was tried: L_f then dominates and the
            // features collapse to chance accuracy on digits-bg.
            extractor_loss(d_real).mul_scalar(params.adversarial_weight)
                + weighted.mul_scalar(params.stable_weight)
        } else {
            weighted
        };
        let grads = GradientsParams::from_grads(loss.backward(), &head);
        head = head_optim.step(lr, head, grads);
        steps += 1;
        if adversarial {
            let noise: Vec<f32> = (0..n * NOISE).map(|_| rng.random::<f32>()).collect();
            let noise = Tensor::<2>::from_data(TensorData::new(noise, [n, NOISE]), device);
            let fake = generator.forward(noise.clone(), labels_1h.clone()).detach();
            let d_real = discriminator.forward(z.detach(), labels_1h.clone());
            let d_fake = discriminator.forward(fake, labels_1h.clone());
            let loss = discriminator_loss(d_real, d_fake);
            let grads = GradientsParams::from_grads(loss.backward(), &discriminator);
            discriminator = discriminator_optim.step(lr, discriminator, grads);
            let d_fake =
                discriminator.forward(generator.forward(noise, labels_1h.clone()), labels_1h);
            let grads = GradientsParams::from_grads(generator_loss(d_fake).backward(), &generator);
            generator = generator_optim.step(lr, generator, grads);
        }
    }
    let last = &recent[recent.len().saturating_sub(per_epoch.max(1))..];
    let loss = last.iter().sum::<f32>() / last.len().max(1) as f32;
    StableRound {
        head,
        generator,
        discriminator,
        loss,
        steps,
        cancelled,
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_default()
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
    fn the_written_out_gradient_matches_burn_and_finite_differences() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (n, d) = (6, 3);
        let u: Vec<f32> = (0..n * d)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        let w: Vec<f32> = {
            let raw: Vec<f32> = (0..n).map(|_| rng.random::<f32>() + 0.1).collect();
            let sum: f32 = raw.iter().sum();
            raw.iter().map(|v| v / sum).collect()
        };
        let mut gradient = vec![0f32; n];
        let loss = covariance_gradient(&u, d, &w, 2, &mut gradient);
        let burn = value(off_diagonal_covariance(
            Tensor::<2>::from_data(TensorData::new(u.clone(), [n, d]), &device()),
            t1(&w),
        ));
        assert!((loss - burn).abs() < 1e-6, "{loss} vs {burn}");
        let at = |w: &[f32]| {
            let mut scratch = vec![0f32; n];
            f64::from(covariance_gradient(&u, d, w, n, &mut scratch))
        };
        assert_eq!(gradient[..2], [0.0, 0.0], "rows before `from` untouched");
        for i in 2..n {
            let eps = 1e-3;
            let (mut up, mut down) = (w.clone(), w.clone());
            up[i] += eps;
            down[i] -= eps;
            let numeric = (at(&up) - at(&down)) / (2.0 * f64::from(eps));
            assert!(
                (f64::from(gradient[i]) - numeric).abs() < 1e-3 * numeric.abs().max(1e-2),
                "∂w{i}: {} vs {numeric}",
                gradient[i]
            );
        }
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
        let w = sample_weights(&z, 2, None, &mut rng);
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
