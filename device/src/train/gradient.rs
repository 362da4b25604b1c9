//! The gradient loop of cross-entropy, FedProx, FedDIM and FedDDL (docs/algorithms.md §1, §3, §4):
//! one fresh SGD per round, shuffled batches per local epoch, the objective's extra terms
//! added to the batch loss.
//!
//! It does not check its inputs (the dispatch in `crate::train` does) and does not run
//! Stable-FedADG, whose schedule lives in `crate::train::stable`.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use fedge_models::Head;
use fedge_wire::Objective;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::error::TrainError;
use super::fedddl::{DdlViews, GlobalPrototypes, contrastive_loss};
use super::feddim::{GlobalInsight, insight_term};
use super::job::TrainJob;
use super::parallel;
use super::sgd::{batch_tensors, proximal_term, scalar, sgd};

/// A gradient round of cross-entropy, FedProx, FedDIM or FedDDL.
pub(crate) fn gradient_round(
    job: &TrainJob,
    views: Option<&DdlViews>,
    rng: &mut StdRng,
) -> Result<(Head, f32, usize), TrainError> {
    let (config, global, data, params) = (job.head, job.global, job.data, job.params);
    let (inputs, device) = (job.inputs, job.device);
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
            Some(GlobalPrototypes::new(values, h, k, device))
        }
        _ => None,
    };
    let mut head = job.head_from(global)?;
    let anchor = match params.objective {
        Objective::FedProx if params.prox_mu > 0.0 => Some(job.head_from(global)?),
        _ => None,
    };
    // This round's counterfactuals, one of each row's draws.
    let counterfactual = views.map(|v| v.draw(rng));
    let mut optim = sgd(params, true).init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut order: Vec<usize> = (0..data.len()).collect();
    let batch = params.batch_size as usize;
    // A batch of cross-entropy (and FedProx) big enough is split across threads.
    let loss_of = |head: &Head, rows: &[usize]| {
        let (inputs, targets, _) = batch_tensors(data, rows, device);
        let loss = CrossEntropyLossConfig::new()
            .init(device)
            .forward(head.forward(inputs), targets);
        match &anchor {
            Some(anchor) => loss + proximal_term(head, anchor).mul_scalar(params.prox_mu / 2.0),
            None => loss,
        }
    };
    let extra = match (&insight, &counterfactual) {
        (None, None) => parallel::shards(batch, config.features, h, job.threads) - 1,
        _ => 0,
    };
    parallel::with_workers(extra, &loss_of, |workers| {
        let (mut steps, mut last_epoch_loss) = (0, 0.0);
        for _ in 0..params.local_epochs {
            order.shuffle(rng);
            let mut epoch_loss = None::<Tensor<1>>;
            for idx in order.chunks(batch) {
                if job.cancelled() {
                    return Err(TrainError::Cancelled(steps));
                }
                let shards = match workers.len() {
                    0 => 1,
                    n => parallel::shards(idx.len(), config.features, h, n + 1),
                };
                if shards > 1 {
                    // Cross-entropy (and FedProx's term) on the batch's rows split across threads.
                    let (grads, loss) = workers.gradients(&head, idx, shards, device, &loss_of);
                    let weighted = loss.mul_scalar(idx.len() as f32);
                    epoch_loss = Some(match epoch_loss {
                        Some(sum) => sum + weighted,
                        None => weighted,
                    });
                    head = optim.step(params.learning_rate as f64, head, grads);
                    steps += 1;
                    continue;
                }
                let (inputs, targets, labels) = batch_tensors(data, idx, device);
                let mut loss = match (&insight, &counterfactual) {
                    (Some(insight), _) => {
                        let z = head.features(inputs);
                        let ce =
                            loss_fn.forward(head.classifier.forward(z.clone()), targets.clone());
                        let w = head.classifier.weight.val();
                        let term = insight_term(w, z, targets, &labels, insight);
                        ce + term.mul_scalar(params.insight_lambda)
                    }
                    (None, Some(counterfactual)) => {
                        // L_J = CE(real) + CE(counterfactual): the mean over both halves, doubled;
                        // without counterfactual draws (DEB alone), CE over the real rows.
                        let (z, targets, rows, halves) = if counterfactual.is_empty() {
                            (head.features(inputs), targets, labels, 1.0)
                        } else {
                            let (cf, _, _) = batch_tensors(counterfactual, idx, device);
                            let both: Vec<u32> = labels.iter().chain(&labels).copied().collect();
                            let z = head.features(Tensor::cat(vec![inputs, cf], 0));
                            (z, Tensor::cat(vec![targets.clone(), targets], 0), both, 2.0)
                        };
                        let logits = head.classifier.forward(z.clone());
                        let mut loss = loss_fn.forward(logits, targets.clone()).mul_scalar(halves);
                        if let Some(u) = &prototypes {
                            let cr = contrastive_loss(z, u, targets, &rows, params.temperature);
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
    })
}
