//! The device's round as one library function: what a selected device does with a round task,
//! whoever drives it. The MQTT agent calls [`run_round`] on its training thread, the simulator
//! (`fedge-sim`) and `fedge eval` call the same function, so what is measured is what is
//! deployed.
//!
//! [`DeviceData`] holds a device's rows with what is derived from them once per data change
//! (site statistics and the validation rows standardised with them), not once per round.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::prelude::Device;
use fedge_models::{HeadConfig, ModelLayout};
use fedge_wire::{FeatureNorm, FeatureStats, FeatureSummary, RoundTask, TensorF32};

use super::{DdlViews, LocalState, RoundInputs, TrainError, TrainJob, TrainOutcome};
use crate::features::FeatureSet;
use crate::site_norm::{SiteNorm, release_stats, site_stats, standardise, summary_of};

/// A device's data for training rounds: its training and validation rows (labels on the
/// federation's class list), FedDDL's views, and the site statistics (over the training rows;
/// an evaluation-only device's over its validation rows: `site_norm::site_stats`).
#[derive(Debug, Clone)]
pub struct DeviceData {
    train: Arc<FeatureSet>,
    val: Arc<FeatureSet>,
    views: Option<Arc<DdlViews>>,
    /// Site statistics (none: no rows).
    stats: Option<Arc<FeatureStats>>,
    /// The validation rows standardised with `stats`.
    standardised_val: Option<Arc<FeatureSet>>,
}

impl DeviceData {
    /// The data, with the site statistics computed once.
    pub fn new(train: Arc<FeatureSet>, val: Arc<FeatureSet>, views: Option<Arc<DdlViews>>) -> Self {
        let stats = site_stats(&train, &val).map(Arc::new);
        let standardised_val = stats.as_ref().map(|s| Arc::new(standardise(s, &val)));
        Self {
            train,
            val,
            views,
            stats,
            standardised_val,
        }
    }

    /// Whether these are the data of `train` and `val` (the same allocations): a driver
    /// rebuilds [`DeviceData`] only when they changed (renumbered labels, a rescan).
    pub fn holds(&self, train: &Arc<FeatureSet>, val: &Arc<FeatureSet>) -> bool {
        Arc::ptr_eq(&self.train, train) && Arc::ptr_eq(&self.val, val)
    }

    /// Training rows.
    pub fn train(&self) -> &Arc<FeatureSet> {
        &self.train
    }

    /// Validation rows, as stored.
    pub fn val(&self) -> &Arc<FeatureSet> {
        &self.val
    }

    /// FedDDL's views of the training rows, when built.
    pub fn views(&self) -> Option<&Arc<DdlViews>> {
        self.views.as_ref()
    }

    /// The statistics the device standardises with under `norm`, given the task's or
    /// release's pooled summary (`site_norm::SiteNorm::labelled` over the training rows, or an
    /// evaluation-only device's labelled validation rows); none for `none` or without rows.
    /// The site's own statistics are computed once; the pooled estimators per call.
    pub fn stats(
        &self,
        norm: FeatureNorm,
        pooled: Option<&FeatureSummary>,
        classes: usize,
    ) -> Option<Arc<FeatureStats>> {
        match norm {
            FeatureNorm::None => None,
            FeatureNorm::Site => self.stats.clone(),
            FeatureNorm::Pooled | FeatureNorm::Balanced => {
                let rows = if self.train.is_empty() {
                    &self.val
                } else {
                    &self.train
                };
                SiteNorm { norm, pooled }
                    .labelled(rows, classes)
                    .map(Arc::new)
            }
        }
    }

    /// The validation rows a global head is scored on, standardised with `stats` (the site's
    /// own statistics' copy is made once).
    pub fn scored_val(&self, stats: Option<&Arc<FeatureStats>>) -> Arc<FeatureSet> {
        match (stats, &self.stats, &self.standardised_val) {
            (None, ..) => Arc::clone(&self.val),
            (Some(stats), Some(own), Some(val)) if Arc::ptr_eq(stats, own) => Arc::clone(val),
            (Some(stats), ..) => Arc::new(standardise(stats, &self.val)),
        }
    }

    /// The statistics this device standardises with to use `release`
    /// (`site_norm::release_stats`; the site's own statistics are computed once).
    pub fn serving_stats(&self, release: &fedge_wire::ModelRelease) -> Option<Arc<FeatureStats>> {
        match release.feature_norm {
            FeatureNorm::Site => self.stats.clone(),
            _ => release_stats(release, &self.train, &self.val).map(Arc::new),
        }
    }

