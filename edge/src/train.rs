//! Local training of the head on cached backbone features (ALGORITHMS.md §1, §3–5).
//!
//! SGD with PyTorch semantics (momentum buffer starts at the first gradient, no dampening,
//! weight decay added to the gradient before momentum), mean cross-entropy, and per objective:
//! FedProx's `mu/2 · ‖θ − θ_g‖²`, FedDIM's insight term ([`crate::feddim`]), FedDDL's
//! counterfactual cross-entropy and contrastive regulariser ([`crate::fedddl`]), or
//! Stable-FedADG's own schedule ([`crate::stable`]). A fresh optimiser is created for every
//! round, as Flower clients do: momentum does not carry over between rounds.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use fedge_models::{
    AdversarialConfig, AdversarialModules, FlatLayoutError, Head, HeadConfig, HeadModules,
    ModelLayout,
};
use fedge_wire::{Objective, TrainParams};

use crate::fedddl::{DdlViews, contrastive_loss};
use crate::feddim::{GlobalInsight, class_stats, insight_term};
use crate::stable::{Memory, StableModules};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Features and labels of one local split, features already computed by the backbone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeatureSet {
    /// Feature size `F`.
    pub dim: usize,
    /// `len × F` values, row-major.
    pub features: Vec<f32>,
    /// Class of each row.
    pub labels: Vec<u32>,
}

impl FeatureSet {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows `indices`, in that order.
    ///
    /// # Panics
    ///
    /// Panics if an index is out of range.
    pub fn rows(&self, indices: &[usize]) -> FeatureSet {
        let mut out = FeatureSet {
            dim: self.dim,
            features: Vec::with_capacity(indices.len() * self.dim),
            labels: Vec::with_capacity(indices.len()),
        };
        for &i in indices {
            out.features
                .extend_from_slice(&self.features[i * self.dim..(i + 1) * self.dim]);
            out.labels.push(self.labels[i]);
        }
        out
    }
}

/// Why local training could not run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The global parameters do not fit the head.
    #[error(transparent)]
    Layout(#[from] FlatLayoutError),
    /// Feature size differs from the head's input.
    #[error("features have size {got}, the head expects {expected}")]
    FeatureSize {
        /// Head input size.
        expected: usize,
        /// Size found.
        got: usize,
    },
    /// A label outside the head's classes.
    #[error("label {label} is out of range for {classes} classes")]
    Label {
        /// The label.
        label: u32,
        /// Number of classes.
        classes: usize,
    },
    /// Nothing to train on.
    #[error("no training samples")]
    Empty,
    /// Hyper-parameters that make no sense.
    #[error("invalid training parameters: {0}")]
    Params(String),
    /// Training diverged.
    #[error("training diverged (loss {0})")]
    Diverged(f32),
}

/// The result of one local round.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutcome {
    /// Parameters after training, flat layout.
    pub params: Vec<f32>,
    /// `params − global`.
    pub delta: Vec<f32>,
    /// Mean training loss over the last epoch.
    pub last_epoch_loss: f32,
    /// Optimiser steps taken.
    pub steps: usize,
    /// FedDIM's class counts and class-mean projector features `[K, H]` of the final head,
    /// when the objective is `FedDim`.
    pub class_stats: Option<(Vec<u32>, Vec<f32>)>,
    /// FedDDL's local causal prototypes: class counts and class means `[K, H]` of the
    /// object-only features under the global head, when the objective is `FedDdl`.
    pub prototypes: Option<(Vec<u32>, Vec<f32>)>,
}

/// What a round task brings besides the parameters, and the device's extra views of its data.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundInputs<'a> {
    /// FedDIM's global insight matrices `[K, H, K]` (none in the first round).
    pub insight: Option<&'a [f32]>,
    /// FedDDL's global causal prototypes `[K, H]` (none in the first round).
    pub prototypes: Option<&'a [f32]>,
    /// FedDDL's counterfactual and object-only features, row for row with the training data.
    pub views: Option<&'a DdlViews>,
}

/// What a device keeps from round to round: Stable-FedADG's discriminator and memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalState {
    /// The discriminator in its flat layout (never sent).
    pub discriminator: Option<Vec<f32>>,
    /// Stable learning's saved features and weights.
    pub memory: Option<Memory>,
}

/// Trains the head starting from `global` on `data`; deterministic for a given `seed`.
pub fn train_head(
    config: &HeadConfig,
    global: &[f32],
    data: &FeatureSet,
    params: &TrainParams,
    seed: u64,
    device: &Device,
) -> Result<TrainOutcome, TrainError> {
    train_head_with(config, global, data, params, None, seed, device)
}

