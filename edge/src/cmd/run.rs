//! `fedge-edge run`: the agent on a runtime sized by the profile, until Ctrl-C or SIGTERM.

use std::path::{Path, PathBuf};

use fedge_edge::config::EdgeConfig;

/// Loads the profile and runs the agent on a runtime with its `[resources] threads`.
pub fn run(path: &Path) -> anyhow::Result<()> {
    let config = EdgeConfig::load(path)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.resources.threads > 0 {
        runtime
            .worker_threads(config.resources.threads)
            .max_blocking_threads(config.resources.threads);
    }
    runtime.enable_all().build()?.block_on(agent(config))
}

/// The agent until Ctrl-C or SIGTERM (which also end the set-up: the features of a large
/// folder can take minutes).
async fn agent(config: EdgeConfig) -> anyhow::Result<()> {
    let _key_in_use = hold_key(&config)?;
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

/// Holds the device's key file for as long as the agent runs, so that `fedge-edge enroll`
/// does not replace it under a running agent (which would keep the old key while the
/// coordinator holds the new one). A missing key file is the set-up's to report.
fn hold_key(config: &EdgeConfig) -> anyhow::Result<Option<fedge_daemon::FileLock>> {
    let Some(path) = config.key_file.as_deref().filter(|p| p.exists()) else {
        return Ok(None);
    };
    match fedge_daemon::hold_in_use(path) {
        Ok(fedge_daemon::Hold::Held(lock)) => Ok(Some(lock)),
        Ok(fedge_daemon::Hold::Taken) => anyhow::bail!(
            "key_file {}: `fedge-edge enroll` is replacing it; start the agent once it is done",
            path.display()
        ),
        Err(e) => anyhow::bail!("key_file {}: {e}", path.display()),
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
        runtime = %setup.runtime,
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
