//! `fedge demo --sites S`: each site its own embedded broker, site aggregator (the
//! coordinator's relay mode with its upstream link, as `fedge-coordinator run` with
//! `role = "site"` runs them) and devices, which hold the site's rotated domains (site s: the
//! domains d with d mod S = s; one each when S is the number of source domains), the site
//! named after them. The global coordinator sees the sites as its clients.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use fedge_coordinator::boot::{Plan, Start};
use fedge_coordinator::io::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::io::driver::{self, DriverOptions, Relay};
use fedge_coordinator::round::{DeviceKeys, RelayConfig, RoundConfig};
use fedge_coordinator::site::link::{self, LinkOptions};
use fedge_coordinator::strategy::StrategyConfig;
use fedge_mqtt::BrokerConfig;
use fedge_wire::{DeviceKey, Objective};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::data::{DIGITS_CONV, DemoData};
use super::options::DemoOptions;

/// A site's aggregator or link, running until the demo's stop.
pub type SiteTask = JoinHandle<anyhow::Result<()>>;

/// One running site of a demo.
pub struct DemoSite {
    /// The site's client id in the global federation (`site-<domain>`), which is also its
    /// devices' federation.
    pub name: String,
    /// The site's broker, where its devices connect.
    pub broker: BrokerConfig,
    /// Its devices' keys, when the demo runs with keys.
    pub keys: Option<Arc<DeviceKeys>>,
}

/// A site's figures in the demo's JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SiteFigures {
    /// Devices behind the site.
    pub devices: usize,
    /// Training samples of those devices.
    pub samples: usize,
    /// FedOMG's weight of the site in the last round (none for other strategies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
}

/// The sites of `data`'s devices, by name, with each one's devices (indices into
/// `data.clients`).
pub fn members(data: &DemoData) -> BTreeMap<String, Vec<usize>> {
    let mut sites: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, client) in data.clients.iter().enumerate() {
        if let Some(site) = &client.site {
            sites.entry(site.clone()).or_default().push(i);
        }
    }
    sites
}

/// Each site's figures, with FedOMG's weights of the last round.
pub fn figures(data: &DemoData, gamma: &BTreeMap<String, f64>) -> BTreeMap<String, SiteFigures> {
    members(data)
        .into_iter()
        .map(|(name, devices)| {
            let figures = SiteFigures {
                devices: devices.len(),
                samples: devices.iter().map(|&i| data.clients[i].train.len()).sum(),
                gamma: gamma.get(&name).copied(),
            };
            (name, figures)
        })
        .collect()
}

/// Starts every site's broker, aggregator and link. `global` is the global federation's
/// broker, `site_keys` the sites' keys there (when the demo runs with keys). Returns the sites
/// and the tasks to await after `stop`.
pub fn start(
    options: &DemoOptions,
    data: &DemoData,
    global: &BrokerConfig,
    site_keys: Option<&DeviceKeys>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<(Vec<DemoSite>, Vec<SiteTask>)> {
    anyhow::ensure!(
        options.train.objective != Objective::FedDim,
        "--sites cannot run FedDIM: its compact class statistics do not merge at a site \
         (docs/sites.md); choose another --objective"
    );
    let mut sites = Vec::new();
    let mut tasks = Vec::new();
    for (name, devices) in members(data) {
        let limits = BrokerLimits {
            max_payload: options.max_packet + 64 * 1024,
            ..BrokerLimits::default()
        };
        let embedded = start_embedded(([127, 0, 0, 1], 0).into(), &limits)?;
        let broker = BrokerConfig {
            max_packet: options.max_packet,
            ..BrokerConfig::at(embedded.addr.ip().to_string(), embedded.addr.port())
        };
        let keys = site_keys.map(|_| {
            let keys: DeviceKeys = (devices.iter())
                .map(|&i| {
                    (
                        data.clients[i].id.clone(),
                        fedge_coordinator::store::keys::generate(),
                    )
                })
                .collect();
            Arc::new(keys)
        });
        let config = RoundConfig {
            federation: name.clone(),
            classes: fedge_wire::numbered_classes(data.head.classes),
            backbone: DIGITS_CONV.into(),
            head: Some(data.head.clone()),
            run: rand::random(),
            rounds: 0,
            min_clients: devices.len(),
            min_updates: 1,
            round_timeout_ms: (options.round_timeout_s * 1000.0) as u64,
            train: options.train.clone(),
            seed: options.seed,
            auth: keys.clone(),
            relay: Some(RelayConfig {
                site: name.clone(),
                margin_ms: (options.round_timeout_s * 100.0) as u64,
            }),
            ..RoundConfig::default()
        }
        .with_objective(
            options.train.objective,
            &data.head,
            options.insight_momentum,
        );
        let initial = vec![
            0.0;
            fedge_wire::ModelLayout::new(
                data.head.clone(),
                options.train.objective.carries_generator(),
            )
            .num_params()
        ];
        // A site aggregates its devices with FedAvg.
        let plan = Plan {
            round: config,
            strategy: StrategyConfig::default(),
            noise_seed: None,
            initial,
        };
        let rounds = plan.boot(Start::default())?.rounds;
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let (outbox, outbox_rx) = mpsc::unbounded_channel();
        let key: Option<DeviceKey> = site_keys.and_then(|k| k.get(&name).cloned());
        let link_options = LinkOptions {
            broker: global.clone(),
            federation: options.federation.clone(),
            site: name.clone(),
            key,
            backbone: DIGITS_CONV.into(),
            pending_file: None,
            task_file: None,
        };
        let client_id = format!("fedge-site-{name}-{:08x}", rand::random::<u32>());
        let driver_options = DriverOptions::new(broker.clone(), &name, client_id);
        let link_stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            link::run(link_options, inbox_tx, outbox_rx, link_stop)
                .await
                .context("the site's link")?;
            Ok(())
        }));
        let relay = Relay { inbox, outbox };
        let site_stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            driver::run_site(rounds, driver_options, relay, None, site_stop)
                .await
                .context("the site aggregator")?;
            Ok(())
        }));
        sites.push(DemoSite { name, broker, keys });
    }
    Ok((sites, tasks))
}
