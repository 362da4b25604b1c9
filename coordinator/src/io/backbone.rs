//! `fedge-coordinator publish-backbone`: a backbone distributed over MQTT. Its model card and
//! ONNX file travel as one `BackboneObject` frame, retained on `fedge/<f>/backbone/<sha256>`
//! (chunks on `…/<i>` beyond the packet limit, sealed with every device key when the
//! federation has keys), and `fedge/<f>/backbone/current` says which one the federation
//! trains on. Devices whose profile says `backbone = "federation"` fetch, verify and cache it;
//! round tasks name it once `[model] backbone_sha256` is its digest, or at once when the
//! operator key lets this command tell a running coordinator (`ctl set-backbone`).

use std::path::Path;

use fedge_card::ModelCard;
use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_wire::{BackboneObject, BackboneRef, DeviceKey, Message, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};

use crate::round::DeviceKeys;

/// The object of the card at `card_path` (its `file` relative to it).
pub fn object(card_path: &Path) -> anyhow::Result<BackboneObject> {
    let card = std::fs::read_to_string(card_path)
        .with_context(|| format!("cannot read the card {}", card_path.display()))?;
    // Checked with the one card parser before it goes to every device.
    let parsed = ModelCard::parse(&card, card_path)?;
    let onnx_path = parsed.onnx_path(card_path);
    let onnx = std::fs::read(&onnx_path)
        .with_context(|| format!("cannot read the backbone {}", onnx_path.display()))?;
    Ok(BackboneObject {
        card,
        name: parsed.name,
        onnx,
    })
}

/// The frames to publish, retained, topic by topic: the object (sealed for every device in
/// `keys`, chunked under `max_packet`) and the pointer.
pub fn frames(
    topics: &Topics,
    object: BackboneObject,
    keys: Option<&DeviceKeys>,
    max_packet: usize,
) -> (BackboneRef, Vec<(String, Vec<u8>)>) {
    let reference = object.reference();
    let hex = reference.sha256_hex();
    let mut frame = fedge_wire::encode(&Message::Backbone(object));
    let mut pointer = reference.to_pointer();
    if let Some(keys) = keys {
        let signers: Vec<(&str, &DeviceKey)> = keys.iter().map(|(c, k)| (c.as_str(), k)).collect();
        frame = fedge_wire::seal(frame, &signers);
        // The pointer too: a device with a key believes no pointer anyone else wrote.
        pointer = fedge_wire::seal(pointer, &signers);
    }
    let base = topics.backbone(&hex);
    // The digest's first bytes number the chunks, so two backbones never mix theirs.
    let id = u64::from_le_bytes(reference.sha256[..8].try_into().unwrap_or_default());
    let pieces = fedge_wire::split_into_chunks(frame, id, max_packet);
    let mut out: Vec<(String, Vec<u8>)> = match pieces.len() {
        1 => vec![(base, pieces.into_iter().next().unwrap_or_default())],
        _ => (pieces.into_iter().enumerate())
            .map(|(i, piece)| (format!("{base}/{i}"), piece))
            .collect(),
    };
    out.push((topics.backbone_current(), pointer));
    (reference, out)
}

/// Publishes `frames` retained on `broker` and waits until the broker acknowledged them all.
pub async fn publish(
    broker: &fedge_mqtt::BrokerConfig,
    frames: Vec<(String, Vec<u8>)>,
    within: Duration,
) -> anyhow::Result<()> {
    let id = format!("fedge-publish-backbone-{}", std::process::id());
    let (client, mut events) = AsyncClient::new(broker.options(&id, None), frames.len() + 4);
    let total = frames.len();
    for (topic, payload) in frames {
        client
            .publish(topic, QoS::AtLeastOnce, true, payload)
            .await
            .context("cannot queue a publish")?;
    }
    let deadline = Instant::now() + within;
    let mut acked = 0;
    while acked < total {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => acked += 1,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => anyhow::bail!("the broker: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => anyhow::bail!("the broker acknowledged {acked} of {total} messages in time"),
        }
    }
    let _ = client.disconnect().await;
    Ok(())
}

/// Puts the publish on the audit trail of the configuration's state folder, when this machine
/// holds it (`publish-backbone` may run elsewhere, with a copy of the configuration).
fn record_publish(config: &crate::CoordinatorConfig, name: &str, sha256: &str) {
    let Some(dir) = config.state_dir.as_ref().filter(|d| d.is_dir()) else {
        return;
    };
    let who = match config.auth.operator_key_file.as_deref() {
        Some(file) => match crate::store::keys::load_operator(file) {
            Ok(key) => crate::store::audit::operator(&key),
            Err(_) => "operator:cli".to_owned(),
        },
        None => "operator:cli".to_owned(),
    };
    let event = crate::store::audit::Event::BackbonePublished {
        name: name.to_owned(),
        sha256: sha256.to_owned(),
    };
    let mut trail = crate::store::audit::AuditLog::new(dir.join(crate::store::audit::FILE_NAME));
    if !trail.record(&who, event) {
        eprintln!("the publish is not on the audit trail in {}", dir.display());
    }
}

/// `fedge-coordinator publish-backbone --config C --card CARD`: distributes the card's backbone
/// on the federation's broker and says how to make round tasks name it.
pub async fn publish_backbone(config_path: &Path, card_path: &Path) -> anyhow::Result<()> {
    let config = crate::CoordinatorConfig::load(config_path)?;
    let topics = Topics::new(&config.federation).map_err(|e| anyhow::anyhow!("{e}"))?;
    let keys = config.device_keys()?;
    let object = object(card_path)?;
    // A head is as wide as its backbone's features: another width cannot take over this head.
    let width = ModelCard::parse(&object.card, card_path)?.feature_size;
    if width != config.head.features {
        anyhow::bail!(
            "{}: feature_size = {width}, but [head] features = {} in {}: a head trained on one \
             width cannot run on the other; start a federation with this head size for it",
            card_path.display(),
            config.head.features,
            config_path.display()
        );
    }
    let megabytes = object.onnx.len() as f64 / 1e6;
    let max_packet = config.broker.max_packet;
    let (reference, frames) = frames(&topics, object, keys.as_ref(), max_packet);
    let count = frames.len() - 1;
    publish(&config.broker, frames, Duration::from_secs(60)).await?;
    record_publish(&config, &reference.name, &reference.sha256_hex());
    if let Some(key_file) = &config.auth.operator_key_file {
        // A running coordinator names it from its next round on, without a restart.
        let key = crate::store::keys::load_operator(key_file)?;
        let command = fedge_wire::control::Command::SetBackbone {
            name: reference.name.clone(),
            sha256: reference.sha256_hex(),
        };
        let within = Duration::from_secs(10);
        match super::ctl::send(&config.broker, &config.federation, &key, command, within).await {
            Ok(_) => println!(
                "the running coordinator names it in its next round tasks; set the lines \
                 below in {} so that a restart keeps it",
                config_path.display()
            ),
            Err(e) => eprintln!("not applied to a running coordinator: {e:#}"),
        }
    }
    println!(
        "{}: {megabytes:.1} MB in {count} retained message(s) on {}\n\
         sha256 {}\n\
         devices with backbone = \"federation\" fetch it; round tasks name it with\n\
         [model] backbone = {:?}\n\
         backbone_sha256 = \"{}\"\n\
         in {} (with [auth] operator_key_file, a running coordinator is told at once)",
        reference.name,
        topics.backbone(&reference.sha256_hex()),
        reference.sha256_hex(),
        reference.name,
        reference.sha256_hex(),
        config_path.display()
    );
    Ok(())
}
