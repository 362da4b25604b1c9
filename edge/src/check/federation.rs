//! `fedge-edge check` against the running federation: the retained round task and released
//! model on the broker, read for a few seconds, tell the protocol version the coordinator speaks,
//! the backbone its tasks name (by the SHA-256 of its ONNX file) and the one its model was
//! trained on; they must be this device's.

use std::time::{Duration, Instant};

use fedge_wire::{
    BackboneRef, DecodeError, PREVIOUS_PROTOCOL_VERSION, PROTOCOL_VERSION, Reassembler, Topics,
};
use rumqttc::{Client, Event, Packet, QoS};

use crate::config::EdgeConfig;

/// How long the retained messages are waited for.
const LISTEN: Duration = Duration::from_secs(3);

/// What the broker holds for the federation.
#[derive(Debug, Default)]
struct Seen {
    /// Frames read.
    frames: usize,
    /// The protocol version of a frame this device cannot read.
    other_version: Option<u8>,
    /// The version the coordinator's frames were written in, when one was read.
    version: Option<u8>,
    /// The backbone the round task names, if it names one.
    task_backbone: Option<BackboneRef>,
    /// The released model's round and backbone.
    release: Option<(u64, String)>,
    /// The released head's projector width.
    hidden: Option<usize>,
}

/// The federation check: what matches (`Ok`) or what to fix (`Err`); `backbone` is this
/// device's backbone (its card's name and the digest of its ONNX file).
pub fn check_federation(config: &EdgeConfig, backbone: &BackboneRef) -> Result<String, String> {
    let seen = listen(config)?;
    if let Some(version) = seen.other_version {
        return Err(format!(
            "the federation speaks protocol {version}, this device speaks {PROTOCOL_VERSION} \
             (and reads {PREVIOUS_PROTOCOL_VERSION}): install the fedge-edge release that \
             matches the coordinator"
        ));
    }
    if let Some(theirs) = &seen.task_backbone
        && theirs.sha256 != backbone.sha256
    {
        return Err(format!(
            "the federation's round task names backbone {:?} (sha256 {}…), this profile runs \
             {:?} (sha256 {}…): point `backbone` at the federation's card and ONNX file",
            theirs.name,
            theirs.short(),
            backbone.name,
            backbone.short()
        ));
    }
    let mut found = match seen.version {
        Some(PREVIOUS_PROTOCOL_VERSION) => format!(
            "protocol {PREVIOUS_PROTOCOL_VERSION} (the coordinator writes the previous version \
             for older devices; this device speaks {PROTOCOL_VERSION} and reads both)"
        ),
        _ => format!("protocol {PROTOCOL_VERSION}"),
    };
    if let Some(theirs) = &seen.task_backbone {
        found += &format!(", backbone sha256 {}… as the round task", theirs.short());
    }
    // The device trains the federation's head whatever its profile says; say so when they
    // differ, so the profile can be put right.
    if let Some(theirs) = seen.hidden.filter(|h| *h != config.hidden) {
        found += &format!(
            "; the federation's head has hidden = {theirs}, this profile says {}: the device \
             follows the federation's (set hidden = {theirs} to agree)",
            config.hidden
        );
    }
    match seen.release {
        Some((round, theirs)) if theirs != backbone.name => Err(format!(
            "the federation's model (round {round}) was trained on backbone {theirs:?}, this \
                 profile runs {:?}: point `backbone` at the federation's card",
            backbone.name
        )),
        Some((round, theirs)) => Ok(format!(
            "{found} and backbone {theirs:?}, as the federation's model of round {round}"
        )),
        None if seen.frames > 0 => Ok(format!("{found} (no model released yet)")),
        None => Ok(
            "nothing retained on the broker yet (no round started): protocol and \
                    backbone not compared"
                .into(),
        ),
    }
}

fn listen(config: &EdgeConfig) -> Result<Seen, String> {
    let topics = Topics::new(&config.federation).map_err(|e| e.to_string())?;
    let key = config.load_key().map_err(|e| format!("{e:#}"))?;
    let id = format!("fedge-check-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    for base in [topics.round_task(), topics.model_current()] {
        for filter in [base.clone(), format!("{base}/+")] {
            client
                .subscribe(filter, QoS::AtLeastOnce)
                .map_err(|e| e.to_string())?;
        }
    }
    let mut seen = Seen::default();
    let mut reassembler =
        Reassembler::new(LISTEN.as_millis() as u64, fedge_wire::MAX_MESSAGE_BYTES);
    let mut tasks = Reassembler::new(LISTEN.as_millis() as u64, fedge_wire::MAX_MESSAGE_BYTES);
    let model = topics.model_current();
    let start = Instant::now();
    while let Some(left) = LISTEN.checked_sub(start.elapsed()) {
        let event = match connection.recv_timeout(left) {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => return Err(format!("the broker: {}", fedge_mqtt::describe_error(&e))),
            Err(_) => break,
        };
        let Event::Incoming(Packet::Publish(p)) = event else {
            continue;
        };
        if p.payload.is_empty() {
            continue;
        }
        seen.frames += 1;
        match fedge_wire::decode_frame(&p.payload) {
            Err(DecodeError::UnsupportedVersion(v)) => seen.other_version = Some(v),
            // The round task's version, which the coordinator chooses for the devices online
            // now, over the release's.
            Ok(frame) if !p.topic.starts_with(&model) || seen.version.is_none() => {
                seen.version = Some(frame.version)
            }
            Ok(_) => {}
            Err(_) => {}
        }
        let now = start.elapsed().as_millis() as u64;
        if !p.topic.starts_with(&model) {
            let task = fedge_wire::decode_task(
                &mut tasks,
                &p.payload,
                now,
                &config.client_id,
                key.as_ref(),
            );
            if let Ok(Some(task)) = task {
                seen.task_backbone = task.backbone;
            }
        } else {
            let payload = &p.payload;
            let release = fedge_wire::decode_release(
                &mut reassembler,
                payload,
                now,
                &config.client_id,
                key.as_ref(),
            );
            if let Ok(Some(release)) = release {
                seen.hidden = Some(release.head.hidden);
                seen.release = Some((release.round, release.backbone));
            }
        }
    }
    let _ = client.disconnect();
    Ok(seen)
}
