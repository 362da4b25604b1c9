//! `fedge-edge`: the device agent binary.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use fedge_daemon::{LogArgs, init_logs};
use fedge_edge::config::EdgeConfig;

#[derive(Parser)]
#[command(
    name = "fedge-edge",
    version,
    about = "Trains a fedge head on local data and reports to the coordinator over MQTT"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the federation and train when selected, until Ctrl-C.
    Run {
        /// Device profile TOML (see firmware-configs/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a profile and this device: key, TLS files, cache folder, backbone against its
    /// card, data, broker. Prints what to fix; exits with 1 when any check fails.
    Check {
        /// Device profile TOML.
        #[arg(long)]
        config: PathBuf,
        /// Skip the broker (for staging and CI, away from the federation's network).
        #[arg(long)]
        dry_run: bool,
    },
    /// Predict the class of image files with the federation's released head, one JSON line
    /// per image on standard output.
    ///
    /// Each line holds `file`, `class`, `index`, `probability`, `top_k` (the best classes with
    /// their probabilities), `logits` and `model_round`; an image that cannot be read gives a
    /// line with `file` and `error`, the other images are still predicted, and the exit code is
    /// 1. Images are decoded and resized as training images are (PNG or JPEG).
    #[command(
        after_help = "The model is the release the agent keeps in the profile's cache_dir \
                      (<cache_dir>/<client_id>.model.bin), or the file given with --model, \
                      e.g. the coordinator's state/model.bin.\n\n\
                      Example: fedge-edge predict --config site.toml --top-k 2 a.png b.jpg"
    )]
    Predict {
        /// Device profile TOML (its backbone, cache_dir and client_id are used).
        #[arg(long)]
        config: PathBuf,
        /// Model file (a released head, e.g. the coordinator's state/model.bin) instead of the
        /// one the agent kept.
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        /// Best classes listed per image (at most all of them).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        top_k: u64,
        /// PNG or JPEG files.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// Print this site's feature statistics as JSON (mean and inverse standard deviation per
    /// backbone feature, over all of its local data, no label used): what a site-normalised
    /// model (`[train] feature_norm = "site"`) standardises this site's features with, and what
    /// `fedge-coordinator export --site-stats` puts in front of the exported head. Run it again
    /// when the site's camera or light changes, and export again.
    /// Obtain this device's key from the running coordinator with a one-time token from
    /// `fedge-coordinator enroll`, and write it to the profile's key_file.
    ///
    /// The key is sealed for this device (an X25519 exchange bound to the token); the token
    /// works once. The coordinator must run with [auth] keys_file.
    #[command(after_help = "Example: fedge-edge enroll --config site.toml --token 3f9a…")]
    Enroll {
        /// The device profile (broker, federation, client_id, key_file).
        #[arg(long)]
        config: PathBuf,
        /// The token `fedge-coordinator enroll` printed (32 hex digits, dashes allowed).
        #[arg(long)]
        token: String,
        /// How long to wait for the coordinator's answer (e.g. 30s, 2m).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Replace an existing key file (a device enrolled again after a revocation).
        #[arg(long)]
        replace: bool,
    },
    #[command(after_help = "Example: fedge-edge site-stats --config site.toml > site-stats.json")]
    SiteStats {
        /// Device profile TOML (its backbone and data are used).
        #[arg(long)]
        config: PathBuf,
    },
    /// Print a systemd unit that runs this profile, with the memory limits of its
    /// `[resources] memory_budget_mb` (see deploy/fedge-edge.service and docs/deploy.md).
    Unit {
        /// Device profile TOML, where it will live on the device.
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log.log_format, "info");
    match cli.command {
        Command::Run { config } => {
            let config = EdgeConfig::load(&config)?;
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if config.resources.threads > 0 {
                runtime
                    .worker_threads(config.resources.threads)
                    .max_blocking_threads(config.resources.threads);
            }
            runtime.enable_all().build()?.block_on(run(config))?;
        }
        Command::Check { config, dry_run } => {
            let checks = fedge_edge::check::run_checks(&config, dry_run);
            print!("{}", fedge_edge::check::report(&checks));
            let failed = checks.iter().filter(|c| !c.ok).count();
            if failed > 0 {
                eprintln!("{failed} check(s) failed");
                std::process::exit(1);
            }
            println!("{}: ready", config.display());
        }
        Command::Predict {
            config,
            model,
            top_k,
            images,
        } => {
            let top_k = usize::try_from(top_k).unwrap_or(usize::MAX);
            if !predict(&config, model.as_deref(), top_k, &images)? {
                std::process::exit(1);
            }
        }
        Command::Enroll {
            config,
            token,
            timeout,
            replace,
        } => {
            let profile = EdgeConfig::load(&config)?;
            let token = fedge_wire::enrol::EnrolToken::from_hex(&token)?;
            let written = fedge_edge::enrol::enrol(&profile, &token, timeout, replace)?;
            println!(
                "{}: enrolled in {}; key written to {}",
                profile.client_id,
                profile.federation,
                written.display()
            );
        }
        Command::SiteStats { config } => {
            let profile = EdgeConfig::load(&config)?;
            let setup = profile.setup()?;
            let Some(stats) = fedge_edge::site_norm::site_stats(&setup.train, &setup.val) else {
                anyhow::bail!(
                    "{}: the site has no data to take statistics from",
                    config.display()
                );
            };
            println!("{}", serde_json::to_string(&stats)?);
        }
        Command::Unit { config } => {
            let profile = EdgeConfig::load(&config)?;
            let path = std::path::absolute(&config)?;
            print!(
                "{}",
                fedge_edge::resources::systemd_unit(
                    &path,
                    &profile.resources,
                    profile.device == fedge_models::Accelerator::Cuda
                )
            );
        }
    }
    Ok(())
}

