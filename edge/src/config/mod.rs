//! A device's configuration file (the profiles in `firmware-configs/` are such files).
//!
//! Relative paths are resolved against the folder of the file, so a profile works from any
//! working directory. Closed sets of values (`backend`, `device`, the data `kind`) are enums:
//! a bad value fails at load and names the valid ones. Building the agent from a loaded file
//! ([`EdgeConfig::setup`], in `setup.rs`) reads the backbone, the data and the key; it does not
//! connect.

use std::path::{Path, PathBuf};

use fedge_models::{Accelerator, BackboneError, Backend};
use fedge_mqtt::BrokerConfig;
use fedge_wire::Role;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use fedge_device::local_dp::{InvalidLocalPrivacy, LocalPrivacy};

use crate::data::DataError;
use crate::features::LoadBackboneError;
use crate::inference::{InferenceConfig, config::InvalidInference};
use crate::resources::ResourceConfig;
use crate::views::{self, ViewsError};

mod setup;

/// Why a device's file does not load.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is unreadable.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid profile (syntax, unknown key, a value outside its set).
    #[error("{}: {reason}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why, with the line.
        reason: String,
    },
    /// A `[broker]` value is out of range, or a file it names (TLS, password) is unusable.
    #[error("{}: {source}", path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// Why.
        source: fedge_mqtt::BrokerSettingsError,
    },
    /// The client id cannot be one MQTT topic level.
    #[error(
        "{}: client_id {client_id:?} must be 1-64 characters of A-Z a-z 0-9 _ . -",
        path.display()
    )]
    ClientId {
        /// The file.
        path: PathBuf,
        /// The id given.
        client_id: String,
    },
    /// The validation fraction is outside `(0, 1)`.
    #[error(
        "{}: backbone = \"federation\" needs a key_file: without a device key nothing tells \
         the federation's backbone from one anyone on the broker publishes (enrol the device \
         with `fedge-edge enroll`, or name a model card file as backbone)",
        path.display()
    )]
    FederationBackboneWithoutKey {
        /// The profile.
        path: PathBuf,
    },
    #[error("{}: val_fraction must be in (0, 1)", path.display())]
    ValFraction {
        /// The file.
        path: PathBuf,
    },
    /// `[inference]` has a value that cannot be served.
    #[error("{}: {source}", path.display())]
    Inference {
        /// The file.
        path: PathBuf,
        /// Which value.
        source: InvalidInference,
    },
    /// `[labelling]` has a value that cannot be used.
    #[error("{}: {source}", path.display())]
    Labelling {
        /// The file.
        path: PathBuf,
        /// Which value.
        source: crate::labelling::InvalidLabelling,
    },
    /// `[privacy]` has a value outside its domain.
    #[error("{}: {source}", path.display())]
    Privacy {
        /// The file.
        path: PathBuf,
        /// Which value.
        source: InvalidLocalPrivacy,
    },
}

