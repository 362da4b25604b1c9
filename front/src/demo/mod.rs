//! `fedge demo`: one command, a real federation; with `attack`, a hostile participant next to
//! it ([`hostile`]). (`fedge demo --drift`, the story of a site that changes after deployment,
//! composes the lab's benchmarks: `bench::story`.)

mod data;
pub mod hostile;
mod options;
pub mod served;
pub mod site;
pub mod sites;

pub use data::{DIGITS_CONV, DemoClient, DemoData, prepare};
pub use options::DemoOptions;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use fedge_coordinator::boot::{Plan, Start};
use fedge_coordinator::io::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::{DriverEvent, DriverOptions, RoundConfig, RoundReport, driver};

use fedge_device::{FeatureSet, accuracy};
use fedge_edge::AgentSetup;
use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};
use fedge_models::{Accelerator, HeadConfig, ModelLayout};
use fedge_mqtt::BrokerConfig;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

/// One row of the per-round table, as written to `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundRow {
    /// Round number.
    pub round: u64,
    /// Accuracy of the global head on the held-out 75° domain after this round.
    pub target_accuracy: Option<f32>,
    /// Clients' validation accuracy of the global head they received this round.
    pub source_val_accuracy: Option<f32>,
    /// Clients whose update was aggregated.
    pub clients: usize,
    /// Update bytes received by the coordinator.
    pub bytes_up: u64,
    /// Task bytes sent, times the clients selected.
    pub bytes_down: u64,
    /// Seconds from task publication to aggregation.
    pub seconds: f64,
    /// L2 norm of the global parameters after the round.
    pub params_norm: f32,
    /// Mean accuracy of the new global head on [`DemoData::selection`], when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection_accuracy: Option<f32>,
    /// What the evaluation-only site holding the held-out domain reported for this round's
    /// model, by its client id (its figure is `target_accuracy`).
    pub site_accuracy: std::collections::BTreeMap<String, f32>,
    /// Whether the round was abandoned (nothing aggregated).
    #[serde(skip)]
    pub aborted: bool,
    /// FedOMG's weight per client (empty for other strategies).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gamma: std::collections::BTreeMap<String, f64>,
    /// Under central DP: the ε spent so far, at the result's `delta`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// Buffered mode: the version's updates by staleness (index: versions behind).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub staleness: Vec<u64>,
    /// The clients whose update the norm guard scaled down this round (`max_norm_ratio`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub norm_scaled: Vec<String>,
}

/// One line for a run's norm-guard scalings (the guard doing its job, which the log keeps at
/// INFO): how many updates were scaled down, and whose; `None` when none was.
pub fn norm_scaled_summary<'a>(scaled: impl IntoIterator<Item = &'a String>) -> Option<String> {
    let mut by_client = std::collections::BTreeMap::<&str, u64>::new();
    for client in scaled {
        *by_client.entry(client.as_str()).or_default() += 1;
    }
    let total: u64 = by_client.values().sum();
    (total > 0).then(|| {
        let whom: Vec<String> = (by_client.iter())
            .map(|(client, n)| format!("{client} {n}"))
            .collect();
        format!(
            "the norm guard scaled {total} update{} down to max_norm_ratio × the round's median \
             norm ({})",
            if total == 1 { "" } else { "s" },
            whom.join(", ")
        )
    })
}

/// The outcome of a demo.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemoResult {
    /// Per-round rows.
    pub rounds: Vec<RoundRow>,
    /// Strategy name.
    pub strategy: String,
    /// Target accuracy after the last round.
    pub final_target_accuracy: Option<f32>,
    /// Target accuracy of the initial, untrained head.
    pub initial_target_accuracy: f32,
    /// Global parameters after the last round.
    #[serde(skip)]
    pub final_params: Vec<f32>,
    /// Initial global parameters.
    #[serde(skip)]
    pub initial_params: Vec<f32>,
    /// Updates rejected, by reason.
    pub rejected: std::collections::BTreeMap<String, u64>,
    /// Number of parameters in the model (the head, and Stable-FedADG's generator).
    pub num_params: usize,
    /// Wall-clock seconds of the federation (after data preparation).
    pub seconds: f64,
    /// Per attack of the hostile participant: packets sent, rejections traced to it (the
    /// coordinator's by reason, the broker's refusals) and the effects it observed.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub attacks: std::collections::BTreeMap<crate::attack::AttackKind, crate::attack::KindReport>,
    /// Rejections traced to no attack, by reason.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub attacks_untraced: std::collections::BTreeMap<String, u64>,
    /// The model the coordinator released after the last aggregated round.
    #[serde(skip)]
    pub release: Option<fedge_wire::ModelRelease>,
    /// Where `fedge demo --export` wrote it as ONNX.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<std::path::PathBuf>,
    /// With sites: each site's devices, samples and FedOMG weight in the last round.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sites: std::collections::BTreeMap<String, sites::SiteFigures>,
    /// Under central DP: the δ every round's `epsilon` is at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// What the per-site choice serves the unseen site with the final release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_at_target: Option<served::Served>,
}

