//! Local training of the head on cached backbone features (docs/algorithms.md §1, §3–5): the entry
//! points and the dispatch to the objectives.
//!
//! SGD with PyTorch semantics ([`sgd`]), mean cross-entropy, and per objective: FedProx's
//! `mu/2 · ‖θ − θ_g‖²`, FedDIM's insight term ([`feddim`]), FedDDL's counterfactual
//! cross-entropy and contrastive regulariser ([`fedddl`]), or Stable-FedADG's own schedule
//! ([`stable`]). A fresh optimiser is created for every round, as Flower clients do: momentum
//! does not carry over between rounds. The objectives depend on [`sgd`], [`error`] and
//! `crate::features`, never on this dispatch.

pub mod error;
pub mod fedddl;
pub mod feddim;
mod gradient;
pub mod job;
pub mod parallel;
pub mod round;
pub mod sgd;
pub mod stable;

use fedge_models::{
    AdversarialConfig, AdversarialModules, FlatLayoutError, HeadConfig, ModelLayout, Tail,
};
use fedge_wire::{Objective, TrainParams};
use rand::SeedableRng;
use rand::rngs::StdRng;

pub use error::TrainError;
pub use fedddl::DdlViews;
pub use job::{LocalState, RoundInputs, TrainJob, TrainOutcome, round_seed};
pub use round::{DeviceData, RoundOutcome, Trainer, run_round};

use crate::features::FeatureSet;
use crate::site_norm::{FeatureNorm, standardise, stats_of};
use feddim::class_stats;
use gradient::gradient_round;
use stable::StableModules;

/// Trains the head of `job` from a fresh [`LocalState`]; deterministic for a given seed.
pub fn train_head(job: &TrainJob) -> Result<TrainOutcome, TrainError> {
    train_local(job, &mut LocalState::default())
}

/// One local round of any objective. The job's `global` is the task's flat vector (the head,
/// then the generator for Stable-FedADG, see [`ModelLayout`]); `state` is what the device keeps
/// between rounds; deterministic for a given seed and `state`. With the task's
/// `feature_norm = "site"`, the data and views are first standardised with the job's site
/// statistics (`crate::site_norm`), and every class statistic comes from standardised features.
pub fn train_local(job: &TrainJob, state: &mut LocalState) -> Result<TrainOutcome, TrainError> {
    if job.params.feature_norm == FeatureNorm::None {
        return train_features(job, state);
    }
    let own;
    let stats = match job.stats {
        Some(stats) => stats,
        None => {
            own = stats_of(&[job.data]).ok_or(TrainError::Empty)?;
            &own
        }
    };
    if stats.mean.len() != job.data.dim {
        return Err(TrainError::FeatureSize {
            expected: job.data.dim,
            got: stats.mean.len(),
        });
    }
    let data = standardise(stats, job.data);
    let views = job.inputs.views.map(|v| v.standardised(stats));
    let inputs = RoundInputs {
        views: views.as_ref(),
        ..job.inputs
    };
    let standardised = TrainJob {
        data: &data,
        inputs,
        ..*job
    };
    train_features(&standardised, state)
}

/// [`train_local`] on the features as the job holds them.
fn train_features(job: &TrainJob, state: &mut LocalState) -> Result<TrainOutcome, TrainError> {
    let TrainJob {
        head: config,
        global,
        data,
        params,
        inputs,
        seed,
        device,
        cancel: _,
        stats: _,
        threads: _,
        tail: _,
    } = *job;
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
        Objective::StableFedAdg | Objective::FedAdg => {
            let (loss, steps, flat) = stable_round(job, &layout, state, &mut rng)?;
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
                let global_head = job.head_from(global);
                global_head.map(|head| class_stats(&head, config.classes, &v.objects, device))
            });
            let prototypes = prototypes.transpose()?;
            let (head, loss, steps) = gradient_round(job, views, &mut rng)?;
            (head.to_flat(), loss, steps, prototypes)
        }
    };
    if !last_epoch_loss.is_finite() {
        return Err(TrainError::Diverged(last_epoch_loss));
    }
    let delta = params_out.iter().zip(global).map(|(a, b)| a - b).collect();
    let class_stats = (params.objective == Objective::FedDim).then(|| {
        let head = job.head_from(layout.head_part(&params_out));
        head.map(|head| class_stats(&head, config.classes, data, device))
    });
    Ok(TrainOutcome {
        params: params_out,
        delta,
        last_epoch_loss,
        steps,
        class_stats: class_stats.transpose()?,
        prototypes,
        features: None,
    })
}

