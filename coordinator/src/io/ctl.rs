//! `fedge-coordinator ctl`: an operator's command to a running coordinator, tagged with the
//! operator key and published on `fedge/<f>/coordinator/control`, then confirmed from the
//! retained status (README, "Operate a fleet"; docs/mqtt-topics.md for the message).

use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_wire::control::{Command, ControlMessage};
use fedge_wire::{CoordinatorStatus, DeviceKey, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};

/// Whether `status` shows `command` applied; `before` is the retained status from before it.
fn shows(
    status: &CoordinatorStatus,
    command: &Command,
    before: Option<&CoordinatorStatus>,
) -> bool {
    match command {
        Command::Pause => status.paused,
        Command::Resume => !status.paused,
        Command::Ban { client } => status.banned.contains(client),
        Command::Unban { client } => !status.banned.contains(client),
        Command::SetRounds { rounds } => status.total_rounds == *rounds,
        Command::SetBackbone { sha256, .. } => {
            status.backbone_sha256.as_deref() == Some(sha256.to_lowercase().as_str())
        }
        // A short run may be over again before the next status: the history says it began.
        Command::NewRun { .. } => status.runs.len() > before.map_or(0, |b| b.runs.len()),
        Command::Rollback { .. } => {
            let now = status.release.as_ref();
            let was = before.and_then(|b| b.release.as_ref());
            now.is_some_and(|n| n.pinned && was.is_none_or(|w| !w.pinned || w.serving != n.serving))
        }
        Command::Promote => {
            let now = status.release.as_ref();
            let was = before.and_then(|b| b.release.as_ref());
            now.is_some_and(|n| !n.pinned && was.is_none_or(|w| w.pinned || w.serving != n.serving))
        }
        // The status carries no pool: the first status after the command that counts no new
        // refusal shows it taken (`send`).
        Command::Status | Command::ResetPool => true,
    }
}

/// Why the coordinator refused a command since `before`, when `status` counts more refusals
/// than it did (a refusal of a command tagged with another key says so too).
fn refused_since<'a>(
    status: &'a CoordinatorStatus,
    before: Option<&CoordinatorStatus>,
) -> Option<&'a str> {
    let count = |s: &CoordinatorStatus| s.rejected_updates.get("bad_control").copied().unwrap_or(0);
    let more = count(status) > before.map_or(0, count);
    more.then_some(status.control_refused.as_deref()).flatten()
}

/// Sends `command` to the coordinator of `federation` over `broker` and returns its first
/// status that shows it applied, within `within`.
pub async fn send(
    broker: &fedge_mqtt::BrokerConfig,
    federation: &str,
    key: &DeviceKey,
    command: Command,
    within: Duration,
) -> anyhow::Result<CoordinatorStatus> {
    let topics = Topics::new(federation).map_err(|e| anyhow::anyhow!("{e}"))?;
    let id = format!("fedge-ctl-{}", std::process::id());
    let (client, mut events) = AsyncClient::new(broker.options(&id, None), 16);
    let status_topic = topics.coordinator_status();
    client
        .subscribe(&status_topic, QoS::AtLeastOnce)
        .await
        .context("cannot subscribe to the coordinator's status")?;
    // Milliseconds since the epoch: above any earlier command's number.
    let seq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_millis() as u64;
    let message = ControlMessage::signed(federation, seq, command.clone(), key);
    client
        .publish(
            topics.control(),
            QoS::AtLeastOnce,
            false,
            serde_json::to_vec(&message)?,
        )
        .await
        .context("cannot publish the command")?;
    let deadline = Instant::now() + within;
    let mut last: Option<CoordinatorStatus> = None;
    let mut before: Option<CoordinatorStatus> = None;
    let mut sent_at = None;
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = match tokio::time::timeout(left, events.poll()).await {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => anyhow::bail!("broker: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => break,
        };
        match event {
            Event::Outgoing(rumqttc::Outgoing::Publish(_)) => sent_at = Some(Instant::now()),
            Event::Incoming(Packet::Publish(p)) if p.topic == status_topic => {
                let Ok(status) = serde_json::from_slice::<CoordinatorStatus>(&p.payload) else {
                    continue;
                };
                // The retained status from before the command does not confirm it. A
                // `reset-pool` shows in no field: a refusal counted since is its answer.
                let refused = refused_since(&status, before.as_ref());
                let unseen = command == Command::ResetPool && refused.is_some();
                if p.retain {
                    before = Some(status.clone());
                } else if sent_at.is_some() && !unseen && shows(&status, &command, before.as_ref())
                {
                    let _ = client.disconnect().await;
                    return Ok(status);
                } else if let (Some(_), Some(reason)) = (sent_at, refused) {
                    let _ = client.disconnect().await;
                    anyhow::bail!("the coordinator refused the command: {reason}");
                }
                last = Some(status);
            }
            _ => {}
        }
    }
    let refused = last
        .as_ref()
        .and_then(|s| s.rejected_updates.get("bad_control"))
        .copied()
        .unwrap_or(0);
    anyhow::bail!(
        "no status of federation {federation:?} showed the command within {within:?} (commands \
         refused so far: {refused}); is the coordinator running with [auth] operator_key_file \
         set to this key, and its clock within 5 minutes of this one?"
    )
}

/// What `ctl` asks: a command for the coordinator, or a new operator key.
#[derive(clap::Subcommand)]
pub enum CtlCommand {
    #[command(flatten)]
    Send(fedge_wire::control::Command),
    /// Write a new operator key to `[auth] operator_key_file` (then restart the coordinator).
    Keygen,
}

/// `fedge-coordinator ctl --config PATH`: makes an operator key, or sends `command` and prints
/// the status that shows it applied (within `wait` seconds).
/// With `broker`, that broker and login instead of the configuration's.
pub async fn run(
    path: &std::path::Path,
    wait: f64,
    broker: Option<fedge_mqtt::BrokerConfig>,
    command: CtlCommand,
) -> anyhow::Result<()> {
    let config = crate::CoordinatorConfig::load(path)?;
    let broker = broker.unwrap_or_else(|| config.broker.clone());
    let key_file = config.auth.operator_key_file.as_deref().with_context(|| {
        format!(
            "{}: set [auth] operator_key_file (then `ctl keygen` writes the key)",
            path.display()
        )
    })?;
    let op = match command {
        CtlCommand::Keygen => {
            crate::store::keys::operator_keygen(key_file)?;
            println!(
                "operator key written to {}; restart the coordinator to take commands",
                key_file.display()
            );
            return Ok(());
        }
        CtlCommand::Send(op) => op,
    };
    let key = crate::store::keys::load_operator(key_file)?;
    let within = std::time::Duration::from_secs_f64(wait.max(0.1));
    let status = send(&broker, &config.federation, &key, op, within).await?;
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}