/// Runs the federation; `on_round` sees every round as it ends.
pub async fn run(
    options: &DemoOptions,
    data: &DemoData,
    mut on_round: impl FnMut(&RoundRow),
) -> anyhow::Result<DemoResult> {
    let broker = match &options.broker {
        Some(b) => BrokerConfig {
            max_packet: options.max_packet,
            ..b.clone()
        },
        None => {
            let limits = BrokerLimits {
                max_payload: options.max_packet + 64 * 1024,
                ..BrokerLimits::default()
            };
            let embedded = start_embedded(([127, 0, 0, 1], 0).into(), &limits)?;
            BrokerConfig {
                max_packet: options.max_packet,
                ..BrokerConfig::at(embedded.addr.ip().to_string(), embedded.addr.port())
            }
        }
    };
    let layout = ModelLayout::new(
        data.head.clone(),
        options.train.objective.carries_generator(),
    );
    let initial = layout.init_flat(options.seed);
    let initial_target_accuracy = accuracy(&data.head, layout.head_part(&initial), &data.target)?;
    let attacked = !options.attack.is_empty();
    let auth = options.auth || (attacked && !options.attack_keyless);
    // The attacking devices that take part in rounds, with the key they were provisioned with.
    let insider = (auth && attacked).then(|| {
        let ids: Vec<String> = options
            .attack
            .iter()
            .filter(|k| k.takes_part())
            .map(|k| k.client_id(hostile::PREFIX))
            .collect();
        (ids, fedge_coordinator::store::keys::generate())
    });
    anyhow::ensure!(
        options.sites == 0 || !attacked,
        "--attack runs against devices of one broker; leave out --sites"
    );
    // The coordinator's own refusals (buffered with FedOMG, FedDIM, FedDDL, central DP).
    let combined = fedge_coordinator::config::Combined {
        strategy: options.strategy.strategy,
        objective: options.train.objective,
        central_dp: options.privacy.as_ref().and_then(|p| p.central()).is_some(),
        role: fedge_coordinator::config::Role::Global,
    };
    fedge_coordinator::config::check_aggregation(&options.aggregation, combined)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The global coordinator's clients: the devices, or with sites the sites.
    let participants: Vec<String> = match options.sites {
        0 => data.clients.iter().map(|c| c.id.clone()).collect(),
        _ => sites::members(data).into_keys().collect(),
    };
    let per_round = options
        .per_round
        .unwrap_or(participants.len())
        .clamp(1, participants.len().max(1));
    let unseen = format!("unseen-{}", data.target_name);
    let config = RoundConfig {
        classes: fedge_wire::numbered_classes(data.head.classes),
        backbone: DIGITS_CONV.into(),
        head: Some(data.head.clone()),
        rounds: options.rounds,
        fraction: per_round as f32 / participants.len().max(1) as f32,
        // The machine selects no fewer than `min_clients`: the sample is the floor.
        min_clients: per_round,
        // Under DP devices are drawn each round (Poisson): a round takes whoever was drawn.
        min_updates: if options.privacy.is_some() {
            1
        } else {
            per_round
        },
        round_timeout_ms: (options.round_timeout_s * 1000.0) as u64,
        train: options.train.clone(),
        seed: options.seed,
        privacy: options.privacy.as_ref().and_then(|p| p.central()),
        auth: auth.then(|| {
            let keys = (participants.iter())
                .chain([&unseen])
                .map(|c| (c.clone(), fedge_coordinator::store::keys::generate()));
            let insiders = insider
                .iter()
                .flat_map(|(ids, key)| ids.iter().map(move |id| (id.clone(), key.clone())));
            Arc::new(keys.chain(insiders).collect())
        }),
        aggregation: options.aggregation.clone(),
        ..RoundConfig::default()
    }
    .with_objective(
        options.train.objective,
        &data.head,
        options.insight_momentum,
    );
    let keys = config.auth.clone();
    if let Some(privacy) = &options.privacy {
        anyhow::ensure!(
            options.sites == 0,
            "--dp-noise with --sites: a site's aggregate is not a device's update"
        );
        privacy.check(
            &options.train,
            fedge_coordinator::config::Role::Global,
            config.max_update_norm,
        )?;
    }
    let plan = Plan {
        round: config,
        strategy: options.strategy.clone(),
        noise_seed: options.privacy.as_ref().and_then(|p| p.seed),
        initial: initial.clone(),
    };
    let rounds = plan.boot(Start::default())?.rounds;
    let strategy_name = rounds.strategy_name().to_string();
    let initial_len = initial.len();
    let (head, selection) = (data.head.clone(), data.selection.clone());
    let norm = options.train.feature_norm;
    let scored = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&scored);
    // Model selection in `fedge eval` scores every new head on the sources' validation sets;
    // the target is scored by the unseen site's agent, as in a deployment.
    let evaluator: Option<fedge_coordinator::Evaluator> = (!selection.is_empty()).then(|| {
        Box::new(
            move |params: &[f32], pooled: Option<&fedge_wire::FeatureSummary>| {
                let params = layout.head_part(params);
                // Each source's validation rows as its device standardises them this round.
                let sets: Vec<Arc<FeatureSet>> = (selection.iter())
                    .map(|d| d.scored_val(d.stats(norm, pooled, head.classes).as_ref()))
                    .collect();
                if let Ok(mut log) = log.lock() {
                    log.push(pooled_accuracy(&head, params, &sets));
                }
                None
            },
        ) as fedge_coordinator::Evaluator
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let mut hostile = (!options.attack.is_empty()).then(|| {
        hostile::Hostile::start(
            &broker,
            &options.federation,
            &options.attack,
            options.attack_rate,
            options.seed,
            insider.map(|(_, key)| key),
            stop_rx.clone(),
        )
    });
    let mut agents = Vec::new();
    let unseen_key = keys.as_ref().and_then(|k| k.get(&unseen).cloned());
    let mut site = site::SiteWatcher::start(
        &broker,
        &options.federation,
        &unseen,
        unseen_key.clone(),
        stop_rx.clone(),
    )?;
    let evaluation_only = AgentSetup {
        client_id: unseen.clone(),
        role: fedge_wire::Role::Evaluate,
        train: Arc::new(FeatureSet::default()),
        val: Arc::clone(&data.target),
        views: None,
        key: unseen_key,
        ..agent_setup(options, data, &broker)
    };
    agents.push(tokio::spawn(fedge_edge::run_agent(
        evaluation_only,
        stop_rx.clone(),
    )));
    let (demo_sites, site_tasks) = match options.sites {
        0 => (Vec::new(), Vec::new()),
        _ => sites::start(options, data, &broker, keys.as_deref(), &stop_rx)?,
    };
    let devices = data.clients.len();
    for (i, client) in data.clients.iter().enumerate() {
        // A device behind a site talks to its site's broker, in its site's federation.
        let site = (client.site.as_ref()).and_then(|s| demo_sites.iter().find(|d| &d.name == s));
        let (at, federation, site_keys) = match site {
            Some(site) => (&site.broker, site.name.clone(), site.keys.as_ref()),
            None => (&broker, options.federation.clone(), keys.as_ref()),
        };
        let setup = AgentSetup {
            client_id: client.id.clone(),
            federation,
            train: client.train.clone(),
            val: client.val.clone(),
            views: client.views.clone(),
            key: site_keys.and_then(|k| k.get(&client.id).cloned()),
            privacy: client.privacy.clone(),
            slowdown: options.slowdown(i, devices),
            ..agent_setup(options, data, at)
        };
        agents.push(tokio::spawn(fedge_edge::run_agent(setup, stop_rx.clone())));
    }
    // Not the guessable `fedge-coordinator-<federation>`: on a broker that does not bind
    // client ids to credentials (the embedded one), whoever connects under the coordinator's id
    // pushes it off (`fedge attack --kind id-takeover`).
    let client_id = format!(
        "fedge-coordinator-{}-{:08x}",
        options.federation,
        rand::random::<u32>()
    );
    // Under attack, the coordinator takes operator commands (with a key nobody has), so that
    // replayed and forged ones meet the checks a deployment's would.
    let operator_key = (!options.attack.is_empty()).then(fedge_coordinator::store::keys::generate);
    let driver_options = DriverOptions {
        home_assistant: options.home_assistant,
        operator_key,
        ..DriverOptions::new(broker.clone(), &options.federation, client_id)
    };
    let start = Instant::now();
    let coordinator = tokio::spawn(driver::run(
        rounds,
        driver_options,
        evaluator,
        Some(events_tx),
        stop_rx.clone(),
    ));
    let mut rows = Vec::new();
    let mut abandoned = 0u64;
    let mut last_aggregated = None;
    let mut rejected = std::collections::BTreeMap::new();
    // Under attack the federation may stall (no round ends): give up after four round
    // timeouts (a minute at least) without one.
    let idle = std::time::Duration::from_secs_f64((4.0 * options.round_timeout_s).max(60.0));
    loop {
        let event = match &hostile {
            Some(_) => match tokio::time::timeout(idle, events_rx.recv()).await {
                Ok(event) => event,
                Err(_) => {
                    tracing::warn!(?idle, "no round ended under attack; giving up");
                    let _ = stop_tx.send(true);
                    continue;
                }
            },
            None => events_rx.recv().await,
        };
        let Some(event) = event else {
            break;
        };
        match event {
            DriverEvent::RoundEnded { report, .. } => {
                let mut row = row_of(&report, None);
                if report.aggregated {
                    last_aggregated = Some(report.round);
                    // The unseen site scores the release within milliseconds of receiving it.
                    let patience = std::time::Duration::from_secs(60);
                    match site.score_of(report.round, patience).await {
                        Some(score) => {
                            row.target_accuracy = Some(score.accuracy);
                            row.site_accuracy.insert(unseen.clone(), score.accuracy);
                        }
                        None => tracing::warn!(
                            round = report.round,
                            "the unseen site did not score the round's model"
                        ),
                    }
                } else {
                    abandoned += 1;
                }
                on_round(&row);
                rows.push(row);
                // Abandoned rounds do not count towards `rounds`: a federation the attacks
                // beat would run for ever, so the demo gives up after as many again.
                if hostile.is_some() && abandoned > options.rounds {
                    tracing::warn!(abandoned, "the attacks stopped the federation; giving up");
                    let _ = stop_tx.send(true);
                }
            }
            DriverEvent::Rejected { client, reason, .. } => {
                if let Some(hostile) = hostile.as_mut() {
                    hostile.rejected(&client, reason);
                }
                *rejected.entry(reason.to_string()).or_insert(0u64) += 1
            }
        }
    }
    let rounds = coordinator.await.context("coordinator task panicked")??;
    let seconds = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for agent in agents {
        agent.await.context("edge task panicked")??;
    }
    for task in site_tasks {
        task.await.context("a site task panicked")??;
    }
    let hostile = match hostile {
        Some(h) => h.finish().await?,
        None => hostile::HostileReport::default(),
    };
    let scored = scored.lock().map(|v| v.clone()).unwrap_or_default();
    for (row, val) in rows.iter_mut().filter(|r| !r.aborted).zip(scored) {
        row.selection_accuracy = Some(val);
    }
    let site_figures = match options.sites {
        0 => Default::default(),
        _ => {
            let last = rows.iter().rev().find(|r| !r.aborted);
            sites::figures(data, &last.map(|r| r.gamma.clone()).unwrap_or_default())
        }
    };
    let release = last_aggregated.and_then(|round| rounds.release(round));
    let served_at_target = (release.as_ref())
        .and_then(|r| served::at_site(&data.target, r, options.backend, options.seed));
    Ok(DemoResult {
        final_target_accuracy: rows
            .iter()
            .rev()
            .find(|r| r.target_accuracy.is_some())
            .and_then(|r| r.target_accuracy),
        rounds: rows,
        strategy: strategy_name,
        initial_target_accuracy,
        final_params: rounds.params().to_vec(),
        initial_params: initial,
        rejected,
        num_params: initial_len,
        seconds,
        attacks: hostile.attacks,
        attacks_untraced: hostile.untraced,
        release,
        export: None,
        sites: site_figures,
        delta: options
            .privacy
            .as_ref()
            .and_then(|p| p.central())
            .map(|dp| dp.delta),
        served_at_target,
    })
}

/// Writes the demo's released model as ONNX (`dir/model.onnx`, backbone `digits-conv` and
/// head) and its card (`dir/model.toml`, with the class list); a site-normalised model carries
/// the statistics of `site`, the features of the site that will run it (the unseen one).
pub fn export(
    release: &fedge_wire::ModelRelease,
    site: &FeatureSet,
    dir: &std::path::Path,
) -> anyhow::Result<fedge_coordinator::export::Exported> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let card = digits_conv_card();
    let stats = match release.feature_norm {
        fedge_wire::FeatureNorm::None => None,
        _ => Some(
            fedge_device::site_norm::release_stats(release, &FeatureSet::default(), site)
                .context("the unseen site has no features to take statistics from")?,
        ),
    };
    Ok(fedge_coordinator::export::write_export(
        release,
        &card,
        DIGITS_CONV_ONNX,
        stats.as_ref(),
        &dir.join("model.onnx"),
    )?)
}

