//! `fedge-coordinator`: runs a federation against an MQTT broker.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fedge_coordinator::boot::Start;
use fedge_coordinator::config::{CoordinatorConfig, Role};
use fedge_coordinator::io::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::replay::{self, npy};
use fedge_coordinator::site::{self, link::LinkOptions};
use fedge_coordinator::store::{checkpoint, journal, keys};
use fedge_coordinator::strategy::{SolverKind, StrategyKind};
use fedge_coordinator::{DriverOptions, driver};
use fedge_daemon::{LogArgs, init_logs};
use fedge_wire::ModelLayout;

#[derive(Parser)]
#[command(
    name = "fedge-coordinator",
    version,
    about = "Coordinates a fedge federation over MQTT"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run rounds until the configured number is reached (Ctrl-C stops early).
    ///
    /// With role = "site" and a [site] section, run a site aggregator instead: the coordinator
    /// of one site's devices and one participant of the global federation, until stopped
    /// (configs/site.toml, docs/sites.md).
    Run {
        /// Coordinator TOML file (configs/coordinator.toml, configs/site.toml; every key is
        /// listed in coordinator/src/config/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Re-run one aggregation offline from .npy files and print the new parameters' summary.
    ///
    /// DIR holds one <client>.npy delta per client (f32, 1-D, the length of G.npy) and
    /// counts.json ({"<client>": sample_count}). The report is
    /// {"gamma": {"<client>": weight}, "objective": f, "lambda": λ, "n_clients": N, ...}.
    Aggregate(AggregateArgs),
    /// Watch a federation live: coordinator status, recent rounds and every device, read from
    /// the same MQTT topics dashboards use.
    Watch {
        /// Broker URL: mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS (the system's CA store
        /// unless --ca-file).
        #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
        broker: String,
        /// Federation name.
        #[arg(long, default_value = "demo")]
        federation: String,
        #[command(flatten)]
        login: WatchLogin,
        /// Print one snapshot after this many seconds and exit (for scripts).
        #[arg(long, value_name = "SECONDS")]
        once: Option<f64>,
    },
    /// Provision a device: write a new random key to its key file and add it to the keys file.
    ///
    /// Copy the device file to the device (its profile's `key_file`) over a secure channel and
    /// point `[auth] keys_file` of the coordinator's configuration at the keys file.
    Keygen {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (created when missing).
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
        /// The device's key file to write.
        #[arg(long, value_name = "DEVICE.key")]
        out: PathBuf,
    },
    /// Operate a running coordinator: pause or resume it, ban or unban a device, change its
    /// number of rounds, or make an operator key.
    ///
    /// The command is tagged with `[auth] operator_key_file` of the configuration, published
    /// on fedge/<federation>/coordinator/control and applied at the next round boundary; ctl
    /// prints the coordinator's status once it shows the change.
    #[command(
        after_help = "Examples:\n  fedge-coordinator ctl --config configs/coordinator.toml keygen\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml pause\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml ban cam-07\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml set-rounds 50"
    )]
    Ctl {
        /// The coordinator's TOML file: its broker, federation and operator key file.
        #[arg(long)]
        config: PathBuf,
        /// Seconds to wait for the coordinator's status to show the change.
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
        #[command(subcommand)]
        command: fedge_coordinator::io::ctl::CtlCommand,
    },
    /// Revoke a device: remove it from the keys file. A running coordinator reloads the file
    /// within a second; the device is selected for no round and its next update or status is
    /// rejected as `unknown_device`.
    Revoke {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (`[auth] keys_file`).
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
    },
    /// Let a device enrol itself: print a one-time token for it. `fedge-edge enroll --token`
    /// on the device obtains its key from the running coordinator over MQTT (an X25519
    /// exchange bound to the token; the key never travels in clear) and the coordinator adds
    /// it to the keys file. The token works once, until it expires.
    #[command(
        after_help = "Example: fedge-coordinator enroll --client cam-09 --keys devices.toml --valid 2h"
    )]
    Enroll {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (`[auth] keys_file`); the token is kept beside it.
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
        /// How long the token stays valid (e.g. 30m, 24h, 7d).
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        valid: std::time::Duration,
    },
    /// Distribute a backbone over MQTT: its card and ONNX file, retained on
    /// fedge/<federation>/backbone/<sha256>, and backbone/current pointing at it. Devices whose
    /// profile says backbone = "federation" fetch, verify and cache it.
    #[command(
        after_help = "Example: fedge-coordinator publish-backbone --config configs/coordinator.toml --card models/assets/digits-conv.toml"
    )]
    PublishBackbone {
        /// The coordinator's TOML file: its broker, federation and keys file.
        #[arg(long)]
        config: PathBuf,
        /// The backbone's model card (its `file` names the ONNX file, relative to the card).
        #[arg(long)]
        card: PathBuf,
    },
    /// Export the released model as one ONNX file (backbone + head, softmax at the end, class
    /// names in its metadata) and its model card, for onnxruntime, tract or any ONNX runtime.
    ///
    /// Writes OUT (e.g. model.onnx) and its card beside it with the extension .toml (model.toml):
    /// the backbone's card with output_name = "probabilities", logits_name = "logits" and the
    /// federation's classes, so a runtime prepares images as fedge does.
    #[command(
        after_help = "Example: fedge-coordinator export --state state --backbone \
                      models/assets/digits-conv.toml --site-stats site-stats.json --out model.onnx \
                      (site-stats.json from `fedge-edge site-stats` on the site that will run it)"
    )]
    Export {
        /// The coordinator's state_dir (its model.bin is the newest release).
        #[arg(
            long,
            value_name = "DIR",
            required_unless_present = "model",
            conflicts_with = "model"
        )]
        state: Option<PathBuf>,
        /// A release file instead: a state_dir's model.bin, or a device's kept
        /// <client_id>.model.bin.
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        /// The model card of the backbone the federation trained on.
        #[arg(long, value_name = "CARD.toml")]
        backbone: PathBuf,
        /// For a site-normalised model (`[train] feature_norm = "site"`): the statistics of the
        /// site that will run the exported file, as `fedge-edge site-stats` prints them; they
        /// become the model's input-side standardisation.
        #[arg(long, value_name = "FILE.json")]
        site_stats: Option<PathBuf>,
        /// The ONNX file to write.
        #[arg(long, value_name = "model.onnx", default_value = "model.onnx")]
        out: PathBuf,
    },
}

