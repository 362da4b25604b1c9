//! The pieces every objective's loop shares: SGD with PyTorch semantics (momentum buffer starts
//! at the first gradient, no dampening, weight decay added to the gradient before momentum),
//! a batch of cached features as tensors, FedProx's proximal term and reading a scalar back.
//!
//! Nothing here knows which objective runs; the objectives and the gradient loop call in.

use burn::optim::SgdConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::prelude::*;
use burn::tensor::TensorData;
use fedge_models::Head;
use fedge_wire::TrainParams;

use crate::features::FeatureSet;

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
pub(crate) fn proximal_term(head: &Head, anchor: &Head) -> Tensor<1> {
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
    if let (Some(t), Some(a)) = (&head.tail, &anchor.tail) {
        let sq4 = |a: Tensor<4>, b: Tensor<4>| (a - b.detach()).powi_scalar(2).sum();
        total = total + sq4(t.weight.val(), a.weight.val()) + sq1(t.bias.val(), a.bias.val());
    }
    total
}

/// The single value of a one-element tensor (NaN when it cannot be read).
pub(crate) fn scalar(t: Tensor<1>) -> f32 {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .ok()
        .and_then(|v| v.first().copied())
        .unwrap_or(f32::NAN)
}
