//! `fedge-coordinator run`: the daemon, from its configuration to its driver (global, or a site
//! aggregator with its link upstream), through the one composition root (`boot::Plan`).

use std::path::PathBuf;

use anyhow::Context;
use fedge_coordinator::boot::Start;
use fedge_coordinator::config::{CoordinatorConfig, Role};
use fedge_coordinator::io::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::site::{self, link::LinkOptions};
use fedge_coordinator::store::{audit, checkpoint, journal, keys};
use fedge_coordinator::{DriverOptions, driver};
use fedge_wire::ModelLayout;
use sha2::{Digest, Sha256};

pub async fn run(path: PathBuf) -> anyhow::Result<()> {
    let config = CoordinatorConfig::load(&path)?;
    if config.embedded_broker {
        let addr = format!("{}:{}", config.broker.host, config.broker.port)
            .parse()
            .context("embedded_broker needs [broker].host to be an IP address")?;
        let broker = start_embedded(addr, &BrokerLimits::default())?;
        tracing::info!(addr = %broker.addr, "embedded broker listening");
    }
    // Stable-FedADG's generator travels after the head.
    let layout = ModelLayout::new(
        config.head.clone(),
        config.train.objective.carries_generator(),
    );
    let initial = match &config.initial_params {
        Some(file) => read_f32_file(file, layout.num_params())?,
        None => layout.init_flat(config.seed),
    };
    if let Some(dp) = config.privacy.central() {
        tracing::info!(
            clip_norm = dp.clip_norm,
            noise_multiplier = dp.noise_multiplier,
            delta = dp.delta,
            target_epsilon = ?dp.target_epsilon,
            sampling = %dp.sampling,
            seeded = config.privacy.seed.is_some(),
            "central differential privacy on (DP-FedAvg)"
        );
        if config.privacy.seed.is_some() {
            tracing::warn!("[privacy] seed is set: the noise is reproducible, for tests only");
        }
    }
    if let Some(advice) = config.aggregation.advice() {
        tracing::warn!("{advice}");
    }
    if config.stay_up && config.auth.operator_key_file.is_none() {
        anyhow::bail!(
            "stay_up = true needs [auth] operator_key_file: only an operator command \
             (fedge-coordinator ctl new-run) starts the next run"
        );
    }
    let mut plan = config.plan(initial);
    // A fresh federation's run; a resumed checkpoint brings its own.
    plan.round.run = rand::random();
    match config.device_keys()? {
        Some(keys) => {
            tracing::info!(devices = keys.len(), "device authentication on");
            plan.round.auth = Some(std::sync::Arc::new(keys));
        }
        None => tracing::warn!(
            "no [auth] keys_file: any client that reaches the broker can take part and nothing \
             is authenticated; see docs/mosquitto.md and `fedge-coordinator keygen`"
        ),
    }
    let checkpoint_path = config.state_dir.as_ref().map(|d| d.join("checkpoint.bin"));
    let journal_path = config.state_dir.as_ref().map(|d| d.join("journal.bin"));
    plan.round.journal = journal_path.is_some();
    if let Some(dir) = &config.state_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create state_dir {}", dir.display()))?;
    }
    let mut start = Start::default();
    if let Some(path) = &checkpoint_path {
        start.checkpoint = checkpoint::load(path)?;
    }
    if let Some(dir) = &config.spill_dir {
        let bytes = config.spill_max_mb.saturating_mul(1 << 20);
        let file = fedge_coordinator::updates::spill::SpillFile::create(dir, bytes)
            .with_context(|| format!("cannot create the spill file in {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), mb = config.spill_max_mb, "rounds beyond update_memory_mb spill to a mapped file");
        start.spill = Some(file);
    }
    if let Some(path) = &journal_path {
        // Cuts a torn end off, so the resumed round's appends follow the last good record.
        let (log, ignored) = journal::recover(path)?;
        if ignored > 0 {
            tracing::warn!(bytes = ignored, "cut a torn or damaged end off the journal");
        }
        start.journal = log;
    }
    let control_path = config.state_dir.as_ref().map(|d| d.join("control.json"));
    if let Some(path) = &control_path {
        // Before the journal's round: it may be of a run `new-run` started after the
        // checkpoint, or of rounds `set-rounds` added.
        start.settings = fedge_coordinator::store::control::load(path)?;
        if let Some(saved) = start
            .settings
            .as_ref()
            .filter(|s| **s != Default::default())
        {
            tracing::info!(
                paused = saved.paused,
                banned = saved.banned.len(),
                rounds = ?saved.rounds,
                run = ?saved.run,
                backbone = ?saved.backbone.as_ref().map(|b| &b.0),
                "operator settings restored from {}", path.display()
            );
        }
    }
    start.release = Some(config.release.clone());
    let booted = plan.boot(start)?;
    if let Some(next_round) = booted.resumed {
        tracing::info!(next_round, "resumed from the checkpoint");
    }
    if let Some((round, accepted)) = booted.restored {
        tracing::info!(round, accepted, "resuming the open round from the journal");
    }
    if let Some((round, why)) = booted.ignored {
        tracing::warn!(
            round,
            "the journal's open round is not resumed: {why}; it is replaced when the next round \
             opens"
        );
    }
    let mut rounds = booted.rounds;
    let audit_file = (config.state_dir.as_ref())
        .filter(|_| config.audit)
        .map(|d| d.join(audit::FILE_NAME));
    if let Some(trail) = &audit_file {
        // The configuration as run: its bytes' digest, to match against a kept copy.
        let config_sha256 = std::fs::read(&path)
            .ok()
            .map(|b| fedge_wire::hex::encode(&Sha256::digest(&b)));
        let role = match config.role {
            Role::Site => "site",
            _ => "global",
        };
        let event = audit::Event::RunStarted {
            federation: config.federation.clone(),
            run: format!("{:016x}", rounds.config().run),
            role: role.into(),
            config_sha256,
            resumed_at: booted.resumed,
        };
        audit::AuditLog::new(trail).record("coordinator", event);
    }
    let options = DriverOptions {
        broker: config.broker.clone(),
        federation: config.federation.clone(),
        client_id: format!("fedge-coordinator-{}", config.federation),
        model_file: config.state_dir.as_ref().map(|d| d.join("model.bin")),
        releases_dir: config.state_dir.as_ref().map(|d| d.join("releases")),
        checkpoint: checkpoint_path,
        journal: journal_path,
        control_file: control_path,
        serving_file: config.state_dir.as_ref().map(|d| d.join("serving.json")),
        stay_up: config.stay_up,
        audit_file,
        home_assistant: config.home_assistant,
        metrics_listen: config.metrics_listen,
        operator_key: (config.auth.operator_key_file.as_deref())
            .map(keys::load_operator)
            .transpose()?,
        keys_file: config.auth.keys_file.clone(),
        previous_protocol: config.protocol.window().map_err(anyhow::Error::msg)?,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        fedge_daemon::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let rounds = match (config.role, &config.site) {
        (Role::Site, Some(site)) => {
            let link = LinkOptions {
                broker: site.upstream_broker(&config.broker).clone(),
                federation: site.federation.clone(),
                site: site.name.clone(),
                key: site.load_key()?,
                backbone: config.model.backbone.clone(),
                pending_file: config.state_dir.as_ref().map(|d| d.join("upstream.bin")),
                task_file: config.state_dir.as_ref().map(|d| d.join("global-task.bin")),
            };
            // The global task the site was answering: its open round resumes from the journal
            // now, before the devices' updates the broker queued meanwhile arrive.
            if let Some(task) = link.task_file.as_deref().and_then(site::link::load_task) {
                let round = task.round;
                match rounds.relay_task(task, 0) {
                    Ok(true) => {
                        tracing::info!(
                            round,
                            accepted = rounds.reported(),
                            "resuming the site's round for the global round"
                        )
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(round, error = %e, "the kept global task does not fit; waiting for the next")
                    }
                }
            }
            tracing::info!(site = %site.name, federation = %config.federation, upstream = %site.federation, "site aggregator starting");
            let (inbox_tx, inbox) = tokio::sync::mpsc::unbounded_channel();
            let (outbox, outbox_rx) = tokio::sync::mpsc::unbounded_channel();
            let link = tokio::spawn(site::link::run(link, inbox_tx, outbox_rx, stop_rx.clone()));
            let relay = driver::Relay { inbox, outbox };
            let rounds = driver::run_site(rounds, options, relay, None, stop_rx).await?;
            let summary = link.await.context("the upstream link panicked")??;
            tracing::info!(
                tasks = summary.tasks,
                sent = summary.sent,
                stale = summary.stale,
                "site link stopped"
            );
            rounds
        }
        _ => {
            tracing::info!(federation = %config.federation, strategy = config.strategy.strategy.name(), rounds = config.rounds, "coordinator starting");
            driver::run(rounds, options, None, None, stop_rx).await?
        }
    };
    tracing::info!(
        round = rounds.round(),
        phase = rounds.phase().name(),
        "coordinator stopped"
    );
    Ok(())
}

fn read_f32_file(path: &std::path::Path, expected: usize) -> anyhow::Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() == expected * 4,
        "{} holds {} bytes; the head needs {} f32 values ({} bytes)",
        path.display(),
        bytes.len(),
        expected,
        expected * 4
    );
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
