//! Authentication: HMAC-SHA256 tags with per-device keys.
//!
//! A sealed message (`crate::Kind::Sealed`) wraps a complete inner frame (a round task or a
//! client update, with its own envelope and CRC) and carries one tag per device:
//! `HMAC-SHA256(key_device, DOMAIN | len(device) | device | inner frame)`.
//!
//! - A device seals its update with its own key and its own id; the coordinator checks the tag
//!   against the key it holds for the client named by the topic.
//! - The coordinator seals a round task once per selected device, each with that device's key,
//!   so a device can check that the task came from whoever holds its key; a device can forge
//!   tasks for nobody but itself.
//!
//! Replay: the run, the round and the client id are inside the tagged inner frame, so a
//! replayed update is a duplicate in its own round, stale in any later one, and foreign in
//! another run or federation (each has its own random run number).
//!
//! Chunks: a device also tags every chunk of its update (`DeviceKey::chunk_tag`, over the
//! chunk's header and bytes with its own domain), so the coordinator refuses a forged chunk
//! on a device's topic before it enters reassembly; the sealed frame's tag still covers the
//! reassembled whole.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::envelope::{Message, encode};
use crate::messages::{Chunk, Sealed, TAG_LEN, Tag};

/// Bytes of a device key.
pub const KEY_LEN: usize = 32;

/// Domain separation for the tag input (a tag for another purpose never verifies here).
const DOMAIN: &[u8] = b"fedge-auth-v1\0";
/// Domain of a chunk's tag (a chunk tag never verifies as a message tag, nor the reverse).
const CHUNK_DOMAIN: &[u8] = b"fedge-chunk-v1\0";
/// Domain of a device status's tag.
const STATUS_DOMAIN: &[u8] = b"fedge-status-v1\0";
/// Operator commands (`crate::control`) are tagged in a domain of their own.
const CONTROL_DOMAIN: &[u8] = b"fedge-control-v1\0";

type HmacSha256 = Hmac<Sha256>;

/// A device's secret key: 32 bytes, written as 64 hex digits in key files.
#[derive(Clone, PartialEq, Eq)]
pub struct DeviceKey([u8; KEY_LEN]);

impl std::fmt::Debug for DeviceKey {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceKey(..)")
    }
}

/// A key file or key string that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not 64 hex digits.
    #[error("a device key must be 64 hex digits (32 bytes), found {0} characters")]
    Length(usize),
    /// A character that is not a hex digit.
    #[error("a device key must be hex digits only (0-9, a-f)")]
    NotHex,
}

