//! A demo's data: the built-in digits split into devices (by site with `--sites`) and the
//! held-out target domain, as features of `digits-conv`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use fedge_device::{DdlViews, FeatureSet, Fnv64};
use fedge_edge::data::{DIGITS_ANGLES, Domain, ImageSet, digits_domains};
use fedge_edge::features;
use fedge_edge::views::{DEFAULT_GROUPS, DEFAULT_POOL, ViewSettings};
use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};
use fedge_models::{Backbone, HeadConfig};
use fedge_wire::Objective;

use super::options::DemoOptions;

/// One simulated device of a demo.
#[derive(Debug, Clone)]
pub struct DemoClient {
    /// Client id.
    pub id: String,
    /// Training features.
    pub train: Arc<FeatureSet>,
    /// Validation features.
    pub val: Arc<FeatureSet>,
    /// FedDDL's views of `train`, when the objective needs them.
    pub views: Option<Arc<DdlViews>>,
    /// The site the device is behind (`fedge demo --sites`), if any.
    pub site: Option<String>,
    /// Local DP on the device (a profile's `[privacy]`), if any.
    pub privacy: Option<fedge_device::local_dp::LocalPrivacy>,
}

/// The data of a demo: per-client features and the held-out target.
pub struct DemoData {
    /// Head sizes.
    pub head: HeadConfig,
    /// The devices.
    pub clients: Vec<DemoClient>,
    /// Held-out target domain, which an evaluation-only agent holds.
    pub target: Arc<FeatureSet>,
    /// The target domain's name (the evaluation-only agent is `unseen-<name>`).
    pub target_name: String,
    /// Validation sets scored with every new global head (model selection in `fedge eval`);
    /// empty for the demo.
    pub selection: Vec<fedge_device::train::DeviceData>,
}

/// Splits the built-in digits into client and target features through `digits-conv`.
pub fn prepare(options: &DemoOptions) -> anyhow::Result<DemoData> {
    anyhow::ensure!(options.clients >= 1, "--clients must be at least 1");
    let backbone = Backbone::from_bytes(
        digits_conv_card(),
        DIGITS_CONV_ONNX,
        Path::new("digits-conv.onnx"),
    )?;
    let backbone_id = Fnv64::of(DIGITS_CONV_ONNX);
    let mut domains = digits_domains(&DIGITS_ANGLES, options.seed);
    let target: Domain = domains.pop().context("no digits domains")?;
    // With sites, site s holds source domain s: the domain is the site.
    let sources = match options.sites {
        0 => domains.len(),
        sites => {
            anyhow::ensure!(
                sites <= domains.len() && sites <= options.clients,
                "--sites {sites} needs at most {} sites (the source domains) and at least as \
                 many --clients",
                domains.len()
            );
            sites
        }
    };
    let mut shares: Vec<Vec<ImageSet>> = Vec::new();
    for (d, domain) in domains.iter().enumerate() {
        let owners = (0..options.clients).filter(|c| c % sources == d).count();
        shares.push(if owners > 0 {
            domain.data.partition(owners, options.seed ^ d as u64)
        } else {
            Vec::new()
        });
    }
    let mut clients = Vec::new();
    for c in 0..options.clients {
        let d = c % sources;
        let part = shares[d].remove(0);
        let (train, val) = part.split(0.1, options.seed.wrapping_add(c as u64));
        let (id, site) = match options.sites {
            0 => (format!("site-{c}-{}", domains[d].name), None),
            _ => (
                format!("cam-{c}-{}", domains[d].name),
                Some(format!("site-{}", domains[d].name)),
            ),
        };
        let views = if options.train.objective == Objective::FedDdl {
            let settings = ViewSettings {
                groups: DEFAULT_GROUPS,
                pool: DEFAULT_POOL,
                seed: options.seed.wrapping_add(c as u64),
            };
            let views =
                fedge_edge::views::ddl_views(&backbone, backbone_id, &train, settings, None)?;
            Some(Arc::new(views))
        } else {
            None
        };
        let train = features::extract(&backbone, backbone_id, &train, None)?;
        let val = features::extract(&backbone, backbone_id, &val, None)?;
        clients.push(DemoClient {
            id,
            train: Arc::new(train),
            val: Arc::new(val),
            views,
            site,
            privacy: None,
        });
    }
    let target_features = features::extract(&backbone, backbone_id, &target.data, None)?;
    let head = HeadConfig::new(backbone.card().feature_size, target.data.classes())
        .with_hidden(options.hidden);
    Ok(DemoData {
        head,
        clients,
        target: Arc::new(target_features),
        target_name: target.name.clone(),
        selection: Vec::new(),
    })
}

/// The name of the demo's backbone, written into its releases.
pub const DIGITS_CONV: &str = "digits-conv";