#[derive(clap::Args)]
struct AggregateArgs {
    /// fedavg or fedomg.
    #[arg(long, value_enum, default_value_t = StrategyKind::Fedomg)]
    strategy: StrategyKind,
    /// FedOMG's conflict-averse radius κ.
    #[arg(long, default_value_t = 0.5)]
    kappa: f64,
    /// Server learning rate in FedAvg units (the authors' η is global_lr × N).
    #[arg(long, default_value_t = 1.0)]
    global_lr: f64,
    /// FedOMG's solver: reference or converged.
    #[arg(long, value_enum, default_value_t = SolverKind::Reference)]
    solver: SolverKind,
    /// Global parameters (G.npy, f32, 1-D).
    #[arg(long, value_name = "G.npy")]
    global: PathBuf,
    /// Directory of <client>.npy deltas and counts.json.
    #[arg(long, value_name = "DIR")]
    deltas: PathBuf,
    /// Where to write the new global parameters.
    #[arg(long, value_name = "NEW.npy")]
    out: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, value_name = "REPORT.json")]
    report: Option<PathBuf>,
}

/// How `watch` authenticates to the broker.
#[derive(Debug, clap::Args)]
struct WatchLogin {
    /// CA file for a TLS broker (PEM); turns TLS on.
    #[arg(long, value_name = "CA.pem")]
    ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that require one (with --key).
    #[arg(long, value_name = "CERT.pem", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, value_name = "KEY.pem", requires = "cert")]
    key: Option<PathBuf>,
    /// User name, for brokers that require a login.
    #[arg(long)]
    username: Option<String>,
    /// File holding the password on one line (mode 600).
    #[arg(long, value_name = "FILE", requires = "username")]
    password_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log.log_format, "info,rumqttd=off");
    match cli.command {
        Command::Run { config } => run(config).await,
        Command::Aggregate(args) => aggregate(args),
        Command::Watch {
            broker,
            federation,
            login,
            once,
        } => watch(&broker, &federation, login, once).await,
        Command::Export {
            state,
            model,
            backbone,
            site_stats,
            out,
        } => {
            let path = model.unwrap_or_else(|| state.unwrap_or_default().join("model.bin"));
            let release = fedge_coordinator::export::read_release(&path)?;
            let site = site_stats
                .as_deref()
                .map(fedge_coordinator::export::read_site_stats)
                .transpose()?;
            let written =
                fedge_coordinator::export::export_files(&release, &backbone, site.as_ref(), &out)?;
            println!(
                "round {} of {} ({}, head {}→{}→{}, {} classes) written to {} ({} bytes) and {}",
                release.round,
                release.federation,
                release.strategy,
                release.head.features,
                release.head.hidden,
                release.head.classes,
                release.classes.len(),
                written.onnx.display(),
                written.bytes,
                written.card.display()
            );
            Ok(())
        }
        Command::Ctl {
            config,
            wait,
            command,
        } => fedge_coordinator::io::ctl::run(&config, wait, command).await,
        Command::Revoke { client, keys } => {
            keys::revoke(&keys, &client)?;
            println!("{client}: removed from {}", keys.display());
            Ok(())
        }
        Command::Enroll {
            client,
            keys,
            valid,
        } => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            let expires = (now + valid).as_millis() as u64;
            let token = fedge_coordinator::store::enrolments::issue(&keys, &client, expires)?;
            let valid = humantime::format_duration(valid);
            println!("{}", token.to_hex());
            eprintln!(
                "{client}: one-time token, valid {valid}; on the device run\n  \
                 fedge-edge enroll --config <profile> --token {}",
                token.to_hex()
            );
            Ok(())
        }
        Command::PublishBackbone { config, card } => {
            fedge_coordinator::io::backbone::publish_backbone(&config, &card).await
        }
        Command::Keygen { client, keys, out } => {
            keys::keygen(&keys, &client, &out)?;
            println!(
                "{client}: key written to {}, added to {}",
                out.display(),
                keys.display()
            );
            Ok(())
        }
    }
}