impl DeviceKey {
    /// A key from raw bytes (for example from a random source).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// Parses 64 hex digits; surrounding whitespace (a key file's newline) is ignored.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.len() != 2 * KEY_LEN {
            return Err(KeyError::Length(text.chars().count()));
        }
        let mut bytes = [0u8; KEY_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = text.get(2 * i..2 * i + 2).ok_or(KeyError::NotHex)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| KeyError::NotHex)?;
        }
        Ok(Self(bytes))
    }

    /// The key as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        crate::hex::encode(&self.0)
    }

    fn mac(&self, device: &str, inner: &[u8]) -> HmacSha256 {
        self.mac_in(DOMAIN, device, inner)
    }

    fn mac_in(&self, domain: &[u8], device: &str, inner: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length; 32 bytes never fails.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.0)
            .expect("HMAC-SHA256 takes a key of any length");
        mac.update(domain);
        // Client ids are at most 64 bytes (`valid_client_id`); longer ones are cut to 255 in the
        // length byte but still hashed whole.
        mac.update(&[device.len().min(255) as u8]);
        mac.update(device.as_bytes());
        mac.update(inner);
        mac
    }

    /// The tag of `inner` for `device`.
    pub fn tag(&self, device: &str, inner: &[u8]) -> [u8; TAG_LEN] {
        self.mac(device, inner).finalize().into_bytes().into()
    }

    /// Checks a tag in constant time.
    pub fn verify(&self, device: &str, inner: &[u8], tag: &[u8; TAG_LEN]) -> bool {
        self.mac(device, inner).verify_slice(tag).is_ok()
    }

    /// The tag of a status document's signed bytes (`crate::EdgeStatus::sign`).
    pub fn status_tag(&self, device: &str, signed: &[u8]) -> [u8; TAG_LEN] {
        let mac = self.mac_in(STATUS_DOMAIN, device, signed);
        mac.finalize().into_bytes().into()
    }

    /// Checks a status tag in constant time.
    pub fn verify_status(&self, device: &str, signed: &[u8], tag: &[u8; TAG_LEN]) -> bool {
        self.mac_in(STATUS_DOMAIN, device, signed)
            .verify_slice(tag)
            .is_ok()
    }

    /// The tag of an operator command's signed bytes for `federation` (`crate::control`).
    pub fn control_tag(&self, federation: &str, signed: &[u8]) -> [u8; TAG_LEN] {
        let mac = self.mac_in(CONTROL_DOMAIN, federation, signed);
        mac.finalize().into_bytes().into()
    }

    /// Checks an operator command's tag in constant time.
    pub fn verify_control(&self, federation: &str, signed: &[u8], tag: &[u8; TAG_LEN]) -> bool {
        self.mac_in(CONTROL_DOMAIN, federation, signed)
            .verify_slice(tag)
            .is_ok()
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The tag of one chunk from `device`: over its message id, index, count, frame length and
    /// bytes (everything but the tag itself).
    pub fn chunk_tag(&self, device: &str, chunk: &Chunk) -> [u8; TAG_LEN] {
        self.chunk_mac(device, chunk).finalize().into_bytes().into()
    }

    /// Whether `chunk` carries `device`'s valid tag (constant-time check).
    pub fn verify_chunk(&self, device: &str, chunk: &Chunk) -> bool {
        match &chunk.tag {
            Some(tag) => self.chunk_mac(device, chunk).verify_slice(tag).is_ok(),
            None => false,
        }
    }

    fn chunk_mac(&self, device: &str, chunk: &Chunk) -> HmacSha256 {
        let mut mac = self.mac_in(CHUNK_DOMAIN, device, &chunk.message_id.to_le_bytes());
        mac.update(&chunk.index.to_le_bytes());
        mac.update(&chunk.count.to_le_bytes());
        mac.update(&chunk.total_len.to_le_bytes());
        mac.update(&chunk.data);
        mac
    }
}

/// Why a sealed message does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No tag for this device.
    #[error(
        "no tag for this device: the coordinator does not hold its key (revoked, or not enrolled \
         yet); enrol it (fedge-edge enroll) or ask the operator"
    )]
    NoTag,
    /// The tag does not match the key.
    #[error(
        "the tag does not match this device's key: the coordinator holds another one for it \
         (enrolled again elsewhere, or a stale key_file); enrol it again"
    )]
    BadTag,
}

impl Sealed {
    /// Seals `inner` with one tag per `(device, key)`.
    pub fn new(inner: Vec<u8>, signers: &[(&str, &DeviceKey)]) -> Self {
        let tags = signers
            .iter()
            .map(|(device, key)| Tag {
                device: (*device).to_owned(),
                mac: key.tag(device, &inner),
            })
            .collect();
        Self { tags, inner }
    }

    /// The inner frame when `device`'s tag verifies with `key`.
    pub fn open(&self, device: &str, key: &DeviceKey) -> Result<&[u8], AuthError> {
        let tag = self
            .tags
            .iter()
            .find(|t| t.device == device)
            .ok_or(AuthError::NoTag)?;
        if key.verify(device, &self.inner, &tag.mac) {
            Ok(&self.inner)
        } else {
            Err(AuthError::BadTag)
        }
    }