/// Why a loaded profile could not become a running agent.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The key file is unreadable.
    #[error("key_file {}: {source} (create one with `fedge-coordinator keygen`)", path.display())]
    KeyRead {
        /// The key file.
        path: PathBuf,
        /// Why.
        source: fedge_daemon::SecretError,
    },
    /// The key file does not hold a key.
    #[error("key_file {}: {source}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why.
        source: fedge_wire::KeyError,
    },
    /// The backbone does not load.
    #[error(transparent)]
    Backbone(#[from] LoadBackboneError),
    /// The data set does not load.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The profile's domain is not in the data set.
    #[error("domain {wanted:?} not found; available: {}", available.join(", "))]
    Domain {
        /// The domain asked for.
        wanted: String,
        /// The domains found.
        available: Vec<String>,
    },
    /// FedDDL's detector does not load.
    #[error("[fedddl] detector: {0}")]
    Detector(BackboneError),
    /// The backbone (or the detector) failed on the images.
    #[error(transparent)]
    Features(#[from] BackboneError),
    /// FedDDL's views could not be built.
    #[error(transparent)]
    Views(#[from] ViewsError),
    /// The first scan of the site folder failed.
    #[error(transparent)]
    Scan(#[from] crate::rescan::ScanError),
    /// The labelling queue could not be opened.
    #[error(transparent)]
    Labelling(#[from] crate::labelling::OpenError),
    /// Rescans with FedDDL, whose views are built once at start.
    #[error(
        "[data] rescan = true does not work with [fedddl] enabled = true (FedDDL's views are \
         built once at start); turn one off"
    )]
    RescanWithFedDdl,
}

/// Where the device's samples come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum DataConfig {
    /// One domain of the built-in rotated digits (`rot0` … `rot75`).
    Digits {
        /// Which domain: `rot0`, `rot15`, `rot30`, `rot45`, `rot60` or `rot75` (the digits
        /// rotated by that many degrees).
        domain: String,
        /// Seed of the split of the digits into domains; must agree across devices.
        #[serde(default)]
        seed: u64,
    },
    /// The device's own site folder, `root/<class>/*.{png,jpg,jpeg}` (optional `boxes.csv`),
    /// read alone: its classes are its class folders, renumbered onto the federation's list
    /// by name when a task or model arrives.
    ImageFolder {
        /// The site folder; with `domain`, the tree `root/<domain>/<class>/*` and this device's
        /// folder `root/<domain>`.
        root: PathBuf,
        /// The site's folder inside `root`, when `root` holds several sites.
        #[serde(default)]
        domain: Option<String>,
        /// Look for new and removed images before each round (the feature cache keeps the
        /// features of images already seen). Not with `[fedddl] enabled = true`.
        #[serde(default)]
        rescan: bool,
    },
}

impl DataConfig {
    /// The site folder of ImageFolder data.
    pub fn site_folder(&self) -> Option<PathBuf> {
        match self {
            DataConfig::Digits { .. } => None,
            DataConfig::ImageFolder { root, domain, .. } => Some(
                domain
                    .as_ref()
                    .map_or_else(|| root.clone(), |d| root.join(d)),
            ),
        }
    }
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EdgeConfig {
    /// Client id, unique in the federation: 1 to 64 characters of `A-Z a-z 0-9 _ . -`.
    pub client_id: String,
    /// Federation name, as the coordinator's `federation`.
    pub federation: String,
    /// Hardware profile name (reported in status).
    #[serde(default = "default_profile")]
    pub profile: String,
    /// Burn CPU backend: `flex` (`ndarray` too in a build with the `ndarray` feature).
    #[serde(default)]
    pub backend: Backend,
    /// Where the head trains: `auto` (a CUDA GPU in a `cuda` build when one answers, else the
    /// CPU), `cpu`, or `cuda` (falls back to the CPU, saying why, when there is no GPU).
    #[serde(default)]
    pub device: Accelerator,
    /// How the backbone runs: `runtime = "tract"` (the default, in every build) or
    /// `"onnxruntime"` with `onnxruntime_library` and `providers` (a build with the
    /// `onnxruntime` feature).
    #[serde(default)]
    pub model: fedge_models::RuntimeConfig,
    /// Resource limits of the hardware class; 0 in any of them: no limit.
    #[serde(default)]
    pub resources: ResourceConfig,
    /// Seed of the device's own random choices: its validation split, the cut of its data to
    /// `[resources] feature_cache_mb` and local training.
    #[serde(default)]
    pub seed: u64,
    /// Train the backbone's last convolution block with the head (docs/algorithms.md §0,
    /// "Trainable tail"): the backbone runs to the block's input once per image, those
    /// activations are cached, and every round trains the block's offsets from its pretrained
    /// weights with the head. The coordinator's `[head.tail]` must be this backbone's
    /// (`fedge-edge check` prints it) and its `[train] feature_norm` `"none"`. Runs the cut in
    /// tract.
    #[serde(default)]
    pub train_tail: bool,
    /// Projector width; must match the coordinator's `[head].hidden`.
    #[serde(default = "default_hidden")]
    pub hidden: usize,
    /// Fraction of local samples kept for validation, in (0, 1).
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f32,
    /// Folder where the device keeps, across restarts, its feature cache, the newest release
    /// (`<client_id>.model.bin`, which `fedge-edge predict` reads) and a backbone fetched from
    /// the federation; relative to this file. Unset: features are computed at every start and
    /// no release is kept.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// The federation's MQTT broker.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// Model card of the backbone, or `"federation"`: the one the federation distributes
    /// (`fedge-coordinator publish-backbone`), fetched into `cache_dir` at start, which needs
    /// `key_file`. A card's path is relative to this file.
    pub backbone: PathBuf,
    /// Set once `backbone` is a card fetched from the federation (not read from the file).
    #[serde(skip)]
    pub fetched_backbone: bool,
    /// `train` (the default) or `evaluate`: an evaluation-only device never trains; it
    /// scores every released model on all of its labelled data and reports the accuracy.
    #[serde(default)]
    pub role: Role,
    /// The federation's class list (the coordinator's `[model] classes_file`), for `check`
    /// to compare this device's classes with before it joins. The agent itself takes the
    /// list from the coordinator.
    #[serde(default)]
    pub classes_file: Option<PathBuf>,
    /// Where the device's samples come from: `kind` picks the built-in digits or the device's
    /// own folder of images.
    pub data: DataConfig,
    /// FedDDL's counterfactual and object-only views, built once at start when enabled.
    #[serde(default)]
    pub fedddl: FedDdlConfig,
    /// File holding the device's key (64 hex digits), provisioned with the profile
    /// (`fedge-coordinator keygen`). With a key, updates are sealed with HMAC-SHA256 and round
    /// tasks must carry a tag that verifies; without one, nothing is authenticated. Relative to
    /// this file; readable by its owner only.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Predictions with the released head: the HTTP endpoint and MQTT requests. The endpoint
    /// has no authentication and no TLS: keep `listen` on loopback unless the network in front
    /// of the device is trusted.
    #[serde(default)]
    pub inference: InferenceConfig,
    /// The site's labelling queue and its page (README, "When a site changes"): the served
    /// inputs the model was least sure of wait on the device for a person to label them; the
    /// labelled images go into the site folder. Absent: off (no image is kept).
    #[serde(default)]
    pub labelling: Option<crate::labelling::LabellingConfig>,
    /// Serve the device's metrics for Prometheus (OpenMetrics on `GET /metrics`) at this
    /// address, e.g. `"127.0.0.1:9465"`; none when unset (docs/prometheus.md).
    #[serde(
        default,
        deserialize_with = "fedge_daemon::metrics::deserialize_listen"
    )]
    #[schemars(with = "Option<String>")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Local differential privacy (docs/privacy.md, "Local DP"): every update clipped and
    /// noised before it leaves the device; round tasks with the `feddim` or `fedddl` objective
    /// are refused. Absent: off.
    #[serde(default)]
    pub privacy: Option<LocalPrivacy>,
}

