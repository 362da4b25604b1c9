//! Local training of the head on cached backbone features (ALGORITHMS.md §1).
//!
//! SGD with PyTorch semantics (momentum buffer starts at the first gradient, no dampening,
//! weight decay added to the gradient before momentum), mean cross-entropy, and the optional
//! FedProx term `mu/2 · ‖θ − θ_g‖²`. A fresh optimiser is created for every round, as Flower
//! clients do: momentum does not carry over between rounds.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use fedge_models::{FlatLayoutError, Head, HeadConfig};
use fedge_wire::{Objective, TrainParams};
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
    check_inputs(config, data, params)?;
    let mut head = config.from_flat(global, device)?;
    let anchor = match params.objective {
        Objective::FedProx if params.prox_mu > 0.0 => Some(config.from_flat(global, device)?),
        _ => None,
    };
    let mut sgd =
        SgdConfig::new().with_momentum((params.momentum > 0.0).then_some(MomentumConfig {
            momentum: params.momentum as f64,
            dampening: 0.0,
            nesterov: false,
        }));
    if params.weight_decay > 0.0 {
        sgd = sgd.with_weight_decay(Some(WeightDecayConfig::new(params.weight_decay)));
    }
    let mut optim = sgd.init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..data.len()).collect();
    let batch = params.batch_size as usize;
    let (mut steps, mut last_epoch_loss) = (0, 0.0);
    let mut x = Vec::with_capacity(batch * data.dim);
    for _ in 0..params.local_epochs {
        order.shuffle(&mut rng);
        let mut epoch_loss = None::<Tensor<1>>;
        for idx in order.chunks(batch) {
            x.clear();
            for &i in idx {
                x.extend_from_slice(&data.features[i * data.dim..(i + 1) * data.dim]);
            }
            let y: Vec<i64> = idx.iter().map(|&i| data.labels[i] as i64).collect();
            let inputs =
                Tensor::<2>::from_data(TensorData::new(x.clone(), [idx.len(), data.dim]), device);
            let targets = Tensor::<1, Int>::from_data(TensorData::new(y, [idx.len()]), device);
            let mut loss = loss_fn.forward(head.forward(inputs), targets);
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
    let params_out = head.to_flat();
    let delta = params_out.iter().zip(global).map(|(a, b)| a - b).collect();
    Ok(TrainOutcome {
        params: params_out,
        delta,
        last_epoch_loss,
        steps,
    })
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
    let finite = [p.learning_rate, p.momentum, p.weight_decay, p.prox_mu]
        .iter()
        .all(|v| v.is_finite());
    if !finite
        || p.batch_size == 0
        || p.learning_rate <= 0.0
        || !(0.0..1.0).contains(&p.momentum)
        || p.weight_decay < 0.0
        || p.prox_mu < 0.0
    {
        return Err(TrainError::Params(format!(
            "need batch_size > 0, learning_rate > 0, 0 <= momentum < 1, weight_decay >= 0, prox_mu >= 0; got {p:?}"
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