    /// True when the message carries a tag for `device` (verified or not).
    pub fn names(&self, device: &str) -> bool {
        self.tags.iter().any(|t| t.device == device)
    }
}

/// The framed [`Sealed`] message around `inner`, one tag per `(device, key)`: what devices
/// publish for an update and the coordinator for a task.
pub fn seal(inner: Vec<u8>, signers: &[(&str, &DeviceKey)]) -> Vec<u8> {
    encode(&Message::Sealed(Sealed::new(inner, signers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> DeviceKey {
        DeviceKey::from_bytes([byte; KEY_LEN])
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231_case_2() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = <HmacSha256 as Mac>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn keys_round_trip_through_hex_and_reject_bad_text() {
        let k = DeviceKey::from_bytes(std::array::from_fn(|i| i as u8 * 7));
        assert_eq!(DeviceKey::from_hex(&format!("{}\n", k.to_hex())), Ok(k));
        assert_eq!(DeviceKey::from_hex("abcd"), Err(KeyError::Length(4)));
        assert_eq!(DeviceKey::from_hex(&"zz".repeat(32)), Err(KeyError::NotHex));
        assert_eq!(DeviceKey::from_hex(&"é".repeat(32)), Err(KeyError::NotHex));
        assert_eq!(format!("{:?}", key(1)), "DeviceKey(..)");
    }

    #[test]
    fn a_tag_opens_only_with_its_key_device_and_bytes() {
        let inner = b"FDGE\x03\x02 an inner frame".to_vec();
        let sealed = Sealed::new(inner.clone(), &[("cam-1", &key(1)), ("cam-2", &key(2))]);
        assert_eq!(sealed.open("cam-1", &key(1)), Ok(&inner[..]));
        assert_eq!(sealed.open("cam-2", &key(2)), Ok(&inner[..]));
        assert_eq!(sealed.open("cam-1", &key(2)), Err(AuthError::BadTag));
        assert_eq!(sealed.open("cam-3", &key(1)), Err(AuthError::NoTag));
        // The device id is part of the tagged input: cam-2's tag relabelled as cam-1's fails.
        let mut relabelled = sealed.clone();
        relabelled.tags[1].device = "cam-1".into();
        relabelled.tags.remove(0);
        assert_eq!(relabelled.open("cam-1", &key(2)), Err(AuthError::BadTag));
        // Any flipped bit of the inner frame breaks the tag.
        for i in 0..inner.len() {
            let mut forged = sealed.clone();
            forged.inner[i] ^= 0x01;
            assert_eq!(forged.open("cam-1", &key(1)), Err(AuthError::BadTag));
        }
        assert!(sealed.names("cam-2") && !sealed.names("cam-3"));
    }

    #[test]
    fn a_chunk_tag_covers_every_header_field_and_byte() {
        let mut chunk = Chunk {
            message_id: 9,
            index: 1,
            count: 3,
            total_len: 300,
            data: vec![7; 100],
            tag: None,
        };
        assert!(
            !key(1).verify_chunk("cam-1", &chunk),
            "an untagged chunk never verifies"
        );
        chunk.tag = Some(key(1).chunk_tag("cam-1", &chunk));
        assert!(key(1).verify_chunk("cam-1", &chunk));
        assert!(!key(2).verify_chunk("cam-1", &chunk));
        assert!(!key(1).verify_chunk("cam-2", &chunk));
        let forgeries: [fn(&mut Chunk); 5] = [
            |c| c.message_id += 1,
            |c| c.index = 2,
            |c| c.count = 4,
            |c| c.total_len = 301,
            |c| c.data[50] ^= 1,
        ];
        for forge in forgeries {
            let mut forged = chunk.clone();
            forge(&mut forged);
            assert!(!key(1).verify_chunk("cam-1", &forged));
        }
        // A chunk tag is no message tag: the domains differ.
        assert_ne!(chunk.tag, Some(key(1).tag("cam-1", &chunk.data)));
    }
}
