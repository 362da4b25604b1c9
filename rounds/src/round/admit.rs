//! Admission: who may send, and what of a payload is decoded before its sender is trusted.
//!
//! With device keys, an unknown device is turned away before its chunks take reassembly memory,
//! every chunk must carry its device's tag (checked before it is stored, so a forged chunk on a
//! device's topic never displaces a genuine one), a plain update is refused without decoding its
//! body, and a sealed one is opened only with its device's key. Keys or not, chunks are taken
//! only from clients selected in the open round that have not reported yet. Without keys,
//! plain and sealed updates are both taken (sealed ones unverified). Pure functions of the
//! keys, the open round and the bytes; the machine does the bookkeeping.

use fedge_wire::{Chunk, ClientUpdate, DecodeError, Message};

use super::open::OpenRound;
use super::types::{DeviceKeys, Rejection};
use crate::buffer::InFlight;

/// Whether a device status on `client`'s topic may be believed: without keys, any status;
/// with keys, only one carrying `client`'s tag for this federation, and an `online` one only
/// when newer than the last believed (`last`; the same one again changes nothing), so an old
/// genuine status replayed cannot bring a vanished device back. (An `offline` status is not held to that: the broker publishes the
/// Last Will a device registered when it connected, older than what it said since.)
pub(super) fn status(
    auth: Option<&DeviceKeys>,
    federation: &str,
    client: &str,
    status: &fedge_wire::EdgeStatus,
    last: Option<&str>,
) -> Result<Believed, (Rejection, String)> {
    let Some(keys) = auth else {
        return Ok(Believed::Fresh);
    };
    let Some(key) = keys.get(client) else {
        return Err((
            Rejection::UnknownDevice,
            "status from a device without a key".into(),
        ));
    };
    if status.tag.is_none() {
        let detail = "status without a tag; this federation requires device keys".into();
        return Err((Rejection::Unauthenticated, detail));
    }
    if !status.verify(federation, client, key) {
        return Err((Rejection::BadStatusTag, "status tag does not verify".into()));
    }
    match last {
        // The broker hands a reconnecting coordinator every retained status once more.
        Some(last) if status.online && status.updated_at.as_str() == last => Ok(Believed::Again),
        Some(last) if status.online && status.updated_at.as_str() < last => Err((
            Rejection::Replay,
            format!("status of {} is not newer than {last}", status.updated_at),
        )),
        _ => Ok(Believed::Fresh),
    }
}

/// A device status that may be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Believed {
    /// News: act on it.
    Fresh,
    /// The very status believed last, again: nothing new, and no replay to count.
    Again,
}

/// Whether a chunk from `client` may enter reassembly: a round is open, `client` is selected
/// in it (buffered mode: is in flight) and has not reported, and with keys the chunk carries `client`'s valid tag.
pub(super) fn chunk(
    auth: Option<&DeviceKeys>,
    open: Option<&OpenRound>,
    in_flight: Option<&InFlight>,
    client: &str,
    chunk: &Chunk,
) -> Result<(), (Rejection, String)> {
    let Some(open) = open else {
        return Err((Rejection::WrongRound, "chunk while no round is open".into()));
    };
    // Buffered mode: from a device given a task of this version or an earlier one.
    let expected = match in_flight {
        Some(in_flight) => in_flight.contains(client),
        None => open.selected.contains(client),
    };
    if !expected {
        let detail = format!("chunk from a client not selected in round {}", open.round);
        return Err((Rejection::NotSelected, detail));
    }
    if open.accepted.contains(client) {
        let detail = format!("chunk after the update for round {}", open.round);
        return Err((Rejection::Duplicate, detail));
    }
    let Some(keys) = auth else {
        return Ok(());
    };
    let Some(key) = keys.get(client) else {
        return Err((Rejection::UnknownDevice, "device without a key".into()));
    };
    match chunk.tag {
        None => Err((
            Rejection::Unauthenticated,
            "chunk without a tag; this federation requires device keys".into(),
        )),
        Some(_) if key.verify_chunk(client, chunk) => Ok(()),
        Some(_) => Err((
            Rejection::BadChunkTag,
            format!(
                "chunk {} of message {} has a bad tag",
                chunk.index, chunk.message_id
            ),
        )),
    }
}

/// With device keys, whether `client` has none.
pub(super) fn unknown_device(auth: Option<&DeviceKeys>, client: &str) -> bool {
    auth.is_some_and(|keys| !keys.contains_key(client))
}

/// Decodes a frame; with device keys, a plain update is refused without decoding its body
/// (`authenticated_update` then rejects it as `unauthenticated`).
pub(super) fn decode(auth: Option<&DeviceKeys>, bytes: &[u8]) -> Result<Message, DecodeError> {
    let frame = fedge_wire::decode_frame(bytes)?;
    if auth.is_some() && frame.kind == fedge_wire::Kind::ClientUpdate {
        return Err(DecodeError::Unauthenticated);
    }
    fedge_wire::decode_checked(frame)
}

/// The update inside a decoded message, its tag checked when authentication is on.
pub(super) fn authenticated_update(
    auth: Option<&DeviceKeys>,
    client: &str,
    message: Message,
) -> Result<ClientUpdate, (Rejection, String)> {
    let sealed = match message {
        Message::ClientUpdate(update) => {
            return match auth {
                None => Ok(update),
                Some(_) => Err((
                    Rejection::Unauthenticated,
                    "update without a tag; this federation requires device keys".into(),
                )),
            };
        }
        Message::Sealed(sealed) => sealed,
        Message::RoundTask(_) => {
            return Err((Rejection::WrongKind, "round task on an update topic".into()));
        }
        Message::Model(_) | Message::Backbone(_) => {
            return Err((
                Rejection::WrongKind,
                "model release or backbone on an update topic".into(),
            ));
        }
        Message::Chunk(_) => {
            return Err((
                Rejection::WrongKind,
                "chunk where a message was expected".into(),
            ));
        }
    };
    let inner = match auth {
        // Without keys there is nothing to check a tag against.
        None => &sealed.inner[..],
        Some(keys) => {
            let key = keys
                .get(client)
                .ok_or_else(|| (Rejection::UnknownDevice, "device without a key".to_owned()))?;
            sealed
                .open(client, key)
                .map_err(|e| (Rejection::BadTag, e.to_string()))?
        }
    };
    match fedge_wire::decode(inner) {
        Ok(Message::ClientUpdate(update)) => Ok(update),
        Ok(_) => Err((
            Rejection::WrongKind,
            "sealed message is not an update".into(),
        )),
        Err(e) => Err((Rejection::of_decode(&e), e.to_string())),
    }
}
