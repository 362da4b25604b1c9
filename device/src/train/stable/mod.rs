//! Stable-FedADG on the device (docs/algorithms.md §5): the adversarial losses of the feature
//! extractor, discriminator and generator, the round's schedule, and stable learning's sample
//! weights ([`weights`]) that decorrelate Random Fourier Features of the projector output.
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
//! [`train_round`] is one local round ([`Schedule`]): by default (`stable_schedule = "paper"`)
//! `E0` batches on the weighted loss `L_S` alone, then `E1` adversarial batches; with
//! `"epoch-phases"`, `E0` whole epochs then `E1` whole adversarial epochs, as the paper's
//! algorithm and the FedADG code run them, whatever the local epochs; with `"epochs"`, as many
//! batches as the local epochs make (at least `E0 + E1`), every one after `E0` adversarial.
//! With `objective = "fedadg"` every sample weighs `1/B`: FedADG alone. An adversarial batch
//! steps the head on `λ0 L_f + λ1 L_S` ([`head_loss`]), the discriminator on `L_d` and the
//! generator on `L_g`, each with its own SGD: the head at the round's learning rate with weight
//! decay, the generator and discriminator at `adversarial_lr_ratio` times it (the paper's
//! `lr_g = lr_d`, 5–50× `lr_f`), all with the round's momentum.

use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::log_softmax;
use fedge_models::adversarial::{NOISE, one_hot};
use fedge_models::{Discriminator, Generator, Head};
use fedge_wire::{Objective, TrainParams};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::sgd::{batch_tensors, sgd};
use crate::features::FeatureSet;
use fedge_wire::StableSchedule;

pub mod weights;

pub use weights::{Memory, sample_weights};

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

/// The batches of one round: how many, and how many of the first are not adversarial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Batches in the round.
    pub batches: usize,
    /// The first `warmup` batches train on `L_S` alone (`E0`).
    pub warmup: usize,
}

impl Schedule {
    /// The schedule of `params` for `samples` training rows.
    pub fn new(params: &TrainParams, samples: usize) -> Self {
        let warmup = params.warmup_batches as usize;
        let least = warmup + params.adversarial_batches as usize;
        let per_epoch = samples.div_ceil(params.batch_size.max(1) as usize);
        match params.stable_schedule {
            StableSchedule::Paper => Self {
                batches: least,
                warmup,
            },
            StableSchedule::Epochs => Self {
                batches: (per_epoch * params.local_epochs as usize).max(least),
                warmup,
            },
            StableSchedule::EpochPhases => Self {
                batches: per_epoch * least,
                warmup: per_epoch * warmup,
            },
        }
    }

    /// Whether batch `b` (from 0) is adversarial.
    pub fn adversarial(&self, b: usize) -> bool {
        b >= self.warmup
    }
}

/// The head's loss on a batch: `L_S = Σ_i w_i CE_i` alone, or with the discriminator's output on
/// the batch's real features, `λ0 L_f + λ1 L_S` (the paper's convex combination as it stands:
/// dividing by `λ1`, so that the task loss keeps the round's learning rate, was tried and
/// collapsed the features to chance accuracy on digits-bg).
pub fn head_loss(
    ce: Tensor<1>,
    weights: Tensor<1>,
    d_real: Option<Tensor<1>>,
    params: &TrainParams,
) -> Tensor<1> {
    let weighted = (ce * weights).sum();
    match d_real {
        Some(d_real) => {
            extractor_loss(d_real).mul_scalar(params.adversarial_weight)
                + weighted.mul_scalar(params.stable_weight)
        }
        None => weighted,
    }
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
    let adversarial_lr = lr * f64::from(params.adversarial_lr_ratio);
    let mut head_optim = sgd(params, true).init();
    let mut generator_optim = sgd(params, false).init();
    let mut discriminator_optim = sgd(params, false).init();
    let batch = params.batch_size.max(1) as usize;
    let per_epoch = data.len().div_ceil(batch);
    let schedule = Schedule::new(params, data.len());
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut batches = Vec::with_capacity(schedule.batches);
    while batches.len() < schedule.batches {
        order.shuffle(rng);
        batches.extend(order.chunks(batch).map(<[usize]>::to_vec));
    }
    batches.truncate(schedule.batches);
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
        let memory = memory.get_or_insert_with(|| Memory::new(hidden));
        if memory.dims != hidden {
            *memory = Memory::new(hidden);
        }
        let weights = if params.objective == Objective::StableFedAdg {
            let learned = sample_weights(&z_values, hidden, Some(memory), rng);
            memory.fold(&z_values, &learned.logits);
            learned.weights
        } else {
            vec![1.0 / n as f32; n]
        };
        let w = Tensor::<1>::from_data(TensorData::new(weights, [n]), device);
        let adversarial = schedule.adversarial(b);
        let labels_1h = one_hot(&labels, classes, device);
        let d_real = adversarial.then(|| discriminator.forward(z.clone(), labels_1h.clone()));
        let loss = head_loss(ce.clone(), w.clone(), d_real, params);
        recent.push(values((ce * w).sum().detach())[0]);
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
            discriminator = discriminator_optim.step(adversarial_lr, discriminator, grads);
            let d_fake =
                discriminator.forward(generator.forward(noise, labels_1h.clone()), labels_1h);
            let grads = GradientsParams::from_grads(generator_loss(d_fake).backward(), &generator);
            generator = generator_optim.step(adversarial_lr, generator, grads);
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
mod tests;
