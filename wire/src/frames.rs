//! The coordinator's frames a participant reads (round tasks, released models, distributed
//! backbones): reassembled
//! from their chunks, opened with the participant's key, decoded. A device reads them from its
//! coordinator, a site aggregator from the global one.

use crate::{
    AuthError, BackboneObject, BackboneRef, DecodeError, DeviceKey, Message, ModelRelease,
    Reassembler, RoundTask,
};

/// A round task that names this participant but cannot be trusted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskError {
    /// The task's tag for this participant does not verify with its key.
    #[error("round task tag: {0}")]
    Tag(#[from] AuthError),
    /// The task carries no tag although this participant has a key.
    #[error(
        "round task without a tag, but this participant has a key: the coordinator must have \
         its key in its keys file"
    )]
    Untagged,
}

/// The message in `payload`, or in the frame its chunk completes; `None` while chunks are
/// missing.
fn whole_frame(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
) -> Option<Result<Message, DecodeError>> {
    match crate::decode(payload) {
        Ok(Message::Chunk(chunk)) => match reassembler.push("coordinator", chunk, now_ms) {
            Ok(Some(frame)) => Some(crate::decode(&frame)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        },
        other => Some(other),
    }
}

/// The round task in a payload: `Ok(None)` while chunks are missing, for tasks that do not
/// concern this participant and for undecodable payloads; `Err` for a task that names it but
/// fails authentication.
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
            crate::decode(sealed.open(client_id, key)?)
        }
        // A device without a key follows tasks without checking their tags.
        (Ok(Message::Sealed(sealed)), None) => crate::decode(&sealed.inner),
        (Ok(Message::RoundTask(task)), Some(_)) if task.selected.iter().any(|c| c == client_id) => {
            return Err(TaskError::Untagged);
        }
        (other, _) => other,
    };
    match message {
        Ok(Message::RoundTask(task)) => Ok(Some(task)),
        // Not a task, or not decodable: not one this participant can act on.
        Ok(_) | Err(_) => Ok(None),
    }
}

/// A retained frame of the coordinator's (a release, a backbone) with its seal opened: with a
/// key, only a sealed frame that verifies for `client_id` is believed, and an unsealed `what`
/// is refused; without a key the seal is not checked.
fn unsealed(
    message: Result<Message, DecodeError>,
    client_id: &str,
    key: Option<&DeviceKey>,
    what: &str,
) -> Result<Result<Message, DecodeError>, String> {
    match (message, key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            let inner = sealed.open(client_id, key).map_err(|e| e.to_string())?;
            Ok(crate::decode(inner))
        }
        (Ok(Message::Sealed(sealed)), None) => Ok(crate::decode(&sealed.inner)),
        (Ok(Message::Model(_) | Message::Backbone(_)), Some(_)) => Err(format!(
            "a {what} without the coordinator's tag, but this device has a key"
        )),
        (other, _) => Ok(other),
    }
}

/// The release in a payload: `Ok(None)` while chunks are missing and for payloads that are not
/// releases; `Err` for a release that fails its checks: digest, layout, or with a key
/// its seal (a device with a key believes only sealed releases that name it).
pub fn decode_release(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Result<Option<ModelRelease>, String> {
    decode_release_within(reassembler, payload, now_ms, client_id, key, |_| Ok(()))
}

/// [`decode_release`] for a reader that takes only releases of certain sizes: `fits` sees the
/// decoded release (its head's sizes and its parameters' length, nothing unpacked yet) before
/// it is verified, which unpacks every parameter and hashes them; its `Err` is the release's.
pub fn decode_release_within(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
    fits: impl FnOnce(&ModelRelease) -> Result<(), String>,
) -> Result<Option<ModelRelease>, String> {
    let Some(message) = whole_frame(reassembler, payload, now_ms) else {
        return Ok(None);
    };
    let message = unsealed(message, client_id, key, "release")?;
    match message {
        Ok(Message::Model(release)) => {
            fits(&release)?;
            match release.verify() {
                Ok(_) => Ok(Some(release)),
                Err(e) => Err(e.to_string()),
            }
        }
        Ok(_) | Err(_) => Ok(None),
    }
}

/// The backbone a `backbone/current` payload points at: with a key, only a pointer sealed for
/// this device by the coordinator (anyone on the broker could write a plain one); without, a
/// plain JSON pointer (or the inside of a sealed one).
pub fn decode_pointer(
    payload: &[u8],
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Option<crate::BackboneRef> {
    match (crate::decode(payload), key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            crate::BackboneRef::from_pointer(sealed.open(client_id, key).ok()?)
        }
        (Ok(Message::Sealed(sealed)), None) => crate::BackboneRef::from_pointer(&sealed.inner),
        (_, Some(_)) => None,
        (_, None) => crate::BackboneRef::from_pointer(payload),
    }
}

/// The backbone in a payload of `fedge/<f>/backbone/<sha256>`: `Ok(None)` while chunks are
/// missing; `Err` for a backbone whose ONNX digest is not `expected`'s, or, with a key, that
/// lacks the coordinator's seal.
pub fn decode_backbone(
    reassembler: &mut Reassembler,
    payload: &[u8],
    now_ms: u64,
    client_id: &str,
    key: Option<&DeviceKey>,
    expected: &BackboneRef,
) -> Result<Option<BackboneObject>, String> {
    let Some(message) = whole_frame(reassembler, payload, now_ms) else {
        return Ok(None);
    };
    let message = unsealed(message, client_id, key, "backbone")?;
    match message {
        Ok(Message::Backbone(object)) => {
            let found = object.reference();
            if found.sha256 == expected.sha256 {
                Ok(Some(object))
            } else {
                Err(format!(
                    "the backbone's ONNX file has sha256 {}…, not the {}… the federation names",
                    found.short(),
                    expected.short()
                ))
            }
        }
        Ok(other) => Err(format!(
            "a {:?} frame where a backbone was expected",
            other.kind()
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_with_a_key_believes_only_a_pointer_sealed_for_it() {
        let reference = crate::BackboneRef::of("digits-conv", b"onnx bytes");
        let plain = reference.to_pointer();
        let key = DeviceKey::from_bytes([7; 32]);
        let other = DeviceKey::from_bytes([8; 32]);
        let sealed = crate::seal(plain.clone(), &[("cam-01", &key)]);
        assert_eq!(
            decode_pointer(&sealed, "cam-01", Some(&key)),
            Some(reference.clone())
        );
        assert_eq!(
            decode_pointer(&plain, "cam-01", Some(&key)),
            None,
            "anyone can write it"
        );
        assert_eq!(decode_pointer(&sealed, "cam-01", Some(&other)), None);
        assert_eq!(decode_pointer(&sealed, "cam-02", Some(&key)), None);
        assert_eq!(decode_pointer(&plain, "cam-01", None), Some(reference));
    }
}
