//! `fedge-edge check` against the running federation, in one MQTT session: the login, then the
//! retained round task, released model and backbone pointer on the broker, read for a few
//! seconds. They tell the protocol version the coordinator speaks, the backbone its tasks name
//! (by the SHA-256 of its ONNX file; a device whose file has another digest refuses every
//! round), the one `fedge-coordinator publish-backbone` distributes, and the one its model was
//! trained on; they must be this device's.
//!
//! With device keys the coordinator seals each task for the devices it selected; a device
//! not selected this round (one being checked before it first goes online) reads the task
//! inside without its seal: under the shipped ACL only the coordinator writes there, and the
//! check only compares, it acts on nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fedge_daemon::checks::{Check, fail, pass};
use fedge_wire::{
    BackboneRef, DecodeError, DeviceKey, Message, PREVIOUS_PROTOCOL_VERSION, PROTOCOL_VERSION,
    Reassembler, RoundTask, Topics,
};
use rumqttc::{Client, Connection, Event, Packet, QoS};

use crate::config::EdgeConfig;

/// How long the login may take.
const LOGIN: Duration = Duration::from_secs(10);

/// How long the retained messages are waited for.
const LISTEN: Duration = Duration::from_secs(3);

/// This device's backbone: its reference and the ONNX file it was read from.
struct Ours {
    reference: BackboneRef,
    onnx: PathBuf,
}

/// What the broker holds for the federation.
#[derive(Debug, Default)]
struct Seen {
    /// Frames read.
    frames: usize,
    /// The protocol version of a frame this device cannot read.
    other_version: Option<u8>,
    /// The version the coordinator's frames were written in, when one was read.
    version: Option<u8>,
    /// The backbone the round task names, if it names one, and the task's round.
    task_backbone: Option<(BackboneRef, u64)>,
    /// The task was sealed for other devices and read without its seal.
    task_unsealed: bool,
    /// The backbone `backbone/current` points at.
    pointer: Option<BackboneRef>,
    /// The released model's round and backbone.
    release: Option<(u64, String)>,
    /// The released head's projector width.
    hidden: Option<usize>,
}

/// The login, then, when this device's backbone loaded, the federation's comparison.
pub fn check_session(config: &EdgeConfig, backbone: Option<&fedge_models::Backbone>) -> Vec<Check> {
    let id = format!("fedge-check-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    if let Err(refused) = login(&mut connection) {
        return vec![fail("login", refused)];
    }
    let mut checks = vec![pass("login", "the broker accepted the MQTT login")];
    if let Some(backbone) = backbone {
        let ours = Ours {
            reference: backbone.reference().clone(),
            onnx: backbone.origin().to_owned(),
        };
        checks.push(match compare(config, &ours, &client, &mut connection) {
            Ok(found) => pass("federation", found),
            Err(fix) => fail("federation", fix),
        });
    }
    // Until the broker has the DISCONNECT (or a moment passed): a clean end, no error logged.
    if client.disconnect().is_ok() {
        let _ = connection.recv_timeout(Duration::from_millis(500));
    }
    checks
}

/// Waits for the broker's answer to the login.
fn login(connection: &mut Connection) -> Result<(), String> {
    let start = Instant::now();
    while let Some(left) = LOGIN.checked_sub(start.elapsed()) {
        match connection.recv_timeout(left) {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("the broker: {}", fedge_mqtt::describe_error(&e))),
            Err(_) => break,
        }
    }
    Err(format!(
        "the broker did not answer the MQTT login within {} s",
        LOGIN.as_secs()
    ))
}

