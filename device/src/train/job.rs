//! What one local round takes and gives: the job (head shape, global parameters, data,
//! hyper-parameters, the task's extras, seed, device), the state a device keeps between rounds
//! and the outcome.
//!
//! Plain data only: the dispatch in `crate::train` runs a job.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;
use fedge_models::{Head, HeadConfig, HeadModules, Tail};
use fedge_wire::TrainParams;

use super::error::TrainError;
use super::fedddl::DdlViews;
use super::stable::Memory;
use crate::features::{FeatureSet, Fnv64};
use crate::site_norm::FeatureStats;

/// One local round's inputs, passed as one value to `crate::train::train_head` and
/// `crate::train::train_local`.
#[derive(Debug, Clone, Copy)]
pub struct TrainJob<'a> {
    /// Head sizes.
    pub head: &'a HeadConfig,
    /// The task's flat vector (the head, then the generator for Stable-FedADG, see
    /// [`fedge_models::ModelLayout`]).
    pub global: &'a [f32],
    /// Local training data.
    pub data: &'a FeatureSet,
    /// The round's hyper-parameters and objective.
    pub params: &'a TrainParams,
    /// What the task brings besides the parameters, and the device's extra views.
    pub inputs: RoundInputs<'a>,
    /// Seed of local shuffling and initialisation; the same seed gives the same numbers.
    pub seed: u64,
    /// Burn device to train on.
    pub device: &'a Device,
    /// Set (by the driver, at the round's deadline) to stop training before the next batch:
    /// an update that would arrive after the round closed is not worth the device's time.
    pub cancel: Option<&'a AtomicBool>,
    /// The site's feature statistics, used when the task asks for site normalisation (without
    /// them, those of `data`).
    pub stats: Option<&'a FeatureStats>,
    /// Threads a large batch may be split across (`crate::train::parallel`); 1 by default.
    pub threads: usize,
    /// The backbone's tail (its cut and pretrained weights) when the head has one: the data
    /// are then the cut's activations.
    pub tail: Option<&'a Tail>,
}

impl<'a> TrainJob<'a> {
    /// A job without the task's extras, seed 0.
    pub fn new(
        head: &'a HeadConfig,
        global: &'a [f32],
        data: &'a FeatureSet,
        params: &'a TrainParams,
        device: &'a Device,
    ) -> Self {
        Self {
            head,
            global,
            data,
            params,
            inputs: RoundInputs::default(),
            seed: 0,
            device,
            cancel: None,
            stats: None,
            threads: 1,
            tail: None,
        }
    }

    /// The same job with the backbone's tail (needed when the head's layout has one).
    pub fn with_tail(self, tail: Option<&'a Tail>) -> Self {
        Self { tail, ..self }
    }

    /// The Burn head holding `flat` (the head's part of a task's vector), behind its trainable
    /// tail when the layout has one.
    pub fn head_from(&self, flat: &[f32]) -> Result<Head, TrainError> {
        let head = self.head.from_flat(flat, self.device)?;
        let Some(offsets) = self.head.split_tail(flat)? else {
            return Ok(head);
        };
        match self.tail.filter(|t| t.fits(self.head)) {
            Some(tail) => Ok(head.with_tail(tail.module(&offsets, self.device))),
            None => Err(TrainError::NoTail),
        }
    }

    /// The same job, its large batches split across up to `threads` threads.
    pub fn with_threads(self, threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            ..self
        }
    }

    /// The same job with the site's feature statistics.
    pub fn with_stats(self, stats: Option<&'a FeatureStats>) -> Self {
        Self { stats, ..self }
    }

    /// The same job, stopped before its next batch once `cancel` is set.
    pub fn with_cancel(self, cancel: &'a AtomicBool) -> Self {
        Self {
            cancel: Some(cancel),
            ..self
        }
    }

    /// Whether the job was asked to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// The same job with another seed.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// The same job with the task's extras.
    pub fn with_inputs(self, inputs: RoundInputs<'a>) -> Self {
        Self { inputs, ..self }
    }
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
    /// The device's feature summary over its training rows, when the federation pools
    /// (set by `run_round`).
    pub features: Option<fedge_wire::FeatureSummary>,
}

/// The seed of one device's local training in one round: the configured seed, the round and
/// the device's id mixed, so that devices sharing a profile (and a benchmark's clients sharing
/// its seed) draw different shuffles, noise and random features, and a device draws anew each
/// round. The agent and `fedge eval` both use it, so their runs agree.
pub fn round_seed(seed: u64, round: u64, client_id: &str) -> u64 {
    seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ Fnv64::of(client_id.as_bytes())
}
