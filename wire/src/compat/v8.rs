//! Protocol 8, as released: the round task, the client update and the release before
//! protocol 9 carried feature summaries (`FeatureSummary`: a device's on its update, the
//! federation's pooled one on tasks and releases).
//!
//! Chunks, sealed frames and backbones have the same bodies under version byte 8. That
//! release's codec, for the tests that play an old device, is built on these types.

use serde::{Deserialize, Serialize};

use crate::layout::HeadConfig;
use crate::messages::{BackboneRef, ClassStats, LocalMetrics, TrainParams};
use crate::tensor::TensorF32;

/// This module's version byte.
pub const VERSION: u8 = 8;

/// Protocol 8's round task: [`crate::RoundTask`] without `pooled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundTask {
    /// The federation's name.
    pub federation: String,
    /// The federation's run.
    pub run: u64,
    /// Round number.
    pub round: u64,
    /// Clients asked to train this round.
    pub selected: Vec<String>,
    /// The federation's class names in output order.
    pub classes: Vec<String>,
    /// Global head parameters.
    pub params: TensorF32,
    /// Local training hyper-parameters.
    pub train: TrainParams,
    /// Milliseconds from publication until the round closes.
    pub deadline_ms: u64,
    /// FedDIM's `Ī`.
    pub insight: Option<TensorF32>,
    /// FedDDL's `U_G`.
    pub prototypes: Option<TensorF32>,
    /// The federation's backbone.
    pub backbone: Option<BackboneRef>,
}

/// Protocol 8's client update: [`crate::ClientUpdate`] without `features`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientUpdate {
    /// The task's run.
    pub run: u64,
    /// The task's round.
    pub round: u64,
    /// The device's client id.
    pub client_id: String,
    /// Per-device sequence number.
    pub seq: u64,
    /// Local training samples.
    pub num_samples: u32,
    /// `θ_local − θ_global`.
    pub delta: TensorF32,
    /// Local metrics.
    pub metrics: LocalMetrics,
    /// FedDIM's class statistics.
    pub class_stats: Option<ClassStats>,
    /// FedDDL's local prototypes.
    pub prototypes: Option<ClassStats>,
}

/// Protocol 8's release: [`crate::ModelRelease`] without `pooled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRelease {
    /// The federation's name.
    pub federation: String,
    /// The federation's run.
    pub run: u64,
    /// The round of the aggregate.
    pub round: u64,
    /// Server strategy.
    pub strategy: String,
    /// Class names.
    pub classes: Vec<String>,
    /// The backbone's name.
    pub backbone: String,
    /// The head's sizes.
    pub head: HeadConfig,
    /// How input features are standardised.
    pub feature_norm: crate::FeatureNorm,
    /// The head's parameters.
    pub params: TensorF32,
    /// SHA-256 of the parameters.
    pub sha256: [u8; 32],
}

impl From<crate::RoundTask> for RoundTask {
    /// Drops what protocol 8 cannot carry (the pooled summary).
    fn from(t: crate::RoundTask) -> Self {
        Self {
            federation: t.federation,
            run: t.run,
            round: t.round,
            selected: t.selected,
            classes: t.classes,
            params: t.params,
            train: t.train,
            deadline_ms: t.deadline_ms,
            insight: t.insight,
            prototypes: t.prototypes,
            backbone: t.backbone,
        }
    }
}

impl From<RoundTask> for crate::RoundTask {
    /// A protocol-8 task carries no pooled summary.
    fn from(t: RoundTask) -> Self {
        Self {
            federation: t.federation,
            run: t.run,
            round: t.round,
            selected: t.selected,
            classes: t.classes,
            params: t.params,
            train: t.train,
            deadline_ms: t.deadline_ms,
            insight: t.insight,
            prototypes: t.prototypes,
            backbone: t.backbone,
            pooled: None,
        }
    }
}

impl From<crate::ClientUpdate> for ClientUpdate {
    /// Drops the feature summary.
    fn from(u: crate::ClientUpdate) -> Self {
        Self {
            run: u.run,
            round: u.round,
            client_id: u.client_id,
            seq: u.seq,
            num_samples: u.num_samples,
            delta: u.delta,
            metrics: u.metrics,
            class_stats: u.class_stats,
            prototypes: u.prototypes,
        }
    }
}

impl From<ClientUpdate> for crate::ClientUpdate {
    /// A protocol-8 update carries no feature summary.
    fn from(u: ClientUpdate) -> Self {
        Self {
            run: u.run,
            round: u.round,
            client_id: u.client_id,
            seq: u.seq,
            num_samples: u.num_samples,
            delta: u.delta,
            metrics: u.metrics,
            class_stats: u.class_stats,
            prototypes: u.prototypes,
            features: None,
        }
    }
}

impl From<crate::ModelRelease> for ModelRelease {
    /// Drops the pooled summary.
    fn from(m: crate::ModelRelease) -> Self {
        Self {
            federation: m.federation,
            run: m.run,
            round: m.round,
            strategy: m.strategy,
            classes: m.classes,
            backbone: m.backbone,
            head: m.head,
            feature_norm: m.feature_norm,
            params: m.params,
            sha256: m.sha256,
        }
    }
}

impl From<ModelRelease> for crate::ModelRelease {
    /// A protocol-8 release carries no pooled summary.
    fn from(m: ModelRelease) -> Self {
        Self {
            federation: m.federation,
            run: m.run,
            round: m.round,
            strategy: m.strategy,
            classes: m.classes,
            backbone: m.backbone,
            head: m.head,
            feature_norm: m.feature_norm,
            params: m.params,
            sha256: m.sha256,
            pooled: None,
        }
    }
}