/// The federation check: what matches (`Ok`) or what to fix (`Err`).
fn compare(
    config: &EdgeConfig,
    ours: &Ours,
    client: &Client,
    connection: &mut Connection,
) -> Result<String, String> {
    let backbone = &ours.reference;
    let seen = listen(config, client, connection)?;
    if let Some(version) = seen.other_version {
        return Err(format!(
            "the federation speaks protocol {version}, this device speaks {PROTOCOL_VERSION} \
             (and reads {PREVIOUS_PROTOCOL_VERSION}): install the fedge-edge release that \
             matches the coordinator"
        ));
    }
    // The round task's word first, as the agent refuses rounds by it; the pointer when no
    // task names a backbone.
    let expected = match (&seen.task_backbone, &seen.pointer) {
        (Some((theirs, round)), _) => Some((
            theirs,
            format!(
                "the federation's round task (round {round}{})",
                match seen.task_unsealed {
                    true => ", sealed for the devices selected, read without its seal",
                    false => "",
                }
            ),
        )),
        (None, Some(theirs)) => Some((
            theirs,
            "backbone/current (fedge-coordinator publish-backbone)".to_owned(),
        )),
        (None, None) => None,
    };
    if let Some((theirs, source)) = &expected
        && theirs.sha256 != backbone.sha256
    {
        return Err(format!(
            "{source} names backbone {:?} with sha256 {}, but this profile's ONNX file {} \
             ({:?}) has sha256 {}: the device would refuse every round. Replace {} with the \
             federation's file (`sha256sum` must print {}), or point `backbone` at the \
             federation's card",
            theirs.name,
            theirs.sha256_hex(),
            ours.onnx.display(),
            backbone.name,
            backbone.sha256_hex(),
            ours.onnx.display(),
            theirs.sha256_hex(),
        ));
    }
    let mut found = match seen.version {
        Some(PREVIOUS_PROTOCOL_VERSION) => format!(
            "protocol {PREVIOUS_PROTOCOL_VERSION} (the coordinator writes the previous version \
             for older devices; this device speaks {PROTOCOL_VERSION} and reads both)"
        ),
        _ => format!("protocol {PROTOCOL_VERSION}"),
    };
    match (&seen.task_backbone, &seen.pointer) {
        (Some((theirs, _)), _) => {
            found += &format!(", backbone sha256 {}… as the round task", theirs.short())
        }
        (None, Some(theirs)) => {
            found += &format!(", backbone sha256 {}… as backbone/current", theirs.short())
        }
        (None, None) => {}
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
        None if seen.frames > 0 || seen.pointer.is_some() => {
            Ok(format!("{found} (no model released yet)"))
        }
        None => Ok(
            "nothing retained on the broker yet (no round started): protocol and \
                    backbone not compared"
                .into(),
        ),
    }
}

fn listen(
    config: &EdgeConfig,
    client: &Client,
    connection: &mut Connection,
) -> Result<Seen, String> {
    let topics = Topics::new(&config.federation).map_err(|e| e.to_string())?;
    let key = config.load_key().map_err(|e| format!("{e:#}"))?;
    let pointer = topics.backbone_current();
    let mut filters = vec![pointer.clone()];
    for base in [topics.round_task(), topics.model_current()] {
        filters.extend([base.clone(), format!("{base}/+")]);
    }
    for filter in filters {
        client
            .subscribe(filter, QoS::AtLeastOnce)
            .map_err(|e| e.to_string())?;
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
        if p.topic == pointer {
            seen.pointer = pointer_in(&p.payload, &config.client_id, key.as_ref());
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
            let task = task_in(&mut tasks, &p.payload, now, &config.client_id, key.as_ref());
            if let Some((task, unsealed)) = task {
                seen.task_backbone = task.backbone.map(|b| (b, task.round));
                seen.task_unsealed = unsealed;
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
    Ok(seen)
}

/// The round task in `payload` (or in the frame its chunk completes), and whether it was read
/// without its seal (sealed for the devices selected, not this one). A task sealed for this
/// device whose tag does not verify with its key is not believed.
fn task_in(
    tasks: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Option<(RoundTask, bool)> {
    let message = match fedge_wire::decode(payload).ok()? {
        Message::Chunk(chunk) => {
            let frame = tasks.push("coordinator", chunk, now_ms).ok()??;
            fedge_wire::decode(&frame).ok()?
        }
        other => other,
    };
    let (message, unsealed) = match (message, key) {
        (Message::Sealed(sealed), Some(key)) if sealed.names(client_id) => (
            fedge_wire::decode(sealed.open(client_id, key).ok()?).ok()?,
            false,
        ),
        (Message::Sealed(sealed), key) => (fedge_wire::decode(&sealed.inner).ok()?, key.is_some()),
        (other, _) => (other, false),
    };
    match message {
        Message::RoundTask(task) => Some((task, unsealed)),
        _ => None,
    }
}

/// The backbone `backbone/current` points at: sealed for this device and verified with its
/// key, or, sealed for the devices enrolled when it was published, read inside without it.
fn pointer_in(payload: &[u8], client_id: &str, key: Option<&DeviceKey>) -> Option<BackboneRef> {
    fedge_wire::decode_pointer(payload, client_id, key).or_else(|| {
        match fedge_wire::decode(payload) {
            Ok(Message::Sealed(sealed)) if !sealed.names(client_id) => {
                BackboneRef::from_pointer(&sealed.inner)
            }
            _ => None,
        }
    })
}