async fn run(path: PathBuf) -> anyhow::Result<()> {
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
    let booted = plan.boot(start)?;
    if let Some(next_round) = booted.resumed {
        tracing::info!(next_round, "resumed from the checkpoint");
    }
    if let Some((round, accepted)) = booted.restored {
        tracing::info!(round, accepted, "resuming the open round from the journal");
    }
    if let Some(round) = booted.ignored {
        tracing::warn!(
            round,
            "the journal belongs to an earlier round or to other parameters (was the \
             checkpoint moved away?); ignored, it is replaced when the next round opens"
        );
    }
    let mut rounds = booted.rounds;
    let options = DriverOptions {
        broker: config.broker.clone(),
        federation: config.federation.clone(),
        client_id: format!("fedge-coordinator-{}", config.federation),
        model_file: config.state_dir.as_ref().map(|d| d.join("model.bin")),
        checkpoint: checkpoint_path,
        journal: journal_path,
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

fn aggregate(args: AggregateArgs) -> anyhow::Result<()> {
    let config = fedge_coordinator::strategy::StrategyConfig {
        strategy: args.strategy,
        kappa: args.kappa,
        global_lr: args.global_lr,
        solver: args.solver,
        ..Default::default()
    };
    let (params, report) = replay::aggregate_files(&config, &args.global, &args.deltas)?;
    npy::write_f32(&args.out, &params)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.report {
        std::fs::write(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{json}");
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

async fn watch(
    url: &str,
    federation: &str,
    login: WatchLogin,
    once: Option<f64>,
) -> anyhow::Result<()> {
    use fedge_coordinator::io::watch::{WatchState, render};
    use rumqttc::{Event, Packet, QoS};
    let mut broker = fedge_mqtt::BrokerConfig::parse_url(url)?;
    if login.ca_file.is_some() || login.cert.is_some() {
        let mut tls = broker
            .tls
            .take()
            .unwrap_or_else(fedge_mqtt::TlsSettings::system_roots);
        tls.ca_file = login.ca_file.unwrap_or(tls.ca_file);
        (tls.client_cert, tls.client_key) = (login.cert, login.key);
        broker.tls = Some(tls);
    }
    broker.username = login.username;
    broker.password_file = login.password_file;
    // Paths are relative to the working folder.
    broker.load(std::path::Path::new(""))?;
    let topics = fedge_wire::Topics::new(federation)?;
    let id = format!("fedge-watch-{}", std::process::id());
    let (client, mut events) = rumqttc::AsyncClient::new(broker.options(&id, None), 64);
    let mut state = WatchState::default();
    let mut backoff = fedge_mqtt::Backoff::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let until = once.map(|s| tokio::time::Instant::now() + std::time::Duration::from_secs_f64(s));
    let mut dirty = true;
    loop {
        tokio::select! {
            event = events.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    for filter in [topics.coordinator_status(), topics.metrics(), topics.edge_status_filter()] {
                        let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    dirty |= state.take(&topics, &p.topic, &p.payload);
                }
                Ok(_) => {}
                Err(e) => {
                    if backoff.is_fresh() {
                        let e = fedge_mqtt::describe_error(&e);
                        eprintln!("cannot reach the broker at {url}: {e}; retrying");
                    }
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            },
            _ = tick.tick() => {
                if let Some(until) = until {
                    if tokio::time::Instant::now() >= until {
                        print!("{}", render(&state, federation));
                        return Ok(());
                    }
                } else if dirty {
                    // Clear the screen and go home, then draw.
                    print!("\x1b[2J\x1b[H{}", render(&state, federation));
                    dirty = false;
                }
            },
            _ = fedge_daemon::shutdown_signal() => return Ok(()),
        }
    }
}
