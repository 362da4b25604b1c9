//! What a running agent needs: identity, broker, head shape, cached data, Burn device, key and
//! state file, as `crate::config::EdgeConfig::setup` builds it or a test writes it.
//!
//! Plain data: it does not connect or train.

use std::path::PathBuf;
use std::sync::Arc;

use fedge_models::{HeadConfig, SelectedDevice};
use fedge_mqtt::BrokerConfig;
use fedge_wire::DeviceKey;

use super::machine::Identity;
use crate::features::FeatureSet;
use crate::train::DdlViews;

/// Everything a running agent needs.
#[derive(Debug, Clone)]
pub struct AgentSetup {
    /// Client id (one MQTT topic level).
    pub client_id: String,
    /// Federation name.
    pub federation: String,
    /// Broker.
    pub broker: BrokerConfig,
    /// Head sizes; must match the coordinator's.
    pub head: HeadConfig,
    /// Local training split, as backbone features.
    pub train: Arc<FeatureSet>,
    /// Local validation split.
    pub val: Arc<FeatureSet>,
    /// FedDDL's counterfactual and object-only views of `train`, when built.
    pub views: Option<Arc<DdlViews>>,
    /// Burn device for training (CPU, or a CUDA GPU on a Jetson build) and its status name.
    pub device: SelectedDevice,
    /// The profile's memory budget in MiB (0: none): a peak above it is reported in status.
    pub memory_budget_mb: u64,
    /// Hardware profile name, for status.
    pub profile: String,
    /// Backbone name, for status.
    pub backbone: String,
    /// Seed of local shuffling (mixed with the round number).
    pub seed: u64,
    /// The device's key: when set, updates are sealed with it and round tasks must carry a tag
    /// that verifies with it.
    pub key: Option<DeviceKey>,
    /// Where the device keeps its round state (last round trained, update sequence) across
    /// restarts, so a retained task it already answered is not trained again.
    pub state_file: Option<PathBuf>,
}

impl AgentSetup {
    /// What the state machine needs to know about the device.
    pub fn identity(&self) -> Identity {
        Identity {
            client_id: self.client_id.clone(),
            federation: self.federation.clone(),
            key: self.key.clone(),
            samples: self.train.len() as u32,
            val_samples: self.val.len() as u32,
            profile: self.profile.clone(),
            backbone: self.backbone.clone(),
            device: self.device.name.clone(),
            memory_budget_mb: self.memory_budget_mb,
        }
    }
}
