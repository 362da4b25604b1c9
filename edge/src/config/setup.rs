//! From a loaded profile to a running agent's inputs: the key, the backbone, the local images
//! and their features (cached, cut to the feature cache, split, FedDDL's views), and what the
//! device serves with ([`EdgeConfig::setup`]).

use std::path::Path;
use std::sync::Arc;

use fedge_device::DdlViews;
use fedge_models::{Backbone, HeadConfig};
use fedge_wire::Role;

use super::{DataConfig, EdgeConfig, FROM_FEDERATION, SetupError};
use crate::agent::{AgentSetup, Serving};
use crate::data::{DIGITS_ANGLES, SiteImages, digits_domains, imagefolder_site};
use crate::features;
use crate::inference;
use crate::rescan::SiteScan;
use crate::resources;
use crate::views;

impl EdgeConfig {
    /// Loads the local images (raw values; ImageFolder images at the backbone's input size,
    /// the built-in digits at their own): the profile's digits domain, or its own site folder
    /// alone, without the files that do not decode (listed, and logged one by one).
    pub fn load_images(&self, backbone: &Backbone) -> Result<SiteImages, SetupError> {
        let card = backbone.card();
        let (seed, wanted) = match &self.data {
            DataConfig::Digits { seed, domain } => (*seed, domain),
            DataConfig::ImageFolder { .. } => {
                let site = self.data.site_folder().unwrap_or_default();
                // Images of another size or channel count are adapted to the card when
                // features are computed (`ModelCard::adapt_chw`).
                let loaded = imagefolder_site(&site, card.channels, card.height, card.width)?;
                for (file, reason) in &loaded.skipped {
                    tracing::warn!(file = %file.display(), %reason, "image skipped");
                }
                return Ok(loaded);
            }
        };
        let domains = digits_domains(&DIGITS_ANGLES, seed);
        let names: Vec<String> = domains.iter().map(|d| d.name.clone()).collect();
        let domain = domains
            .into_iter()
            .find(|d| d.name == *wanted)
            .ok_or_else(|| SetupError::Domain {
                wanted: wanted.clone(),
                available: names,
            })?;
        Ok(SiteImages {
            images: domain.data,
            skipped: Vec::new(),
        })
    }

    /// `backbone = "federation"`: the device takes the backbone the federation distributes
    /// (fetched at start), kept in `cache_dir`.
    pub fn backbone_from_federation(&self) -> bool {
        self.backbone == Path::new(FROM_FEDERATION)
    }

    /// Reads the device key named by `key_file`, if any.
    pub fn load_key(&self) -> Result<Option<fedge_wire::DeviceKey>, SetupError> {
        let Some(path) = &self.key_file else {
            return Ok(None);
        };
        let text = fedge_daemon::read_secret(path).map_err(|source| SetupError::KeyRead {
            path: path.clone(),
            source,
        })?;
        let key = fedge_wire::DeviceKey::from_hex(&text).map_err(|source| SetupError::Key {
            path: path.clone(),
            source,
        })?;
        Ok(Some(key))
    }

    /// Loads backbone and data, computes (or reads cached) features and builds the agent.
    pub fn setup(&self) -> Result<AgentSetup, SetupError> {
        let key = self.load_key()?;
        let (backbone, backbone_id) =
            features::load_backbone_with(&self.backbone, &self.model, self.resources.threads)?;
        let backbone = Arc::new(backbone);
        let runtime = backbone.runtime();
        let feature_size = backbone.card().feature_size;
        // With a trainable tail, the data are the activations at its cut (cached apart).
        let tail = match self.train_tail {
            true => Some(Arc::new(features::split_tail(
                &backbone,
                self.resources.threads,
            )?)),
            false => None,
        };
        let (features_backbone, features_id) = match &tail {
            Some(parts) => (
                Arc::clone(&parts.cut),
                features::cut_id(backbone_id, &parts.tail),
            ),
            None => (Arc::clone(&backbone), backbone_id),
        };
        let mut head = HeadConfig::new(feature_size, 0).with_hidden(self.hidden);
        if let Some(parts) = &tail {
            head = head.with_tail(parts.tail.config);
        }
        let backbone_name = backbone.card().name.clone();
        let backbone_sha256 = Some(backbone.reference().sha256);
        let follows_federation_backbone = self.fetched_backbone;
        let data = match &self.data {
            DataConfig::ImageFolder { rescan: true, .. } => {
                self.scanned(Arc::clone(&features_backbone))?
            }
            _ => self.loaded(&features_backbone, features_id)?,
        };
        // The backbone stays in memory only when the device answers predictions.
        let metrics: Arc<crate::metrics::EdgeMetrics> = Default::default();
        let labelling = match (&self.labelling, self.data.site_folder()) {
            (Some(labelling), Some(site)) => Some(labelling.open(
                &site,
                self.cache_dir.as_deref(),
                &self.client_id,
                Arc::clone(&metrics),
            )?),
            _ => None,
        };
        let serving = Serving {
            backbone: self.inference.serves().then_some(backbone),
            model_file: (self.cache_dir.as_deref())
                .map(|dir| inference::store::model_path(dir, &self.client_id)),
            serving_log: (self.cache_dir.as_deref())
                .map(|dir| inference::serving_log::path(dir, &self.client_id)),
            inference: self.inference.clone(),
            predictor: inference::http::shared(None),
            gate: inference::http::Gate::new(self.inference.max_in_flight),
            drift: Arc::new(inference::DriftWatch::new(Some(Arc::clone(&metrics)))),
            head: Arc::new(inference::HeadWatch::default()),
            metrics,
            metrics_listen: self.metrics_listen,
            labelling,
        };
        Ok(AgentSetup {
            client_id: self.client_id.clone(),
            federation: self.federation.clone(),
            broker: self.broker.clone(),
            head: HeadConfig {
                classes: data.class_names.len(),
                ..head
            },
            tail,
            class_names: data.class_names,
            role: self.role,
            train: Arc::new(data.train),
            val: Arc::new(data.val),
            views: data.views,
            device: fedge_models::select_device(self.device, self.backend),
            runtime,
            memory_budget_mb: self.resources.memory_budget_mb,
            train_threads: self.resources.training_threads(),
            profile: self.profile.clone(),
            backbone: backbone_name,
            backbone_sha256,
            follows_federation_backbone,
            seed: self.seed,
            key,
            scan: data.scan,
            serving,
            privacy: self.privacy.clone(),
            slowdown: 1.0,
            state_file: self
                .cache_dir
                .as_ref()
                .map(|dir| dir.join(format!("{}.round.json", self.client_id))),
        })
    }

