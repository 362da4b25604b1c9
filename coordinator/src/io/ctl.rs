//! `fedge-coordinator ctl`: an operator's command to a running coordinator, tagged with the
//! operator key and published on `fedge/<f>/coordinator/control`, then confirmed from the
//! retained status (README, "Operate a fleet"; docs/mqtt-topics.md for the message).

use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_wire::control::{Command, ControlMessage};
use fedge_wire::{CoordinatorStatus, DeviceKey, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};

/// Sends `command` to the coordinator of `federation` over `broker` and returns its first
/// status that says it applied (by its number), within `within`; an error says why it was
/// refused, or that no status took it.
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
    let mut fresh = 0usize;
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = match tokio::time::timeout(left, events.poll()).await {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => anyhow::bail!("broker: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => break,
        };
        let Event::Incoming(Packet::Publish(p)) = event else {
            continue;
        };
        let Ok(status) = serde_json::from_slice::<CoordinatorStatus>(&p.payload) else {
            continue;
        };
        let is_fresh = p.topic == status_topic && !p.retain;
        fresh += usize::from(is_fresh);
        // `status` reads and changes nothing: any status published since is its answer (also
        // one published before the coordinator read the command, or while it was starting).
        if command == Command::Status && is_fresh {
            let _ = client.disconnect().await;
            return Ok(status);
        }
        // The coordinator says what became of this command, by its number.
        match status.last_command.as_ref().filter(|c| c.seq == seq) {
            Some(outcome) if outcome.applied => {
                let _ = client.disconnect().await;
                return Ok(status);
            }
            Some(outcome) => {
                let _ = client.disconnect().await;
                let reason = outcome.refused.as_deref().unwrap_or("no reason given");
                anyhow::bail!("the coordinator refused the command: {reason}");
            }
            None => {}
        }
    }
    let _ = client.disconnect().await;
    if fresh == 0 {
        anyhow::bail!(
            "no status of federation {federation:?} came within {within:?}: is its coordinator \
             running and connected to this broker?"
        );
    }
    anyhow::bail!(
        "the coordinator of federation {federation:?} published {fresh} status(es) within \
         {within:?} but none took the command: either it refused it unread (counted as \
         bad_control: is it running with [auth] operator_key_file set to this key, and is this \
         machine's clock within 5 minutes of the coordinator's?), or it was not listening yet \
         (send the command again)"
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
