//! Protocol 9, as released: the release before protocol 10 let a head carry a trainable tail
//! (`HeadConfig::tail`).
//!
//! Round tasks, updates, chunks, sealed frames and backbones have the same bodies under
//! version byte 9; only the release's head differs. That release's codec, for the tests that
//! play an old device, is built on these types.

use serde::{Deserialize, Serialize};

use crate::tensor::TensorF32;

/// This module's version byte.
pub const VERSION: u8 = 9;

/// Protocol 9's head sizes: [`crate::HeadConfig`] without `tail`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadConfig {
    /// Feature size `F`.
    pub features: usize,
    /// Projector width `H`.
    pub hidden: usize,
    /// Classes `K`.
    pub classes: usize,
}

/// Protocol 9's release: [`crate::ModelRelease`] with protocol 9's head.
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
    /// The federation's pooled feature summary.
    pub pooled: Option<crate::FeatureSummary>,
}

impl From<crate::ModelRelease> for ModelRelease {
    /// Drops the tail's sizes: a device of protocol 9 then refuses a tail's release by its
    /// parameter count, as it should, since it cannot run the tail.
    fn from(m: crate::ModelRelease) -> Self {
        Self {
            federation: m.federation,
            run: m.run,
            round: m.round,
            strategy: m.strategy,
            classes: m.classes,
            backbone: m.backbone,
            head: HeadConfig {
                features: m.head.features,
                hidden: m.head.hidden,
                classes: m.head.classes,
            },
            feature_norm: m.feature_norm,
            params: m.params,
            sha256: m.sha256,
            pooled: m.pooled,
        }
    }
}

impl From<ModelRelease> for crate::ModelRelease {
    /// A protocol-9 head has no tail.
    fn from(m: ModelRelease) -> Self {
        Self {
            federation: m.federation,
            run: m.run,
            round: m.round,
            strategy: m.strategy,
            classes: m.classes,
            backbone: m.backbone,
            head: crate::HeadConfig::new(m.head.features, m.head.classes)
                .with_hidden(m.head.hidden),
            feature_norm: m.feature_norm,
            params: m.params,
            sha256: m.sha256,
            pooled: m.pooled,
        }
    }
}