/// [`train_head`] with FedDIM's global insight matrices `[K, H, K]` from the round task; the
/// insight term is added when the objective is `FedDim` and `insight` is given (none in the
/// first round).
pub fn train_head_with(
    config: &HeadConfig,
    global: &[f32],
    data: &FeatureSet,
    params: &TrainParams,
    insight: Option<&[f32]>,
    seed: u64,
    device: &Device,
) -> Result<TrainOutcome, TrainError> {
    let inputs = RoundInputs {
        insight,
        ..RoundInputs::default()
    };
    let mut state = LocalState::default();
    train_local(
        config, global, data, params, &inputs, &mut state, seed, device,
    )
}

/// One local round of any objective. `global` is the task's flat vector (the head, then the
/// generator for Stable-FedADG, see [`ModelLayout`]); `state` is what the device keeps between
/// rounds; deterministic for a given `seed` and `state`.
#[allow(clippy::too_many_arguments)]
pub fn train_local(
    config: &HeadConfig,
    global: &[f32],
    data: &FeatureSet,
    params: &TrainParams,
    inputs: &RoundInputs,
    state: &mut LocalState,
    seed: u64,
    device: &Device,
) -> Result<TrainOutcome, TrainError> {
    check_inputs(config, data, params)?;
    let layout = ModelLayout::new(config.clone(), params.objective.carries_generator());
    if global.len() != layout.num_params() {
        return Err(FlatLayoutError {
            expected: layout.num_params(),
            got: global.len(),
        }
        .into());
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let (params_out, last_epoch_loss, steps, prototypes) = match params.objective {
        Objective::StableFedAdg => {
            let (loss, steps, flat) = stable(
                config, &layout, global, data, params, state, &mut rng, device,
            )?;
            (flat, loss, steps, None)
        }
        _ => {
            let views = match (params.objective, inputs.views) {
                (Objective::FedDdl, Some(views)) => Some(views.checked(data)?),
                (Objective::FedDdl, None) => {
                    return Err(TrainError::Params(
                        "FedDDL needs counterfactual and object-only features; give the data \
                         object masks (built-in data sets) or boxes (boxes.csv)"
                            .into(),
                    ));
                }
                _ => None,
            };
            // Local prototypes come from the round's global head, before training.
            let prototypes = views.map(|v| {
                let global_head = config.from_flat(global, device);
                global_head.map(|head| class_stats(&head, config.classes, &v.objects, device))
            });
            let prototypes = prototypes.transpose()?;
            let (head, loss, steps) = gradient_round(
                config, global, data, params, inputs, views, &mut rng, device,
            )?;
            (head.to_flat(), loss, steps, prototypes)
        }
    };
    if !last_epoch_loss.is_finite() {
        return Err(TrainError::Diverged(last_epoch_loss));
    }
    let delta = params_out.iter().zip(global).map(|(a, b)| a - b).collect();
    let class_stats = (params.objective == Objective::FedDim).then(|| {
        let head = config.from_flat(layout.head_part(&params_out), device);
        head.map(|head| class_stats(&head, config.classes, data, device))
    });
    Ok(TrainOutcome {
        params: params_out,
        delta,
        last_epoch_loss,
        steps,
        class_stats: class_stats.transpose()?,
        prototypes,
    })
}

/// Stable-FedADG's round: the head and generator from `global`, the discriminator from `state`
/// (a seeded one the first time). Returns the loss, the steps and the trained flat vector.
#[allow(clippy::too_many_arguments)]
fn stable(
    config: &HeadConfig,
    layout: &ModelLayout,
    global: &[f32],
    data: &FeatureSet,
    params: &TrainParams,
    state: &mut LocalState,
    rng: &mut StdRng,
    device: &Device,
) -> Result<(f32, usize, Vec<f32>), TrainError> {
    let adversarial = AdversarialConfig::for_head(config);
    let disc_flat = match state.discriminator.take() {
        Some(d) if d.len() == adversarial.discriminator_params() => d,
        _ => adversarial.init_discriminator(rand::Rng::random(rng)),
    };
    let modules = StableModules {
        head: config.from_flat(layout.head_part(global), device)?,
        generator: adversarial.generator(layout.generator_part(global), device)?,
        discriminator: adversarial.discriminator(&disc_flat, device)?,
    };
    let round = crate::stable::train_round(
        modules,
        data,
        config.classes,
        params,
        &mut state.memory,
        rng,
        device,
    );
    state.discriminator = Some(round.discriminator.to_flat());
    let mut flat = round.head.to_flat();
    flat.extend(round.generator.to_flat());
    Ok((round.loss, round.steps, flat))
}

/// A gradient round of cross-entropy, FedProx, FedDIM or FedDDL.
#[allow(clippy::too_many_arguments)]
fn gradient_round(
    config: &HeadConfig,
    global: &[f32],
    data: &FeatureSet,
    params: &TrainParams,
    inputs: &RoundInputs,
    views: Option<&DdlViews>,
    rng: &mut StdRng,
    device: &Device,
) -> Result<(Head, f32, usize), TrainError> {
    let (h, k) = (config.hidden, config.classes);
    let insight = match (params.objective, inputs.insight) {
        (Objective::FedDim, Some(values)) if params.insight_lambda > 0.0 => {
            if values.len() != k * h * k || values.iter().any(|v| !v.is_finite()) {
                return Err(TrainError::Params(format!(
                    "insight matrices need {} finite values, got {}",
                    k * h * k,
                    values.len()
                )));
            }
            Some(GlobalInsight::new(values, h, k, device))
        }
        _ => None,
    };
    let prototypes = match (views, inputs.prototypes) {
        (Some(_), Some(values)) if params.contrastive_weight > 0.0 => {
            if values.len() != k * h || values.iter().any(|v| !v.is_finite()) {
                return Err(TrainError::Params(format!(
                    "prototypes need {} finite values, got {}",
                    k * h,
                    values.len()
                )));
            }
            Some(Tensor::<2>::from_data(
                TensorData::new(values.to_vec(), [k, h]),
                device,
            ))
        }
        _ => None,
    };
    let mut head = config.from_flat(global, device)?;
    let anchor = match params.objective {
        Objective::FedProx if params.prox_mu > 0.0 => Some(config.from_flat(global, device)?),
        _ => None,
    };
    let mut optim = sgd(params, true).init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut order: Vec<usize> = (0..data.len()).collect();
    let batch = params.batch_size as usize;
    let (mut steps, mut last_epoch_loss) = (0, 0.0);
    for _ in 0..params.local_epochs {
        order.shuffle(rng);
        let mut epoch_loss = None::<Tensor<1>>;
        for idx in order.chunks(batch) {
            let (inputs, targets, labels) = batch_tensors(data, idx, device);
            let mut loss = match (&insight, views) {
                (Some(insight), _) => {
                    let z = head.features(inputs);
                    let ce = loss_fn.forward(head.classifier.forward(z.clone()), targets.clone());
                    let w = head.classifier.weight.val();
                    let term = insight_term(w, z, targets, &labels, insight);
                    ce + term.mul_scalar(params.insight_lambda)
                }
                (None, Some(views)) => {
                    // L_J = CE(real) + CE(counterfactual): the mean over both halves, doubled.
                    let (cf, _, _) = batch_tensors(&views.counterfactual, idx, device);
                    let z = head.features(Tensor::cat(vec![inputs, cf], 0));
                    let targets = Tensor::cat(vec![targets.clone(), targets], 0);
                    let logits = head.classifier.forward(z.clone());
                    let mut loss = loss_fn.forward(logits, targets.clone()).mul_scalar(2.0);
                    if let Some(u) = &prototypes {
                        let cr = contrastive_loss(z, u.clone(), targets, params.temperature);
                        loss = loss + cr.mul_scalar(params.contrastive_weight);
                    }
                    loss
                }
                (None, None) => loss_fn.forward(head.forward(inputs), targets),
            };
            if let Some(anchor) = &anchor {
                loss = loss + proximal_term(&head, anchor).mul_scalar(params.prox_mu / 2.0);
            }
            let weighted = loss.clone().detach().mul_scalar(idx.len() as f32);
            epoch_loss = Some(match epoch_loss {
                Some(sum) => sum + weighted,
                None => weighted,
            });
            let grads = GradientsParams::from_grads(loss.backward(), &head);
            head = optim.step(params.learning_rate as f64, head, grads);
            steps += 1;
        }
        last_epoch_loss = epoch_loss
            .map(|t| scalar(t) / data.len() as f32)
            .unwrap_or(0.0);
        if !last_epoch_loss.is_finite() {
            return Err(TrainError::Diverged(last_epoch_loss));
        }
    }
    Ok((head, last_epoch_loss, steps))
}

/// The round's SGD: PyTorch semantics, momentum when set, weight decay when `decay` and set.
pub(crate) fn sgd(params: &TrainParams, decay: bool) -> SgdConfig {
    let mut sgd =
        SgdConfig::new().with_momentum((params.momentum > 0.0).then_some(MomentumConfig {
            momentum: params.momentum as f64,
            dampening: 0.0,
            nesterov: false,
        }));
    if decay && params.weight_decay > 0.0 {
        sgd = sgd.with_weight_decay(Some(WeightDecayConfig::new(params.weight_decay)));
    }
    sgd
}

/// The rows `idx` of `data` as inputs `[B, F]`, targets `[B]` and host labels.
pub(crate) fn batch_tensors(
    data: &FeatureSet,
    idx: &[usize],
    device: &Device,
) -> (Tensor<2>, Tensor<1, Int>, Vec<u32>) {
    let mut x = Vec::with_capacity(idx.len() * data.dim);
    for &i in idx {
        x.extend_from_slice(&data.features[i * data.dim..(i + 1) * data.dim]);
    }
    let labels: Vec<u32> = idx.iter().map(|&i| data.labels[i]).collect();
    let y: Vec<i64> = labels.iter().map(|&l| i64::from(l)).collect();
    let inputs = Tensor::<2>::from_data(TensorData::new(x, [idx.len(), data.dim]), device);
    let targets = Tensor::<1, Int>::from_data(TensorData::new(y, [idx.len()]), device);
    (inputs, targets, labels)
}

/// `‖θ − θ_anchor‖²` over all head parameters; the anchor carries no gradient.
fn proximal_term(head: &Head, anchor: &Head) -> Tensor<1> {
    let sq2 = |a: Tensor<2>, b: Tensor<2>| (a - b.detach()).powi_scalar(2).sum();
    let sq1 = |a: Tensor<1>, b: Tensor<1>| (a - b.detach()).powi_scalar(2).sum();
    let mut total = sq2(head.projector.weight.val(), anchor.projector.weight.val())
        + sq2(head.classifier.weight.val(), anchor.classifier.weight.val());
    for (b, a) in [
        (&head.projector.bias, &anchor.projector.bias),
        (&head.classifier.bias, &anchor.classifier.bias),
    ] {
        if let (Some(b), Some(a)) = (b, a) {
            total = total + sq1(b.val(), a.val());
        }
    }
    total
}

fn scalar(t: Tensor<1>) -> f32 {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .ok()
        .and_then(|v| v.first().copied())
        .unwrap_or(f32::NAN)
}

fn check_inputs(
    config: &HeadConfig,
    data: &FeatureSet,
    params: &TrainParams,
) -> Result<(), TrainError> {
    if data.is_empty() {
        return Err(TrainError::Empty);
    }
    if data.dim != config.features || data.features.len() != data.len() * data.dim {
        return Err(TrainError::FeatureSize {
            expected: config.features,
            got: data.dim,
        });
    }
    if let Some(&label) = data.labels.iter().find(|&&l| l as usize >= config.classes) {
        return Err(TrainError::Label {
            label,
            classes: config.classes,
        });
    }
    let p = params;
    let finite = [
        p.learning_rate,
        p.momentum,
        p.weight_decay,
        p.prox_mu,
        p.insight_lambda,
        p.adversarial_weight,
        p.stable_weight,
        p.contrastive_weight,
        p.temperature,
    ]
    .iter()
    .all(|v| v.is_finite());
    if !finite
        || p.batch_size == 0
        || p.learning_rate <= 0.0
        || !(0.0..1.0).contains(&p.momentum)
        || p.weight_decay < 0.0
        || p.prox_mu < 0.0
        || p.insight_lambda < 0.0
        || p.adversarial_weight < 0.0
        || p.stable_weight < 0.0
        || p.contrastive_weight < 0.0
        || p.temperature <= 0.0
    {
        return Err(TrainError::Params(format!(
            "need batch_size > 0, learning_rate > 0, 0 <= momentum < 1, temperature > 0 and \
             every other weight >= 0; got {p:?}"
        )));
    }
    Ok(())
}

/// Accuracy of the head `flat` on `data` (0 for an empty set).
pub fn accuracy(
    config: &HeadConfig,
    flat: &[f32],
    data: &FeatureSet,
) -> Result<f32, FlatLayoutError> {
    if data.is_empty() {
        return Ok(0.0);
    }
    let predicted = fedge_models::head::predict_flat(config, flat, &data.features)?;
    let correct = predicted
        .iter()
        .zip(&data.labels)
        .filter(|(p, y)| **p == **y as usize)
        .count();
    Ok(correct as f32 / data.len() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_models::{Backend, training_device};

    /// Mean cross-entropy of the head `flat` on `data`, in f64, written out by hand.
    fn loss(config: &HeadConfig, flat: &[f64], data: &FeatureSet) -> f64 {
        let (f, h, k) = (config.features, config.hidden, config.classes);
        let (w1, rest) = flat.split_at(f * h);
        let (b1, rest) = rest.split_at(h);
        let (w, b) = rest.split_at(h * k);
        let mut total = 0.0;
        for (x, &y) in data.features.chunks(f).zip(&data.labels) {
            let z: Vec<f64> = (0..h)
                .map(|j| {
                    (b1[j] + (0..f).map(|i| x[i] as f64 * w1[i * h + j]).sum::<f64>()).max(0.0)
                })
                .collect();
            let o: Vec<f64> = (0..k)
                .map(|c| b[c] + (0..h).map(|j| z[j] * w[j * k + c]).sum::<f64>())
                .collect();
            let max = o.iter().cloned().fold(f64::MIN, f64::max);
            let lse = max + o.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            total += lse - o[y as usize];
        }
        total / data.len() as f64
    }

    /// Central-difference gradient of [`loss`].
    fn grad(config: &HeadConfig, flat: &[f64], data: &FeatureSet) -> Vec<f64> {
        let eps = 1e-6;
        (0..flat.len())
            .map(|i| {
                let (mut up, mut down) = (flat.to_vec(), flat.to_vec());
                up[i] += eps;
                down[i] -= eps;
                (loss(config, &up, data) - loss(config, &down, data)) / (2.0 * eps)
            })
            .collect()
    }

    fn tiny() -> (HeadConfig, Vec<f32>, FeatureSet) {
        let config = HeadConfig::new(3, 2).with_hidden(2);
        // Pre-activations stay far from the ReLU kink, so finite differences are exact enough.
        let global = vec![
            0.5, -0.3, 0.8, 0.4, -0.2, 0.6, 0.3, 0.2, 0.7, -0.5, -0.4, 0.9, 0.1, -0.1,
        ];
        let data = FeatureSet {
            dim: 3,
            features: vec![1.0, 0.5, 2.0, 1.0, 0.5, 2.0],
            labels: vec![1, 1],
        };
        (config, global, data)
    }

    /// Cross-entropy plus λ times FedDIM's insight term, with every per-sample `H×K` insight
    /// matrix written out (no expansion), in f64.
    fn feddim_loss(
        config: &HeadConfig,
        flat: &[f64],
        data: &FeatureSet,
        insight: &[f64],
        lambda: f64,
    ) -> f64 {
        let (f, h, k) = (config.features, config.hidden, config.classes);
        let w = &flat[f * h + h..f * h + h + h * k];
        let mut total = 0.0;
        for (x, &y) in data.features.chunks(f).zip(&data.labels) {
            let z: Vec<f64> = (0..h)
                .map(|j| {
                    (flat[f * h + j] + (0..f).map(|i| x[i] as f64 * flat[i * h + j]).sum::<f64>())
                        .max(0.0)
                })
                .collect();
            let target = &insight[y as usize * h * k..(y as usize + 1) * h * k];
            let mut matrix = vec![0.0; h * k];
            for j in 0..h {
                for c in 0..k {
                    matrix[j * k + c] = w[j * k + c] * z[j];
                }
            }
            total += matrix
                .iter()
                .zip(target)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>();
        }
        loss(config, flat, data) + lambda * total / data.len() as f64
    }

    #[test]
    fn feddim_loss_and_gradient_match_a_direct_computation() {
        let config = HeadConfig::new(3, 3).with_hidden(2);
        let global: Vec<f32> = vec![
            0.5, -0.3, 0.8, 0.4, -0.2, 0.6, 0.3, 0.2, // W1 [3, 2], b1 [2]
            0.7, -0.5, 0.2, -0.4, 0.9, 0.3, // W [2, 3]
            0.1, -0.1, 0.05, // b [3]
        ];
        let data = FeatureSet {
            dim: 3,
            features: vec![1.0, 0.5, 2.0, 0.3, 1.5, 1.0, 2.0, 0.2, 0.9],
            labels: vec![1, 0, 2],
        };
        let insight: Vec<f32> = (0..3 * 2 * 3)
            .map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.4)
            .collect();
        let lambda = 0.7;
        // One full-batch SGD step without momentum or decay: θ' = θ − lr·∇L.
        let params = TrainParams {
            objective: Objective::FedDim,
            insight_lambda: lambda,
            local_epochs: 1,
            batch_size: 3,
            learning_rate: 1e-3,
            momentum: 0.0,
            weight_decay: 0.0,
            ..TrainParams::default()
        };
        let device = training_device(Backend::Flex);
        let out =
            train_head_with(&config, &global, &data, &params, Some(&insight), 0, &device).unwrap();
        let theta: Vec<f64> = global.iter().map(|v| *v as f64).collect();
        let ibar: Vec<f64> = insight.iter().map(|v| *v as f64).collect();
        let direct = feddim_loss(&config, &theta, &data, &ibar, lambda as f64);
        assert!(
            (out.last_epoch_loss as f64 - direct).abs() < 1e-5 * direct,
            "{} vs {direct}",
            out.last_epoch_loss
        );
        let eps = 1e-6;
        for i in 0..theta.len() {
            let (mut up, mut down) = (theta.clone(), theta.clone());
            up[i] += eps;
            down[i] -= eps;
            let numeric = (feddim_loss(&config, &up, &data, &ibar, lambda as f64)
                - feddim_loss(&config, &down, &data, &ibar, lambda as f64))
                / (2.0 * eps);
            let burn = (global[i] - out.params[i]) as f64 / 1e-3;
            assert!(
                (burn - numeric).abs() < 2e-3 * numeric.abs().max(1.0),
                "∂θ{i}: {burn} vs {numeric}"
            );
        }
        // The class statistics describe the trained head: counts per class, finite means.
        let (counts, means) = out.class_stats.unwrap();
        assert_eq!(counts, vec![1, 1, 1]);
        assert_eq!(means.len(), 3 * 2);
        // Without Ī (first round) the objective is plain cross-entropy.
        let first = train_head_with(&config, &global, &data, &params, None, 0, &device).unwrap();
        let ce = loss(&config, &theta, &data);
        assert!((first.last_epoch_loss as f64 - ce).abs() < 1e-5 * ce);
        let short = train_head_with(
            &config,
            &global,
            &data,
            &params,
            Some(&insight[1..]),
            0,
            &device,
        );
        assert!(matches!(short, Err(TrainError::Params(_))));
    }

    #[test]
    fn two_sgd_steps_follow_pytorch_momentum_and_weight_decay() {
        let (config, global, data) = tiny();
        let params = TrainParams {
            local_epochs: 1,
            batch_size: 1,
            learning_rate: 0.1,
            momentum: 0.9,
            weight_decay: 0.01,
            ..TrainParams::default()
        };
        let device = training_device(Backend::Flex);
        let out = train_head(&config, &global, &data, &params, 3, &device).unwrap();
        assert_eq!(out.steps, 2);
        // By hand: d = g + wd·θ; buf = d on the first step, then buf = 0.9·buf + d; θ -= lr·buf.
        let one = FeatureSet {
            dim: 3,
            features: data.features[..3].to_vec(),
            labels: vec![1],
        };
        let mut theta: Vec<f64> = global.iter().map(|v| *v as f64).collect();
        let mut buf = vec![0.0; theta.len()];
        for step in 0..2 {
            let g = grad(&config, &theta, &one);
            for i in 0..theta.len() {
                let d = g[i] + 0.01 * theta[i];
                buf[i] = if step == 0 { d } else { 0.9 * buf[i] + d };
                theta[i] -= 0.1 * buf[i];
            }
        }
        for (got, want) in out.params.iter().zip(&theta) {
            assert!((*got as f64 - want).abs() < 1e-4, "got {got}, want {want}");
        }
        for ((d, p), g) in out.delta.iter().zip(&out.params).zip(&global) {
            assert!((d - (p - g)).abs() < 1e-7);
        }
    }

    #[test]
    fn fedprox_keeps_the_local_head_closer_to_the_global_one() {
        let (config, global, data) = tiny();
        let device = training_device(Backend::Flex);
        let ce = TrainParams {
            local_epochs: 20,
            batch_size: 2,
            learning_rate: 0.1,
            ..TrainParams::default()
        };
        let prox = TrainParams {
            objective: Objective::FedProx,
            prox_mu: 5.0,
            ..ce.clone()
        };
        let norm = |d: &[f32]| d.iter().map(|v| v * v).sum::<f32>().sqrt();
        let free = train_head(&config, &global, &data, &ce, 0, &device).unwrap();
        let held = train_head(&config, &global, &data, &prox, 0, &device).unwrap();
        assert!(
            norm(&held.delta) < 0.5 * norm(&free.delta),
            "{} vs {}",
            norm(&held.delta),
            norm(&free.delta)
        );
        assert!(held.last_epoch_loss.is_finite());
    }

    #[test]
    fn training_learns_separable_data_and_is_deterministic_for_a_seed() {
        let config = HeadConfig::new(4, 2).with_hidden(8);
        let features: Vec<f32> = (0..64)
            .flat_map(|i| {
                if i % 2 == 0 {
                    [1.0, 0.2, 0.0, 0.1]
                } else {
                    [0.0, 0.1, 1.0, 0.3]
                }
            })
            .collect();
        let labels: Vec<u32> = (0..64).map(|i| i % 2).collect();
        let data = FeatureSet {
            dim: 4,
            features,
            labels,
        };
        let global = config.init_flat(5);
        let params = TrainParams {
            local_epochs: 5,
            batch_size: 8,
            learning_rate: 0.1,
            ..TrainParams::default()
        };
        let device = training_device(Backend::Flex);
        let a = train_head(&config, &global, &data, &params, 1, &device).unwrap();
        let b = train_head(&config, &global, &data, &params, 1, &device).unwrap();
        assert_eq!(a, b);
        assert_eq!(accuracy(&config, &a.params, &data).unwrap(), 1.0);
        assert!(a.last_epoch_loss < 0.3, "{}", a.last_epoch_loss);
    }

    /// Two classes in 4 features, 40 samples: class 0 near (1, 0, ·, ·), class 1 near (0, 1, ·, ·).
    fn two_blobs() -> FeatureSet {
        let features = (0..40)
            .flat_map(|i| {
                let wobble = (i % 7) as f32 * 0.05;
                if i % 2 == 0 {
                    [1.0 + wobble, 0.1, wobble, 0.3]
                } else {
                    [0.1, 1.0 - wobble, 0.2, wobble]
                }
            })
            .collect();
        FeatureSet {
            dim: 4,
            features,
            labels: (0..40).map(|i| i % 2).collect(),
        }
    }

    #[test]
    fn stable_fedadg_trains_head_and_generator_and_keeps_the_discriminator() {
        let config = HeadConfig::new(4, 2).with_hidden(8);
        let layout = ModelLayout::new(config.clone(), true);
        let global = layout.init_flat(3);
        let data = two_blobs();
        let params = TrainParams {
            objective: Objective::StableFedAdg,
            local_epochs: 3,
            batch_size: 8,
            learning_rate: 0.1,
            ..TrainParams::default()
        };
        let device = training_device(Backend::Flex);
        let mut state = LocalState::default();
        let inputs = RoundInputs::default();
        let first = train_local(
            &config, &global, &data, &params, &inputs, &mut state, 1, &device,
        )
        .unwrap();
        assert_eq!(first.delta.len(), layout.num_params());
        assert_eq!(
            first.steps, 15,
            "3 epochs of 5 batches (more than E0 + E1 = 8)"
        );
        let moved = |part: &[f32]| part.iter().map(|d| d * d).sum::<f32>().sqrt();
        assert!(moved(layout.head_part(&first.delta)) > 0.0);
        assert!(moved(layout.generator_part(&first.delta)) > 0.0, "G trains");
        let disc = state.discriminator.clone().expect("D kept on the device");
        let adversarial = AdversarialConfig::for_head(&config);
        assert_eq!(disc.len(), adversarial.discriminator_params());
        assert!(
            state
                .memory
                .as_ref()
                .is_some_and(|m| m.weights.len() == 128)
        );
        // The next round continues from the kept discriminator and changes it again.
        let second = train_local(
            &config,
            &first.params,
            &data,
            &params,
            &inputs,
            &mut state,
            2,
            &device,
        )
        .unwrap();
        assert_ne!(state.discriminator.as_ref(), Some(&disc));
        assert!(accuracy(&config, layout.head_part(&second.params), &data).unwrap() > 0.9);
        // A vector without the generator does not fit a Stable-FedADG round.
        let short = train_local(
            &config,
            &global[..config.num_params()],
            &data,
            &params,
            &inputs,
            &mut LocalState::default(),
            1,
            &device,
        );
        assert!(matches!(short, Err(TrainError::Layout(_))));
    }

    #[test]
    fn fedddl_sends_object_prototypes_of_the_global_head_and_uses_the_global_ones() {
        let config = HeadConfig::new(4, 2).with_hidden(8);
        let global = config.init_flat(4);
        let data = two_blobs();
        // Object-only features: the informative half; counterfactuals: objects on another
        // "background" (the last two features swapped between classes).
        let objects = FeatureSet {
            features: data
                .features
                .chunks(4)
                .flat_map(|r| [r[0], r[1], 0.0, 0.0])
                .collect(),
            ..data.clone()
        };
        let counterfactual = FeatureSet {
            features: data
                .features
                .chunks(4)
                .flat_map(|r| [r[0], r[1], r[3], r[2]])
                .collect(),
            ..data.clone()
        };
        let views = DdlViews {
            counterfactual,
            objects: objects.clone(),
        };
        let params = TrainParams {
            objective: Objective::FedDdl,
            local_epochs: 1,
            batch_size: 8,
            learning_rate: 0.05,
            ..TrainParams::default()
        };
        let device = training_device(Backend::Flex);
        let mut state = LocalState::default();
        let first_round = RoundInputs {
            views: Some(&views),
            ..RoundInputs::default()
        };
        let out = train_local(
            &config,
            &global,
            &data,
            &params,
            &first_round,
            &mut state,
            1,
            &device,
        )
        .unwrap();
        let head = config.from_flat(&global, &device).unwrap();
        let expected = class_stats(&head, 2, &objects, &device);
        assert_eq!(
            out.prototypes.as_ref(),
            Some(&expected),
            "under the global head"
        );
        assert!(out.class_stats.is_none());
        // L_J doubles the cross-entropy of the first batch at the start: the loss differs from
        // plain cross-entropy, and the global prototypes add L_CR on top.
        let ce = train_head(
            &config,
            &global,
            &data,
            &TrainParams {
                objective: Objective::CrossEntropy,
                ..params.clone()
            },
            1,
            &device,
        )
        .unwrap();
        assert!(
            out.last_epoch_loss > ce.last_epoch_loss * 1.5,
            "{} vs {}",
            out.last_epoch_loss,
            ce.last_epoch_loss
        );
        let u = expected.1.clone();
        let with_prototypes = RoundInputs {
            prototypes: Some(&u),
            ..first_round
        };
        let pulled = train_local(
            &config,
            &global,
            &data,
            &params,
            &with_prototypes,
            &mut state,
            1,
            &device,
        )
        .unwrap();
        assert!(
            pulled.last_epoch_loss > out.last_epoch_loss,
            "L_CR adds to the loss"
        );
        assert_eq!(
            pulled.prototypes, out.prototypes,
            "prototypes use the global head"
        );
        // Wrong prototype size, views that do not match, or no views: errors.
        let short = RoundInputs {
            prototypes: Some(&u[1..]),
            ..first_round
        };
        assert!(matches!(
            train_local(
                &config, &global, &data, &params, &short, &mut state, 1, &device
            ),
            Err(TrainError::Params(_))
        ));
        let fewer = views.rows(&[0, 1, 2]);
        let mismatched = RoundInputs {
            views: Some(&fewer),
            ..RoundInputs::default()
        };
        assert!(matches!(
            train_local(
                &config,
                &global,
                &data,
                &params,
                &mismatched,
                &mut state,
                1,
                &device
            ),
            Err(TrainError::Params(_))
        ));
        let err = train_local(
            &config,
            &global,
            &data,
            &params,
            &RoundInputs::default(),
            &mut state,
            1,
            &device,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("boxes.csv"), "{err}");
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let (config, global, data) = tiny();
        let device = training_device(Backend::Flex);
        let params = TrainParams::default();
        let bad_label = FeatureSet {
            labels: vec![1, 7],
            ..data.clone()
        };
        assert!(matches!(
            train_head(&config, &global, &bad_label, &params, 0, &device),
            Err(TrainError::Label { label: 7, .. })
        ));
        assert!(matches!(
            train_head(&config, &global[..3], &data, &params, 0, &device),
            Err(TrainError::Layout(_))
        ));
        assert!(matches!(
            train_head(
                &config,
                &global,
                &FeatureSet::default(),
                &params,
                0,
                &device
            ),
            Err(TrainError::Empty)
        ));
        let zero_batch = TrainParams {
            batch_size: 0,
            ..params
        };
        assert!(matches!(
            train_head(&config, &global, &data, &zero_batch, 0, &device),
            Err(TrainError::Params(_))
        ));
    }
}