/// The device side of FedDDL (`[fedddl]` in the file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FedDdlConfig {
    /// Build the views at start (one extra backbone pass over the training data, cached), so
    /// the device can train round tasks with the `FedDdl` objective.
    #[serde(default)]
    pub enabled: bool,
    /// Background groups per class, `η`.
    #[serde(default = "default_groups")]
    pub groups: usize,
    /// Counterfactual draws kept per image (one extra backbone pass each, at start); every
    /// round trains on one of them per image, picked at random. 0 trains DEB alone: the real
    /// images and the pull towards the global prototypes, no counterfactuals (an ablation).
    #[serde(default = "default_pool")]
    pub counterfactuals: usize,
    /// A detector's model card, relative to this file: its boxes give the object masks,
    /// replacing the data set's own.
    #[serde(default)]
    pub detector: Option<PathBuf>,
}

impl Default for FedDdlConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            groups: views::DEFAULT_GROUPS,
            counterfactuals: views::DEFAULT_POOL,
            detector: None,
        }
    }
}

fn default_groups() -> usize {
    views::DEFAULT_GROUPS
}

fn default_pool() -> usize {
    views::DEFAULT_POOL
}

fn default_profile() -> String {
    "generic".into()
}
fn default_hidden() -> usize {
    64
}
fn default_val_fraction() -> f32 {
    0.1
}

/// The profile's `backbone` value that means "the federation's" (fetched at start).
pub const FROM_FEDERATION: &str = "federation";

