//! `backbone = "federation"`: the device takes the backbone the federation distributes
//! (`fedge-coordinator publish-backbone`). Before the agent starts, [`fetch_backbone`] reads
//! which backbone the federation trains on (a round task that names one, else the retained
//! pointer on `backbone/current`), and unless `cache_dir/backbones/` holds it already, fetches
//! the retained object, checks its seal (with a key) and the SHA-256 of its ONNX file, and
//! keeps it there. A device that cannot (no cache folder, larger than its memory budget
//! allows, a digest that does not match, a disk that refuses the file) says why in its status,
//! offline, and takes part in no round.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fedge_wire::{BackboneObject, BackboneRef, DeviceKey, EdgeStatus, Reassembler, Topics};
use rumqttc::{Client, Connection, Event, Packet, QoS};

use crate::config::EdgeConfig;

/// The card of the cached backbone `reference` in `cache_dir`, when it is there and its ONNX
/// file still has the digest.
pub fn cached_card(cache_dir: &Path, reference: &BackboneRef) -> Option<PathBuf> {
    let hex = reference.sha256_hex();
    let folder = cache_dir.join("backbones");
    let card = folder.join(format!("{hex}.toml"));
    let onnx = std::fs::read(folder.join(format!("{hex}.onnx"))).ok()?;
    (card.exists() && BackboneRef::of(&reference.name, &onnx).sha256 == reference.sha256)
        .then_some(card)
}

/// Keeps `object` in `cache_dir/backbones/` as `<sha256>.onnx` and its card `<sha256>.toml`
/// (the card's `file` pointing at the ONNX file); returns the card.
pub fn store(cache_dir: &Path, object: &BackboneObject) -> Result<PathBuf, String> {
    let hex = object.reference().sha256_hex();
    let folder = cache_dir.join("backbones");
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let mut card: toml::Table = toml::from_str(&object.card)
        .map_err(|e| format!("the federation's backbone card is not TOML: {e}"))?;
    card.insert("file".into(), toml::Value::String(format!("{hex}.onnx")));
    let card_text = toml::to_string(&card).map_err(|e| e.to_string())?;
    let write = |name: String, bytes: &[u8]| {
        let path = folder.join(name);
        fedge_daemon::write_atomically(&path, bytes, fedge_daemon::Visibility::Private)
            .map_err(|e| format!("cannot keep the backbone in {}: {e}", path.display()))
            .map(|()| path)
    };
    // The ONNX file first: a card on disk means its file is complete.
    write(format!("{hex}.onnx"), &object.onnx)?;
    write(format!("{hex}.toml"), card_text.as_bytes())
}

/// The largest backbone a device may take: half its memory budget, at most the wire's limit.
fn size_limit(memory_budget_mb: u64) -> usize {
    match memory_budget_mb {
        0 => fedge_wire::MAX_MESSAGE_BYTES,
        mb => (mb as usize * (1 << 20) / 2).min(fedge_wire::MAX_MESSAGE_BYTES),
    }
}

/// Fetches the federation's backbone (or `wanted`, the one a task named) within `timeout`;
/// returns its card in the cache. On failure the device's status says why.
pub fn fetch_backbone(
    config: &EdgeConfig,
    wanted: Option<BackboneRef>,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let key = config.load_key().map_err(|e| format!("{e:#}"))?;
    let topics = Topics::new(&config.federation).map_err(|e| e.to_string())?;
    let id = format!("fedge-fetch-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    let result = fetch(
        config,
        &topics,
        key.as_ref(),
        wanted,
        &client,
        &mut connection,
        timeout,
    );
    if let Err(reason) = &result {
        let mut status = EdgeStatus {
            client_id: config.client_id.clone(),
            online: false,
            profile: config.profile.clone(),
            last_error: format!("cannot take the federation's backbone: {reason}"),
            updated_at: fedge_mqtt::now_rfc3339(),
            ..EdgeStatus::default()
        };
        if let Some(key) = &key {
            status.sign(&config.federation, key);
        }
        let topic = topics.edge_status(&config.client_id);
        let json = serde_json::to_vec(&status).unwrap_or_default();
        if client.publish(topic, QoS::AtLeastOnce, true, json).is_ok() {
            // Until the broker has it (or a second passes).
            let end = Instant::now() + Duration::from_secs(1);
            while let Some(left) = end.checked_duration_since(Instant::now()) {
                match connection.recv_timeout(left) {
                    Ok(Ok(Event::Incoming(Packet::PubAck(_)))) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(_)) => {}
                }
            }
        }
    }
    let _ = client.disconnect();
    result
}