    /// The device's feature summary for its update (`FeatureNorm::pools`), over its training
    /// rows, without the classes it has too few rows of to hide them
    /// ([`FeatureSummary::without_rare_classes`]).
    pub fn summary(&self, classes: usize) -> Option<FeatureSummary> {
        summary_of(&self.train, classes).map(|s| s.without_rare_classes())
    }
}

/// Who trains a round and how, besides the data and the task.
#[derive(Clone, Copy)]
pub struct Trainer<'a> {
    /// The head's sizes; its class count is replaced by the task's class list's length when
    /// the task names classes.
    pub head: &'a HeadConfig,
    /// Burn device.
    pub device: &'a Device,
    /// The device's configured seed (mixed with the round and the client id).
    pub seed: u64,
    /// The device's client id.
    pub client_id: &'a str,
    /// Threads a large batch may be split across.
    pub threads: usize,
    /// Set at the round's deadline: training stops.
    pub cancel: Option<&'a AtomicBool>,
    /// The backbone's tail when the federation trains one (the rows are then its cut's
    /// activations).
    pub tail: Option<&'a fedge_models::Tail>,
}

/// What a round produced: the trained outcome or why not, and the received head's accuracy on
/// the device's validation rows. (The caller times it: the trainer reads no clock.)
#[derive(Debug)]
pub struct RoundOutcome {
    /// The trained update, or why training failed.
    pub result: Result<TrainOutcome, TrainError>,
    /// Accuracy of the task's global head on the validation rows (standardised like training).
    pub val_accuracy: f32,
}

/// One device round: score the task's global head on the validation rows, then train from it
/// (docs/algorithms.md §1, §3–5, §7) with the task's parameters, the device's statistics and
/// what it keeps between rounds.
pub fn run_round(
    data: &DeviceData,
    task: &RoundTask,
    trainer: &Trainer,
    state: &mut LocalState,
) -> RoundOutcome {
    let head = match task.classes.len() {
        0 => trainer.head.clone(),
        classes => HeadConfig {
            classes,
            ..trainer.head.clone()
        },
    };
    // The federation's projector width, when the profile's `hidden` is another: a task's
    // parameters say it (with the features and the classes).
    let generator = task.train.objective.carries_generator();
    let layout = ModelLayout::fitting(&head, generator, task.params.len())
        .unwrap_or_else(|| ModelLayout::new(head, generator));
    let head = layout.head.clone();
    let norm = task.train.feature_norm;
    if trainer.tail.is_some() && norm != FeatureNorm::None {
        return RoundOutcome {
            result: Err(TrainError::TailWithNorm(norm)),
            val_accuracy: 0.0,
        };
    }
    // Checked before any use: a summary of other sizes would index out of its tensors.
    if let Some(pooled) = &task.pooled
        && let Err(e) = pooled.check(head.classes, head.features)
    {
        return RoundOutcome {
            result: Err(TrainError::Pooled(e)),
            val_accuracy: 0.0,
        };
    }
    let global = task.params.to_vec();
    let stats = data.stats(norm, task.pooled.as_ref(), head.classes);
    let val = data.scored_val(stats.as_ref());
    let val_accuracy =
        super::accuracy_with(&head, layout.head_part(&global), trainer.tail, &val).unwrap_or(0.0);
    let insight = task.insight.as_ref().map(TensorF32::to_vec);
    let prototypes = task.prototypes.as_ref().map(TensorF32::to_vec);
    let inputs = RoundInputs {
        insight: insight.as_deref(),
        prototypes: prototypes.as_deref(),
        views: data.views.as_deref(),
    };
    let seed = super::round_seed(trainer.seed, task.round, trainer.client_id);
    let mut job = TrainJob::new(&head, &global, &data.train, &task.train, trainer.device)
        .with_inputs(inputs)
        .with_stats(stats.as_deref())
        .with_seed(seed)
        .with_threads(trainer.threads)
        .with_tail(trainer.tail);
    if let Some(cancel) = trainer.cancel {
        job = job.with_cancel(cancel);
    }
    let result = super::train_local(&job, state).map(|mut outcome| {
        outcome.features = norm.pools().then(|| data.summary(head.classes)).flatten();
        outcome
    });
    RoundOutcome {
        result,
        val_accuracy,
    }
}
