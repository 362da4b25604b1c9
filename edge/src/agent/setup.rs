//! What a running agent needs: identity, broker, head shape, cached data, Burn device, key and
//! state file, as a loaded device profile builds it or a test writes it.
//!
//! Plain data: it does not connect or train.

use std::path::PathBuf;
use std::sync::Arc;

use fedge_models::{Backbone, HeadConfig, SelectedDevice};
use fedge_mqtt::BrokerConfig;
use fedge_wire::{DeviceKey, Role};

use crate::inference::{InferenceConfig, SharedPredictor};
use fedge_device::FeatureSet;
use fedge_device::machine::Identity;
use fedge_device::train::DdlViews;

/// Everything a running agent needs.
#[derive(Debug, Clone)]
pub struct AgentSetup {
    /// Client id (one MQTT topic level).
    pub client_id: String,
    /// Federation name.
    pub federation: String,
    /// Broker.
    pub broker: BrokerConfig,
    /// Head sizes: `features` and `hidden` must match the coordinator's; the number of
    /// classes is each task's (its class list's length).
    pub head: HeadConfig,
    /// The class of each label in `train`, `val` and `views`; renumbered onto the
    /// federation's list (`fedge_device::classes::renumber`) before training or scoring.
    pub class_names: Vec<String>,
    /// Train when selected, or only score released models.
    pub role: Role,
    /// Local training split, as backbone features.
    pub train: Arc<FeatureSet>,
    /// Local validation split.
    pub val: Arc<FeatureSet>,
    /// FedDDL's counterfactual and object-only views of `train`, when built.
    pub views: Option<Arc<DdlViews>>,
    /// The backbone's tail and the backbone cut before it when the profile trains it
    /// (`train_tail`): `train`, `val` and `views` are then the activations at its cut, and
    /// releases are served through it.
    pub tail: Option<Arc<crate::features::TailParts>>,
    /// Burn device for training (CPU, or a CUDA GPU on a Jetson build) and its status name.
    pub device: SelectedDevice,
    /// The engine that runs the backbone, its providers and any it could not get.
    pub runtime: fedge_models::RuntimeReport,
    /// The profile's memory budget in MiB (0: none): a peak above it is reported in status.
    pub memory_budget_mb: u64,
    /// Threads a large training batch may be split across (1: one thread).
    pub train_threads: usize,
    /// Hardware profile name, for status.
    pub profile: String,
    /// Backbone name, for status.
    pub backbone: String,
    /// SHA-256 of the backbone's ONNX file, when known (tasks naming another are refused).
    pub backbone_sha256: Option<[u8; 32]>,
    /// The backbone is the federation's: a task naming another ends the run to fetch it.
    pub follows_federation_backbone: bool,
    /// Seed of local shuffling (mixed with the round number).
    pub seed: u64,
    /// The device's key: when set, updates are sealed with it and round tasks must carry a tag
    /// that verifies with it.
    pub key: Option<DeviceKey>,
    /// The site folder's scanner, when the device rescans it before each round.
    pub scan: Option<Arc<std::sync::Mutex<crate::rescan::SiteScan>>>,
    /// The released model: where it is kept, and how predictions are answered with it.
    pub serving: Serving,
    /// Local differential privacy: every update clipped and noised before it leaves (none:
    /// off).
    pub privacy: Option<fedge_device::local_dp::LocalPrivacy>,
    /// Where the device keeps its round state (last round trained, update sequence, local DP's
    /// accountant) across restarts, so a retained task it already answered is not trained
    /// again and the ε spent keeps counting.
    pub state_file: Option<PathBuf>,
    /// Each local training lasts this many times as long as it took, the device idling for
    /// the rest before it answers: a slow device played on a fast machine (`fedge demo
    /// --stragglers`); 1 in a profile.
    pub slowdown: f32,
}

/// What an agent does with the released model.
#[derive(Debug, Clone, Default)]
pub struct Serving {
    /// Where the newest verified release is kept across restarts (none: memory only).
    pub model_file: Option<PathBuf>,
    /// Where the device notes each release it starts serving (`inference::serving_log`; none:
    /// not kept).
    pub serving_log: Option<PathBuf>,
    /// The backbone predictions run, kept when `inference` serves.
    pub backbone: Option<Arc<Backbone>>,
    /// The `[inference]` settings.
    pub inference: InferenceConfig,
    /// The predictor requests use, replaced by each new release.
    pub predictor: SharedPredictor,
    /// Predictions answered at once, over HTTP and MQTT together.
    pub gate: crate::inference::http::Gate,
    /// The drift alarm on what the device serves, fed by every prediction.
    pub drift: Arc<crate::inference::DriftWatch>,
    /// The release served against the one it replaced, on every prediction (the canary's look
    /// at the head).
    pub head: Arc<crate::inference::HeadWatch>,
    /// The device's metrics (fed whether or not they are served).
    pub metrics: Arc<crate::metrics::EdgeMetrics>,
    /// Serve them for Prometheus on `GET /metrics` at this address.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The site's labelling queue, fed by every image served, and its page (`[labelling]`).
    pub labelling: Option<crate::labelling::Labelling>,
}

impl AgentSetup {
    /// The names of the classes the device has samples of.
    pub fn used_classes(&self) -> Vec<String> {
        let mut used = vec![false; self.class_names.len()];
        for set in [&self.train, &self.val] {
            for &label in &set.labels {
                if let Some(u) = used.get_mut(label as usize) {
                    *u = true;
                }
            }
        }
        (self.class_names.iter().zip(used))
            .filter(|(_, u)| *u)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// What the state machine needs to know about the device.
    pub fn identity(&self) -> Identity {
        Identity {
            client_id: self.client_id.clone(),
            federation: self.federation.clone(),
            key: self.key.clone(),
            samples: match self.role {
                Role::Train => self.train.len() as u32,
                Role::Evaluate => self.val.len() as u32,
            },
            role: self.role,
            classes: self.used_classes(),
            val_samples: self.val.len() as u32,
            profile: self.profile.clone(),
            backbone: self.backbone.clone(),
            backbone_sha256: self.backbone_sha256,
            follows_federation_backbone: self.follows_federation_backbone,
            device: self.device.name.clone(),
            runtime: self.runtime.to_string(),
            memory_budget_mb: self.memory_budget_mb,
        }
    }
}