    /// The data read once, cut to the feature cache, split, featurised (cached on disk).
    fn loaded(&self, backbone: &Backbone, backbone_id: u64) -> Result<LocalData, SetupError> {
        let images = self.load_images(backbone)?.images;
        let (mut images, left_out) = resources::fit_feature_cache(
            images,
            resources::feature_bytes_per_image(backbone.card().feature_size, self.fedddl.enabled),
            self.resources.feature_cache_mb,
            self.seed,
        );
        if left_out > 0 {
            tracing::warn!(
                kept = images.len(),
                left_out,
                limit_mb = self.resources.feature_cache_mb,
                "local data cut to fit [resources] feature_cache_mb"
            );
        }
        if let (true, Some(card)) = (self.fedddl.enabled, &self.fedddl.detector) {
            let detector = fedge_models::Backbone::load(card).map_err(SetupError::Detector)?;
            images.masks = Some(crate::data::detector_masks(&detector, &images)?);
        }
        let class_names = images.class_names.clone();
        // An evaluation-only device scores everything it has; it keeps no training split.
        let (train, val) = match self.role {
            Role::Train => images.split(self.val_fraction, self.seed),
            Role::Evaluate => (images.subset(&[]), images),
        };
        let cache = self.cache_dir.as_deref();
        let views = if self.fedddl.enabled {
            let settings = views::ViewSettings {
                groups: self.fedddl.groups.max(1),
                pool: self.fedddl.counterfactuals.min(views::MAX_POOL),
                seed: self.seed,
            };
            let views = crate::views::ddl_views(backbone, backbone_id, &train, settings, cache)?;
            Some(Arc::new(views))
        } else {
            None
        };
        Ok(LocalData {
            train: features::extract(backbone, backbone_id, &train, cache)?,
            val: features::extract(backbone, backbone_id, &val, cache)?,
            class_names,
            views,
            scan: None,
        })
    }

    /// The site folder's first scan, kept for the rescans before each round.
    fn scanned(&self, backbone: Arc<Backbone>) -> Result<LocalData, SetupError> {
        if self.fedddl.enabled {
            return Err(SetupError::RescanWithFedDdl);
        }
        let site = self.data.site_folder().unwrap_or_default();
        let held_out = match self.role {
            Role::Train => self.val_fraction,
            Role::Evaluate => 1.0,
        };
        let budget = usize::try_from(self.resources.feature_cache_mb).unwrap_or(usize::MAX);
        let mut scan = SiteScan::new(&site, backbone, held_out, self.seed, budget);
        let first = scan.scan()?;
        Ok(LocalData {
            train: first.train,
            val: first.val,
            class_names: first.class_names,
            views: None,
            scan: Some(Arc::new(std::sync::Mutex::new(scan))),
        })
    }
}

/// A device's data as the agent starts with it.
struct LocalData {
    train: fedge_device::FeatureSet,
    val: fedge_device::FeatureSet,
    class_names: Vec<String>,
    views: Option<Arc<DdlViews>>,
    scan: Option<Arc<std::sync::Mutex<SiteScan>>>,
}