fn fetch(
    config: &EdgeConfig,
    topics: &Topics,
    key: Option<&DeviceKey>,
    mut wanted: Option<BackboneRef>,
    client: &Client,
    connection: &mut Connection,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let Some(cache_dir) = config.cache_dir.clone() else {
        return Err("set cache_dir: where the federation's backbone is kept".into());
    };
    let subscribe =
        |filter: String| (client.subscribe(filter, QoS::AtLeastOnce)).map_err(|e| e.to_string());
    subscribe(topics.backbone_current())?;
    subscribe(topics.round_task())?;
    subscribe(format!("{}/+", topics.round_task()))?;
    let limit = size_limit(config.resources.memory_budget_mb);
    let mut tasks = Reassembler::new(timeout.as_millis() as u64, fedge_wire::MAX_MESSAGE_BYTES);
    let mut objects = Reassembler::new(timeout.as_millis() as u64, limit);
    let mut fetching: Option<String> = None;
    let mut refused: Option<String> = None;
    let start = Instant::now();
    loop {
        // Once per backbone named (reading the cache hashes the whole file), not per message.
        if let Some(reference) = &wanted {
            let base = topics.backbone(&reference.sha256_hex());
            if fetching.as_deref() != Some(base.as_str()) {
                if let Some(card) = cached_card(&cache_dir, reference) {
                    return Ok(card);
                }
                subscribe(base.clone())?;
                subscribe(format!("{base}/+"))?;
                fetching = Some(base);
            }
        }
        let Some(left) = timeout.checked_sub(start.elapsed()) else {
            return Err(match &wanted {
                None => "the broker holds no backbone/current (run fedge-coordinator \
                         publish-backbone)"
                    .into(),
                Some(r) => format!(
                    "backbone {:?} (sha256 {}…) did not arrive{}",
                    r.name,
                    r.short(),
                    refused.map_or(String::new(), |e| format!(" (a piece was refused: {e})"))
                ),
            });
        };
        let event = match connection.recv_timeout(left) {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => return Err(format!("the broker: {}", fedge_mqtt::describe_error(&e))),
            Err(_) => continue,
        };
        let Event::Incoming(Packet::Publish(p)) = event else {
            continue;
        };
        let now = start.elapsed().as_millis() as u64;
        let client_id = &config.client_id;
        if p.topic == topics.backbone_current() {
            // A round task's word comes first; the pointer only when no task named one.
            if wanted.is_none() {
                wanted = fedge_wire::decode_pointer(&p.payload, client_id, key);
            }
        } else if p.topic.starts_with(&topics.round_task()) {
            let task = fedge_wire::decode_task(&mut tasks, &p.payload, now, client_id, key);
            if let Ok(Some(task)) = task
                && task.backbone.is_some()
            {
                wanted = task.backbone;
            }
        } else if let (Some(base), Some(reference)) = (&fetching, &wanted)
            && p.topic.starts_with(base.as_str())
        {
            let got = fedge_wire::decode_backbone(
                &mut objects,
                &p.payload,
                now,
                client_id,
                key,
                reference,
            );
            match got {
                Ok(Some(object)) => return store(&cache_dir, &object),
                Ok(None) => {}
                Err(e) if e.contains("too large") => {
                    return Err(format!(
                        "{e}: larger than half this device's memory_budget_mb ({} MiB) allows",
                        config.resources.memory_budget_mb
                    ));
                }
                // A junk piece (anyone may publish on the topic) is no reason to stop: the
                // genuine object may still complete; the last refusal is said at the timeout.
                Err(e) => refused = Some(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_backbone_is_found_by_its_digest_and_a_changed_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let object = BackboneObject {
            card: "name = \"tiny\"\nfile = \"tiny.onnx\"\nfeature_size = 4\n".into(),
            name: "tiny".into(),
            onnx: vec![1, 2, 3],
        };
        let reference = object.reference();
        assert_eq!(cached_card(dir.path(), &reference), None);
        let card = store(dir.path(), &object).unwrap();
        assert_eq!(cached_card(dir.path(), &reference), Some(card.clone()));
        let text = std::fs::read_to_string(&card).unwrap();
        assert!(text.contains(&format!("file = \"{}.onnx\"", reference.sha256_hex())));
        assert!(text.contains("feature_size = 4"), "{text}");
        let onnx = card.with_extension("onnx");
        std::fs::write(onnx, [9, 9]).unwrap();
        assert_eq!(cached_card(dir.path(), &reference), None, "a changed file");
    }

    #[test]
    fn the_size_limit_is_half_the_memory_budget() {
        assert_eq!(size_limit(0), fedge_wire::MAX_MESSAGE_BYTES);
        assert_eq!(size_limit(64), 32 << 20);
    }
}