/// What every agent of a demo shares.
fn agent_setup(options: &DemoOptions, data: &DemoData, broker: &BrokerConfig) -> AgentSetup {
    AgentSetup {
        client_id: String::new(),
        federation: options.federation.clone(),
        broker: broker.clone(),
        head: data.head.clone(),
        class_names: fedge_wire::numbered_classes(data.head.classes),
        role: fedge_wire::Role::Train,
        train: Arc::new(FeatureSet::default()),
        val: Arc::new(FeatureSet::default()),
        views: None,
        tail: None,
        device: fedge_models::select_device(Accelerator::Cpu, options.backend),
        runtime: fedge_models::Backbone::tract_report(),
        memory_budget_mb: 0,
        // Five agents share the machine's cores: each trains on one thread.
        train_threads: 1,
        profile: "demo".into(),
        backbone: DIGITS_CONV.into(),
        backbone_sha256: None,
        follows_federation_backbone: false,
        seed: options.seed,
        key: None,
        scan: None,
        serving: Default::default(),
        privacy: None,
        state_file: None,
        slowdown: 1.0,
    }
}

/// Accuracy of `params` over the union of `sets` (each set weighted by its size).
pub fn pooled_accuracy(head: &HeadConfig, params: &[f32], sets: &[Arc<FeatureSet>]) -> f32 {
    let total: usize = sets.iter().map(|s| s.len()).sum();
    let correct: f64 = sets
        .iter()
        .map(|s| accuracy(head, params, s).unwrap_or(0.0) as f64 * s.len() as f64)
        .sum();
    (correct / total.max(1) as f64) as f32
}