/// Mixed into the job's seed for a new discriminator's initial weights.
const DISCRIMINATOR_STREAM: u64 = 0x0d15_c000_0000_0001;

/// Stable-FedADG's round: the head and generator from `global`, the discriminator from `state`
/// (a seeded one the first time). Returns the loss, the steps and the trained flat vector.
fn stable_round(
    job: &TrainJob,
    layout: &ModelLayout,
    state: &mut LocalState,
    rng: &mut StdRng,
) -> Result<(f32, usize, Vec<f32>), TrainError> {
    let (config, global, data) = (job.head, job.global, job.data);
    let (params, device) = (job.params, job.device);
    let adversarial = AdversarialConfig::for_head(config);
    let disc_flat = match state.discriminator.take() {
        Some(d) if d.len() == adversarial.discriminator_params() => d,
        // Its own stream, so that the batches are cross-entropy's (same seed, same order).
        _ => adversarial.init_discriminator(job.seed ^ DISCRIMINATOR_STREAM),
    };
    let modules = StableModules {
        head: job.head_from(layout.head_part(global))?,
        generator: adversarial.generator(layout.generator_part(global), device)?,
        discriminator: adversarial.discriminator(&disc_flat, device)?,
    };
    let round = stable::train_round(
        modules,
        data,
        config.classes,
        params,
        &mut state.memory,
        rng,
        (device, job.cancel),
    );
    if round.cancelled {
        return Err(TrainError::Cancelled(round.steps));
    }
    state.discriminator = Some(round.discriminator.to_flat());
    let mut flat = round.head.to_flat();
    flat.extend(round.generator.to_flat());
    Ok((round.loss, round.steps, flat))
}

fn check_inputs(
    config: &HeadConfig,
    data: &FeatureSet,
    params: &TrainParams,
) -> Result<(), TrainError> {
    if data.is_empty() {
        return Err(TrainError::Empty);
    }
    if data.dim != config.input_size() || data.features.len() != data.len() * data.dim {
        return Err(TrainError::FeatureSize {
            expected: config.input_size(),
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

/// Accuracy of the head `flat` on `data` (0 for an empty set); a head with a tail needs
/// [`accuracy_with`].
pub fn accuracy(config: &HeadConfig, flat: &[f32], data: &FeatureSet) -> Result<f32, TrainError> {
    accuracy_with(config, flat, None, data)
}

/// Accuracy of the head `flat` on `data` (0 for an empty set), the rows first through the
/// backbone's `tail` when the layout has one (they are the cut's activations then).
pub fn accuracy_with(
    config: &HeadConfig,
    flat: &[f32],
    tail: Option<&Tail>,
    data: &FeatureSet,
) -> Result<f32, TrainError> {
    if data.is_empty() {
        return Ok(0.0);
    }
    let predicted = match config.split_tail(flat)? {
        None => fedge_models::head::predict_flat(config, flat, &data.features)?,
        Some(offsets) => {
            let tail = tail.filter(|t| t.fits(config)).ok_or(TrainError::NoTail)?;
            let features = tail.apply(&offsets, &data.features);
            let head = HeadConfig {
                tail: None,
                ..config.clone()
            };
            let flat = &flat[config.tail_params()..];
            fedge_models::head::predict_flat(&head, flat, &features)?
        }
    };
    let correct = predicted
        .iter()
        .zip(&data.labels)
        .filter(|(p, y)| **p == **y as usize)
        .count();
    Ok(correct as f32 / data.len() as f32)
}

#[cfg(test)]
mod tests;
