//! The coordinator's frames a device reads (round tasks, released models): reassembled from
//! their chunks, opened with the device's key, decoded.

use fedge_wire::{DecodeError, DeviceKey, Message, ModelRelease, Reassembler, RoundTask};

use super::TaskError;

/// The message in `payload`, or in the frame its chunk completes; `None` while chunks are
/// missing.
fn whole_frame(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
) -> Option<Result<Message, DecodeError>> {
    match fedge_wire::decode(payload) {
        Ok(Message::Chunk(chunk)) => match reassembler.push("coordinator", chunk, now_ms) {
            Ok(Some(frame)) => Some(fedge_wire::decode(&frame)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        },
        other => Some(other),
    }
}

/// The round task in a payload: `Ok(None)` while chunks are missing, for tasks that do not
/// concern this device and for undecodable payloads (logged); `Err` for a task that names this
/// device but fails authentication (reported in the device's status).
pub fn decode_task(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Result<Option<RoundTask>, TaskError> {
    let Some(message) = whole_frame(reassembler, payload, now_ms) else {
        return Ok(None);
    };
    let message = match (message, key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            if !sealed.names(client_id) {
                return Ok(None);
            }
            fedge_wire::decode(sealed.open(client_id, key)?)
        }
        // A device without a key follows tasks without checking their tags.
        (Ok(Message::Sealed(sealed)), None) => fedge_wire::decode(&sealed.inner),
        (Ok(Message::RoundTask(task)), Some(_)) if task.selected.iter().any(|c| c == client_id) => {
            return Err(TaskError::Untagged);
        }
        (other, _) => other,
    };
    match message {
        Ok(Message::RoundTask(task)) => Ok(Some(task)),
        Ok(_) => {
            tracing::debug!("ignoring a message that is not a round task on the task topic");
            Ok(None)
        }
        Err(e) => {
            tracing::debug!(error = %e, "ignoring an undecodable round task");
            Ok(None)
        }
    }
}

/// The release in a payload: `Ok(None)` while chunks are missing and for payloads that are not
/// releases (logged); `Err` for a release that fails its checks: digest, layout, or with a key
/// its seal (a device with a key believes only sealed releases that name it).
pub fn decode_release(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Result<Option<ModelRelease>, String> {
    let Some(message) = whole_frame(reassembler, payload, now_ms) else {
        return Ok(None);
    };
    let message = match (message, key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            let inner = sealed.open(client_id, key).map_err(|e| e.to_string())?;
            fedge_wire::decode(inner)
        }
        (Ok(Message::Sealed(sealed)), None) => fedge_wire::decode(&sealed.inner),
        (Ok(Message::Model(_)), Some(_)) => {
            return Err(
                "a release without the coordinator's tag, but this device has a key".into(),
            );
        }
        (other, _) => other,
    };
    match message {
        Ok(Message::Model(release)) => match release.verify() {
            Ok(_) => Ok(Some(release)),
            Err(e) => Err(e.to_string()),
        },
        Ok(_) => Ok(None),
        Err(e) => {
            tracing::debug!(error = %e, "ignoring an undecodable released model");
            Ok(None)
        }
    }
}