fn row_of(report: &RoundReport, target_accuracy: Option<f32>) -> RoundRow {
    RoundRow {
        round: report.round,
        target_accuracy: if report.aggregated {
            target_accuracy
        } else {
            None
        },
        source_val_accuracy: report.source_val_accuracy,
        clients: report.reported.len(),
        bytes_up: report.bytes_up,
        bytes_down: report.bytes_down,
        seconds: report.duration_ms as f64 / 1000.0,
        params_norm: report.params_norm,
        selection_accuracy: None,
        site_accuracy: std::collections::BTreeMap::new(),
        aborted: !report.aggregated,
        gamma: report
            .aggregation
            .as_ref()
            .map(|a| a.gamma.clone())
            .unwrap_or_default(),
        epsilon: report.privacy.as_ref().map(|p| p.epsilon),
        staleness: report.staleness.clone(),
        norm_scaled: (report.norm_clipped.iter())
            .map(|c| c.client.clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_norm_guard_summary_counts_updates_per_client_on_one_line() {
        let scaled = ["blurred", "noisy", "blurred"].map(String::from);
        let line = super::norm_scaled_summary(&scaled).unwrap();
        assert!(
            line.starts_with("the norm guard scaled 3 updates down"),
            "{line}"
        );
        assert!(line.ends_with("(blurred 2, noisy 1)"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(super::norm_scaled_summary(&[]), None);
    }
}
