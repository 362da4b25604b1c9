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
    if options.sites > 0 {
        let sites = options.sites;
        anyhow::ensure!(
            sites <= domains.len() && sites <= options.clients,
            "--sites {sites} needs at most {} sites (the source domains) and at least as many \
             --clients",
            domains.len()
        );
    }
    // Every source domain is held by someone: with fewer devices than domains a device holds
    // several, with more a domain is split among its devices. With sites, site s holds the
    // domains d with d % sites == s and the devices c with c % sites == s.
    let holdings = holdings(domains.len(), options.clients, options.sites);
    let mut shares: Vec<Vec<ImageSet>> = (0..domains.len())
        .map(|d| {
            let owners = holdings.iter().filter(|h| h.domains == [d]).count();
            match owners {
                0 => Vec::new(),
                n => domains[d].data.partition(n, options.seed ^ d as u64),
            }
        })
        .collect();
    let mut clients = Vec::new();
    for (c, holding) in holdings.iter().enumerate() {
        let part = match holding.domains.as_slice() {
            [d] => shares[*d].remove(0),
            several => union(several.iter().map(|&d| domains[d].data.clone()).collect()),
        };
        let (train, val) = part.split(0.1, options.seed.wrapping_add(c as u64));
        let first = &domains[holding.domains[0]].name;
        let (id, site) = match options.sites {
            0 => (format!("site-{c}-{first}"), None),
            // A site is named after every domain it holds (site s: the domains d with
            // d mod sites = s), joined by `-` (`+` is an MQTT wildcard).
            sites => (
                format!("cam-{c}-{first}"),
                Some(format!(
                    "site-{}",
                    (domains.iter().skip(holding.site_domain).step_by(sites))
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join("-")
                )),
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

/// What one demo device holds: one domain (shared with the other devices that hold it) or
/// several whole ones, and the domain its site is named after.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holding {
    domains: Vec<usize>,
    site_domain: usize,
}

/// Deals `domains` source domains to `clients` devices (in `sites` groups, 0: one group), so
/// that every domain is held: within a group of k devices and m domains, device j holds domain
/// j % m when k ≥ m, else the domains i with i % k == j.
fn holdings(domains: usize, clients: usize, sites: usize) -> Vec<Holding> {
    let groups = sites.max(1);
    (0..clients)
        .map(|c| {
            let g = c % groups;
            let mine: Vec<usize> = (0..domains).filter(|d| d % groups == g).collect();
            let devices: Vec<usize> = (0..clients).filter(|k| k % groups == g).collect();
            let j = devices.iter().position(|&k| k == c).unwrap_or(0);
            let held = if devices.len() >= mine.len() {
                vec![mine[j % mine.len()]]
            } else {
                (0..mine.len())
                    .filter(|i| i % devices.len() == j)
                    .map(|i| mine[i])
                    .collect()
            };
            Holding {
                domains: held,
                site_domain: mine[0],
            }
        })
        .collect()
}

/// The images of `sets` (same shape and classes) as one set.
fn union(sets: Vec<ImageSet>) -> ImageSet {
    let mut sets = sets.into_iter();
    let mut all = sets.next().expect("at least one set");
    for set in sets {
        all.images.extend(set.images);
        all.labels.extend(set.labels);
        all.masks = match (all.masks.take(), set.masks) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            _ => None,
        };
    }
    all
}

/// The name of the demo's backbone, written into its releases.
pub const DIGITS_CONV: &str = "digits-conv";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_domain_is_held_whatever_the_counts() {
        for (domains, clients, sites) in [
            (5, 3, 0),
            (5, 5, 0),
            (5, 12, 0),
            (5, 3, 3),
            (5, 5, 3),
            (5, 7, 2),
            (5, 1, 0),
        ] {
            let held = holdings(domains, clients, sites);
            assert_eq!(held.len(), clients);
            let mut seen: Vec<usize> = held.iter().flat_map(|h| h.domains.clone()).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(
                seen,
                (0..domains).collect::<Vec<_>>(),
                "{domains} {clients} {sites}: {held:?}"
            );
            if sites > 0 {
                // A device's domains belong to its site.
                for (c, h) in held.iter().enumerate() {
                    assert!(h.domains.iter().all(|d| d % sites == c % sites), "{held:?}");
                    assert_eq!(h.site_domain, c % sites, "{held:?}");
                }
            }
        }
    }
}
