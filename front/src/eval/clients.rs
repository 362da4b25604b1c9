//! The participants of a benchmark run as the devices hold them: the source clients (one per
//! source domain, or its parts with `multi` and `sites`) with their rows and FedDDL's views,
//! and the held-out site's calibration and scored rows standardised as it would serve them.

use std::sync::Arc;

use fedge_device::FeatureSet;
use fedge_device::site_norm::{FeatureNorm, FeatureSummary, SiteNorm, standardise};
use fedge_device::train::DeviceData;
use fedge_models::HeadConfig;

use super::{DomainData, Scenario, TargetSite};

/// A client of a run: its id, its site (the source domain), and its rows with FedDDL's views
/// of its training split and its site statistics, as the device holds them.
pub(super) struct Client {
    pub(super) name: String,
    pub(super) site: String,
    pub(super) data: DeviceData,
}

/// The clients of a run holding out `domains[target]`, each with FedDDL's views of its own
/// training rows when the domains carry a view source.
pub(super) fn clients(
    domains: &[DomainData],
    target: usize,
    scenario: Scenario,
    seed: u64,
) -> anyhow::Result<Vec<Client>> {
    let sources = domains.iter().enumerate().filter(|(d, _)| *d != target);
    let views =
        |d: &DomainData, rows: &[usize]| d.views.as_ref().map(|v| v.views(rows)).transpose();
    let mut out = Vec::new();
    match scenario {
        Scenario::Lodo => {
            for (_, d) in sources {
                let all: Vec<usize> = (0..d.train.len()).collect();
                out.push(Client {
                    name: d.name.clone(),
                    site: d.name.clone(),
                    data: DeviceData::new(
                        Arc::clone(&d.train),
                        Arc::clone(&d.val),
                        views(d, &all)?,
                    ),
                });
            }
        }
        Scenario::Multi {
            clients_per_domain: parts,
            ..
        }
        | Scenario::Sites { devices: parts } => {
            let parts = parts.max(1);
            for (i, d) in sources {
                let salt = seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let train = partition_indices(d.train.len(), parts, salt);
                let val = partition(&d.val, parts, salt ^ 1);
                for (c, (t, v)) in train.into_iter().zip(val).enumerate() {
                    if t.is_empty() {
                        continue;
                    }
                    out.push(Client {
                        name: format!("{}-{c:02}", d.name),
                        site: d.name.clone(),
                        data: DeviceData::new(
                            Arc::new(d.train.rows(&t)),
                            Arc::new(v),
                            views(d, &t)?,
                        ),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The held-out site's calibration and scored rows (`eval::site`) as its head takes them:
/// standardised with the statistics its calibration rows give under `norm` (unlabelled, as a
/// serving site holds them: `SiteNorm::unlabelled`, with the round's `pooled` summary and the
/// head `params` to label them; none of the scored rows among them unless `--calibration all`).
pub(super) fn standardised_site(
    site: &TargetSite,
    norm: FeatureNorm,
    pooled: Option<&FeatureSummary>,
    head: &HeadConfig,
    params: &[f32],
) -> (FeatureSet, FeatureSet) {
    let stats = SiteNorm { norm, pooled }.unlabelled(&site.calibration, head, params);
    match stats {
        Some(stats) => (
            standardise(&stats, &site.calibration),
            standardise(&stats, &site.scored),
        ),
        None => (site.calibration.clone(), site.scored.clone()),
    }
}

/// Splits `set` into `parts` disjoint parts at random (seeded), sizes within one.
pub fn partition(set: &FeatureSet, parts: usize, seed: u64) -> Vec<FeatureSet> {
    partition_indices(set.len(), parts, seed)
        .iter()
        .map(|mine| set.rows(mine))
        .collect()
}

/// The rows of each part of [`partition`].
fn partition_indices(n: usize, parts: usize, seed: u64) -> Vec<Vec<usize>> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let parts = parts.max(1);
    (0..parts)
        .map(|p| order.iter().skip(p).step_by(parts).copied().collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_disjoint_complete_and_reproducible() {
        let set = FeatureSet {
            dim: 2,
            features: (0..20).map(|v| v as f32).collect(),
            labels: (0..10).collect(),
        };
        let parts = partition(&set, 3, 7);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [4, 3, 3]);
        let mut labels: Vec<u32> = parts.iter().flat_map(|p| p.labels.clone()).collect();
        labels.sort();
        assert_eq!(labels, (0..10).collect::<Vec<_>>(), "disjoint and complete");
        for p in &parts {
            for (row, y) in p.features.chunks(2).zip(&p.labels) {
                assert_eq!(
                    row,
                    &[*y as f32 * 2.0, *y as f32 * 2.0 + 1.0],
                    "rows stay whole"
                );
            }
        }
        assert_eq!(partition(&set, 3, 7), parts);
        assert_ne!(partition(&set, 3, 8), parts);
    }
}