impl EdgeConfig {
    /// Reads a file and resolves its relative paths.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config: Self = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            reason: fedge_daemon::describe_toml(&e, &text),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        if !config.backbone_from_federation() {
            config.backbone = base.join(&config.backbone);
        }
        if let Some(dir) = &config.cache_dir {
            config.cache_dir = Some(base.join(dir));
        }
        config
            .broker
            .load(base)
            .map_err(|source| ConfigError::Tls {
                path: path.to_owned(),
                source,
            })?;
        if let Some(key) = &config.key_file {
            config.key_file = Some(base.join(key));
        }
        if let Some(library) = &config.model.onnxruntime_library {
            config.model.onnxruntime_library = Some(base.join(library));
        }
        if let Some(detector) = &config.fedddl.detector {
            config.fedddl.detector = Some(base.join(detector));
        }
        if let Some(file) = &config.classes_file {
            config.classes_file = Some(base.join(file));
        }
        if let DataConfig::ImageFolder { root, .. } = &mut config.data {
            *root = base.join(&*root);
        }
        if !fedge_wire::valid_client_id(&config.client_id) {
            return Err(ConfigError::ClientId {
                path: path.to_owned(),
                client_id: config.client_id,
            });
        }
        if config.backbone_from_federation() && config.key_file.is_none() {
            return Err(ConfigError::FederationBackboneWithoutKey {
                path: path.to_owned(),
            });
        }
        if !(config.val_fraction > 0.0 && config.val_fraction < 1.0) {
            return Err(ConfigError::ValFraction {
                path: path.to_owned(),
            });
        }
        config
            .inference
            .check()
            .map_err(|source| ConfigError::Inference {
                path: path.to_owned(),
                source,
            })?;
        if let Some(labelling) = &mut config.labelling {
            labelling.resolve(base);
            let invalid = |source| ConfigError::Labelling {
                path: path.to_owned(),
                source,
            };
            labelling.check().map_err(invalid)?;
            if config.data.site_folder().is_none() {
                return Err(invalid(crate::labelling::InvalidLabelling::NoSiteFolder));
            }
            if !config.inference.serves() {
                return Err(invalid(crate::labelling::InvalidLabelling::NotServing));
            }
        }
        if let Some(privacy) = &config.privacy {
            privacy.check().map_err(|source| ConfigError::Privacy {
                path: path.to_owned(),
                source,
            })?;
        }
        Ok(config)
    }

    /// Where training runs, as `device` and `backend` say.
    pub fn training(&self) -> (Accelerator, Backend) {
        (self.device, self.backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_with(line: &str) -> Result<EdgeConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.toml");
        let text = format!(
            "client_id = \"cam-1\"\nfederation = \"lab\"\nbackbone = \"b.toml\"\n{line}\n\
             [data]\nkind = \"digits\"\ndomain = \"rot0\"\n"
        );
        std::fs::write(&path, text).unwrap();
        EdgeConfig::load(&path)
    }

    #[test]
    fn the_federation_s_backbone_needs_a_device_key() {
        let text = |extra: &str| {
            format!(
                "client_id = \"cam-1\"\nfederation = \"lab\"\nbackbone = \"federation\"\n\
                 cache_dir = \"cache\"\n{extra}[data]\nkind = \"digits\"\ndomain = \"rot0\"\n"
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.toml");
        std::fs::write(&path, text("")).unwrap();
        let err = EdgeConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("needs a key_file"), "{err}");
        std::fs::write(&path, text("key_file = \"cam-1.key\"\n")).unwrap();
        assert!(EdgeConfig::load(&path).unwrap().backbone_from_federation());
    }

    #[test]
    fn backend_and_device_default_to_flex_and_auto() {
        let config = load_with("").unwrap();
        assert_eq!(config.training(), (Accelerator::Auto, Backend::Flex));
        let config = load_with("device = \"cuda\"").unwrap();
        assert_eq!(config.device, Accelerator::Cuda);
    }

    #[test]
    fn a_bad_backend_or_device_fails_at_load_and_lists_the_valid_values() {
        let err = load_with("backend = \"tpu\"").unwrap_err().to_string();
        assert!(err.contains("tpu") && err.contains("flex"), "{err}");
        let err = load_with("device = \"gpu\"").unwrap_err().to_string();
        for valid in ["auto", "cpu", "cuda"] {
            assert!(err.contains(valid), "{err}");
        }
    }

    #[test]
    fn privacy_is_off_without_its_section_and_checked_with_it() {
        assert_eq!(load_with("").unwrap().privacy, None);
        let on = "[privacy]\nlocal_noise_multiplier = 1.2\nlocal_clip_norm = 0.5";
        let privacy = load_with(on).unwrap().privacy.unwrap();
        assert_eq!(
            (privacy.local_noise_multiplier, privacy.local_clip_norm),
            (1.2, 0.5)
        );
        assert_eq!((privacy.delta, privacy.seed), (1e-5, None));
        let err = load_with("[privacy]\nlocal_noise_multiplier = 0.0\nlocal_clip_norm = 0.5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("local_noise_multiplier"), "{err}");
        let err = load_with("[privacy]\nlocal_noise_multiplier = 1.0\nlocal_clip_norm = -2.0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("local_clip_norm"), "{err}");
        let err = load_with(&format!("{on}\ndelta = 2.0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("delta"), "{err}");
        let err = load_with(&format!("{on}\nmode = \"central\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode"), "{err}");
        let err = load_with("[privacy]\nlocal_clip_norm = 0.5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("local_noise_multiplier"), "{err}");
    }

    #[test]
    fn a_bad_val_fraction_fails_at_load() {
        let err = load_with("val_fraction = 1.5").unwrap_err().to_string();
        assert!(err.contains("val_fraction"), "{err}");
    }
}