/// One line of `fedge-edge predict`'s output.
#[derive(serde::Serialize)]
struct Predicted<'a> {
    file: &'a Path,
    #[serde(flatten)]
    prediction: fedge_edge::inference::Prediction,
}

/// `fedge-edge predict`: one JSON line per image; false when an image could not be predicted.
fn predict(
    profile: &Path,
    model: Option<&Path>,
    top_k: usize,
    images: &[PathBuf],
) -> anyhow::Result<bool> {
    use anyhow::Context;
    use fedge_edge::inference::{Predictor, store};

    let config = EdgeConfig::load(profile)?;
    let model_path = match model {
        Some(path) => path.to_owned(),
        None => {
            let Some(cache_dir) = &config.cache_dir else {
                anyhow::bail!(
                    "{} has no cache_dir, where the agent keeps the released model: set one and \
                     run the agent until a round aggregates, or pass --model state/model.bin \
                     from the coordinator's state folder",
                    profile.display()
                );
            };
            store::model_path(cache_dir, &config.client_id)
        }
    };
    let Some(release) = store::load(&model_path)? else {
        anyhow::bail!(
            "no model at {}: {}",
            model_path.display(),
            if model.is_some() {
                "give the coordinator's state/model.bin (written after each aggregated round)"
            } else {
                "no release has been received yet; run the agent (`fedge-edge run`) until a \
                 round aggregates, or pass --model state/model.bin from the coordinator's state \
                 folder"
            }
        );
    };
    let (backbone, _) = fedge_edge::features::load_backbone(&config.backbone)
        .with_context(|| format!("loading the backbone {}", config.backbone.display()))?;
    // A site-normalised head needs this site's statistics: from the profile's own data (its
    // features are cached after the agent's first start).
    let site = match release.feature_norm {
        fedge_wire::FeatureNorm::None => None,
        fedge_wire::FeatureNorm::Site => {
            let setup = config
                .setup()
                .context("loading the site's data for its feature statistics")?;
            fedge_edge::site_norm::site_stats(&setup.train, &setup.val)
        }
    };
    let predictor = Predictor::new(std::sync::Arc::new(backbone), release, site)
        .with_context(|| format!("using {}", model_path.display()))?;
    let mut all_ok = true;
    let mut out = std::io::stdout().lock();
    for image in images {
        let line = match predictor.predict_file(image, top_k) {
            Ok(prediction) => serde_json::to_string(&Predicted {
                file: image,
                prediction,
            })?,
            Err(e) => {
                all_ok = false;
                serde_json::json!({ "file": image, "error": e.to_string() }).to_string()
            }
        };
        writeln!(out, "{line}")?;
    }
    Ok(all_ok)
}

/// The agent until Ctrl-C or SIGTERM (which also end the set-up: the features of a large
/// folder can take minutes).
async fn run(config: EdgeConfig) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        fedge_daemon::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let mut wanted = None;
    loop {
        let mut config = config.clone();
        if config.backbone_from_federation() {
            config.backbone = federation_backbone(&config, wanted.take(), stop_rx.clone()).await?;
            config.fetched_backbone = true;
        }
        let moved = run_once(config, stop_rx.clone()).await?;
        match moved {
            Some(reference) => wanted = Some(reference),
            None => return Ok(()),
        }
    }
}

/// The card of the federation's backbone (or of `wanted`), fetched until it comes or a stop
/// signal arrives; the device's status says why while it cannot.
async fn federation_backbone(
    config: &EdgeConfig,
    wanted: Option<fedge_wire::BackboneRef>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<PathBuf> {
    loop {
        let (profile, wanted) = (config.clone(), wanted.clone());
        let fetch = tokio::task::spawn_blocking(move || {
            let timeout = std::time::Duration::from_secs(30);
            fedge_edge::fetch::fetch_backbone(&profile, wanted, timeout)
        });
        let failed = tokio::select! {
            fetched = fetch => match fetched? {
                Ok(card) => return Ok(card),
                Err(reason) => reason,
            },
            _ = stop.changed() => std::process::exit(0),
        };
        tracing::error!(%failed, "cannot take the federation's backbone; trying again in 10 s");
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
            _ = stop.changed() => std::process::exit(0),
        }
    }
}

/// One run of the agent: its set-up, then rounds until a stop signal (`None`) or a task naming
/// another backbone of the federation (`Some`, to be fetched).
async fn run_once(
    config: EdgeConfig,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<fedge_wire::BackboneRef>> {
    let mut stopped = stop_rx.clone();
    let setup = tokio::select! {
        setup = tokio::task::spawn_blocking(move || config.setup()) => setup??,
        _ = stopped.changed() => {
            tracing::info!("stopped during set-up");
            std::process::exit(0);
        }
    };
    tracing::info!(
        client = %setup.client_id,
        train = setup.train.len(),
        val = setup.val.len(),
        backbone = %setup.backbone,
        device = %setup.device.name,
        "edge starting"
    );
    let summary = fedge_edge::run_agent(setup, stop_rx).await?;
    tracing::info!(
        rounds = summary.rounds_trained,
        bytes_up = summary.bytes_up,
        "edge stopped"
    );
    Ok(summary.backbone_moved)
}
