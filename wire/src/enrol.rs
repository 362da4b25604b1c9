//! Enrolment: a device obtains its key over MQTT with a one-time token.
//!
//! 1. `fedge-coordinator enroll --client cam-09` keeps a random [`EnrolToken`] for the device
//!    and prints it; whoever installs the device types it in once.
//! 2. `fedge-edge enroll --token …` draws an X25519 secret and publishes an [`EnrolRequest`] on
//!    `fedge/<f>/enrol/<client>/request`: its public value, tagged with HMAC-SHA256 keyed by the
//!    token, so that only a holder of the token can spend it.
//! 3. The coordinator checks the tag against the token it keeps for that client, draws its own
//!    X25519 secret and a fresh device key, and derives a wrapping key with HKDF-SHA256 from
//!    the shared X25519 secret, salted with the token and bound to the federation, the client
//!    and both public values. It seals the device key under it with ChaCha20-Poly1305, adds
//!    the device to its keys file, forgets the token and publishes an [`EnrolResponse`] on
//!    `fedge/<f>/enrol/<client>/response`.
//! 4. The device derives the same wrapping key, opens the sealed key and writes its key file.
//!
//! What this protects: the key never travels in clear, and a passive observer who learns the
//! token afterwards still lacks the X25519 secrets; without the token no one can make a
//! request the coordinator accepts (nor spend the token) or a response the device opens. A
//! token works once: the coordinator forgets it when it answers.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::{DeviceKey, KEY_LEN};

/// Bytes of an enrolment token (written as 32 hex digits).
pub const TOKEN_LEN: usize = 16;
/// Bytes of an X25519 secret or public value.
pub const X25519_LEN: usize = 32;

/// Domain of a request's tag.
const REQUEST_DOMAIN: &[u8] = b"fedge-enrol-request-v1\0";
/// HKDF's `info` prefix for the wrapping key.
const WRAP_DOMAIN: &[u8] = b"fedge-enrol-wrap-v1\0";

/// A one-time enrolment token.
#[derive(Clone, PartialEq, Eq)]
pub struct EnrolToken([u8; TOKEN_LEN]);

impl std::fmt::Debug for EnrolToken {
    /// Never prints the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnrolToken(..)")
    }
}

/// Why an enrolment message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnrolError {
    /// Not an enrolment message.
    #[error("not an enrolment message: {0}")]
    Malformed(String),
    /// A token or a hex field of the wrong form.
    #[error("{0} must be {1} hex digits")]
    Hex(&'static str, usize),
    /// For another federation or client.
    #[error("an enrolment for {0:?}")]
    Elsewhere(String),
    /// The request's tag does not verify with the token (a wrong or used token).
    #[error("the request's tag does not verify with the client's enrolment token")]
    Tag,
    /// The sealed key does not open (another token, or a forged response).
    #[error("the sealed key does not open with this token (a forged or foreign response)")]
    Seal,
    /// The coordinator refused the request.
    #[error("the coordinator refused the enrolment: {0}")]
    Refused(String),
}

impl EnrolToken {
    /// A token from raw bytes (from a random source).
    pub fn from_bytes(bytes: [u8; TOKEN_LEN]) -> Self {
        Self(bytes)
    }

    /// Parses 32 hex digits; whitespace and dashes (a token typed in groups) are ignored.
    pub fn from_hex(text: &str) -> Result<Self, EnrolError> {
        let digits: String = text
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '-')
            .collect();
        Ok(Self(hex_array(&digits, "an enrolment token")?))
    }

    /// The token as 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// A device's request for its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolRequest {
    /// The federation it enrols in.
    pub federation: String,
    /// The device's client id.
    pub client: String,
    /// The device's X25519 public value, hex.
    pub device_public: String,
    /// HMAC-SHA256 of the fields above keyed by the token, hex.
    pub tag: String,
}

/// The coordinator's answer: the device key sealed for the device, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolResponse {
    /// The federation.
    pub federation: String,
    /// The device.
    pub client: String,
    /// The coordinator's X25519 public value, hex (empty when refused).
    #[serde(default)]
    pub coordinator_public: String,
    /// The device key sealed with ChaCha20-Poly1305, hex (empty when refused).
    #[serde(default)]
    pub sealed_key: String,
    /// Why the coordinator refused (unauthenticated: a hint for the operator, never trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

fn request_tag(token: &EnrolToken, federation: &str, client: &str, public: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&token.0).expect("HMAC key of any length");
    for field in [REQUEST_DOMAIN, federation.as_bytes(), client.as_bytes()] {
        mac.update(&(field.len() as u32).to_le_bytes());
        mac.update(field);
    }
    mac.update(public.as_bytes());
    mac
}

impl EnrolRequest {
    /// The request of `client` in `federation`, whose X25519 secret is `device_secret` (32
    /// random bytes the caller draws and keeps to open the response).
    pub fn new(
        federation: &str,
        client: &str,
        token: &EnrolToken,
        device_secret: [u8; X25519_LEN],
    ) -> Self {
        let public = PublicKey::from(&StaticSecret::from(device_secret));
        let device_public = hex(public.as_bytes());
        let tag = request_tag(token, federation, client, &device_public);
        Self {
            federation: federation.into(),
            client: client.into(),
            tag: hex(&tag.finalize().into_bytes()),
            device_public,
        }
    }

    /// Reads a request from JSON.
    pub fn parse(payload: &[u8]) -> Result<Self, EnrolError> {
        serde_json::from_slice(payload).map_err(|e| EnrolError::Malformed(e.to_string()))
    }

    /// Checks that the request is for `federation` and `client` and tagged with `token`.
    pub fn verify(
        &self,
        federation: &str,
        client: &str,
        token: &EnrolToken,
    ) -> Result<(), EnrolError> {
        if self.federation != federation || self.client != client {
            let elsewhere = format!("{}/{}", self.federation, self.client);
            return Err(EnrolError::Elsewhere(elsewhere));
        }
        let tag: [u8; 32] =
            hex_array(&self.tag, "the request's tag").map_err(|_| EnrolError::Tag)?;
        let mac = request_tag(token, federation, client, &self.device_public);
        mac.verify_slice(&tag).map_err(|_| EnrolError::Tag)?;
        hex_array::<X25519_LEN>(&self.device_public, "device_public")?;
        Ok(())
    }

    /// The coordinator's answer to a verified request: `key` sealed for the device, with the
    /// coordinator's X25519 secret `coordinator_secret` (32 random bytes, used once).
    pub fn seal(
        &self,
        token: &EnrolToken,
        coordinator_secret: [u8; X25519_LEN],
        key: &DeviceKey,
    ) -> Result<EnrolResponse, EnrolError> {
        let device_public = hex_array::<X25519_LEN>(&self.device_public, "device_public")?;
        let secret = StaticSecret::from(coordinator_secret);
        let coordinator_public = hex(PublicKey::from(&secret).as_bytes());
        let shared = secret.diffie_hellman(&PublicKey::from(device_public));
        let cipher = self.wrapping_cipher(token, shared.as_bytes(), &coordinator_public);
        let payload = Payload {
            msg: key.as_bytes(),
            aad: self.client.as_bytes(),
        };
        // Encryption into a vector only fails for messages beyond ChaCha20's 256 GiB.
        let sealed = cipher
            .encrypt(&Nonce::default(), payload)
            .map_err(|_| EnrolError::Seal)?;
        Ok(EnrolResponse {
            federation: self.federation.clone(),
            client: self.client.clone(),
            coordinator_public,
            sealed_key: hex(&sealed),
            refused: None,
        })
    }

    /// The device's side: the key in `response`, opened with the device's X25519 secret.
    pub fn open(
        &self,
        response: &EnrolResponse,
        token: &EnrolToken,
        device_secret: [u8; X25519_LEN],
    ) -> Result<DeviceKey, EnrolError> {
        if response.federation != self.federation || response.client != self.client {
            let elsewhere = format!("{}/{}", response.federation, response.client);
            return Err(EnrolError::Elsewhere(elsewhere));
        }
        if let Some(reason) = &response.refused {
            return Err(EnrolError::Refused(reason.clone()));
        }
        let public: [u8; X25519_LEN] =
            hex_array(&response.coordinator_public, "coordinator_public")?;
        let sealed = crate::hex::decode(&response.sealed_key).ok_or(EnrolError::Seal)?;
        let shared = StaticSecret::from(device_secret).diffie_hellman(&PublicKey::from(public));
        let cipher = self.wrapping_cipher(token, shared.as_bytes(), &response.coordinator_public);
        let payload = Payload {
            msg: &sealed,
            aad: self.client.as_bytes(),
        };
        let key = cipher
            .decrypt(&Nonce::default(), payload)
            .map_err(|_| EnrolError::Seal)?;
        let key: [u8; KEY_LEN] = key.try_into().map_err(|_| EnrolError::Seal)?;
        Ok(DeviceKey::from_bytes(key))
    }

    /// ChaCha20-Poly1305 under HKDF-SHA256(salt = token, ikm = the shared X25519 secret,
    /// info = domain, federation, client, both public values). The key is used for one message,
    /// so the all-zero nonce is never repeated under it.
    fn wrapping_cipher(
        &self,
        token: &EnrolToken,
        shared: &[u8],
        coordinator_public: &str,
    ) -> ChaCha20Poly1305 {
        let mut info = WRAP_DOMAIN.to_vec();
        for field in [
            self.federation.as_str(),
            &self.client,
            &self.device_public,
            coordinator_public,
        ] {
            info.extend((field.len() as u32).to_le_bytes());
            info.extend(field.as_bytes());
        }
        let mut wrap = [0u8; 32];
        // 32 bytes are far below HKDF-SHA256's limit of 255 × 32.
        Hkdf::<Sha256>::new(Some(&token.0), shared)
            .expand(&info, &mut wrap)
            .expect("32 bytes of HKDF output");
        ChaCha20Poly1305::new(&wrap.into())
    }
}

impl EnrolResponse {
    /// A refusal of `request` with the reason.
    pub fn refusal(request: &EnrolRequest, reason: String) -> Self {
        Self {
            federation: request.federation.clone(),
            client: request.client.clone(),
            coordinator_public: String::new(),
            sealed_key: String::new(),
            refused: Some(reason),
        }
    }

    /// Reads a response from JSON.
    pub fn parse(payload: &[u8]) -> Result<Self, EnrolError> {
        serde_json::from_slice(payload).map_err(|e| EnrolError::Malformed(e.to_string()))
    }
}

fn hex(bytes: &[u8]) -> String {
    crate::hex::encode(bytes)
}

fn hex_array<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], EnrolError> {
    crate::hex::decode_array(text).ok_or(EnrolError::Hex(what, 2 * N))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(byte: u8) -> EnrolToken {
        EnrolToken::from_bytes([byte; TOKEN_LEN])
    }

    #[test]
    fn the_device_opens_the_key_the_coordinator_sealed() {
        let request = EnrolRequest::new("plant-7", "cam-09", &token(1), [2; 32]);
        let json = serde_json::to_vec(&request).unwrap();
        let received = EnrolRequest::parse(&json).unwrap();
        received.verify("plant-7", "cam-09", &token(1)).unwrap();
        let key = DeviceKey::from_bytes([9; 32]);
        let response = received.seal(&token(1), [3; 32], &key).unwrap();
        assert!(
            !response.sealed_key.contains(&key.to_hex()),
            "the key travels sealed"
        );
        let json = serde_json::to_vec(&response).unwrap();
        let response = EnrolResponse::parse(&json).unwrap();
        assert_eq!(request.open(&response, &token(1), [2; 32]).unwrap(), key);
        // Another device secret, another token or a flipped byte: nothing opens.
        assert_eq!(
            request.open(&response, &token(1), [4; 32]),
            Err(EnrolError::Seal)
        );
        assert_eq!(
            request.open(&response, &token(5), [2; 32]),
            Err(EnrolError::Seal)
        );
        let mut flipped = response.clone();
        let last = if flipped.sealed_key.ends_with('0') {
            "1"
        } else {
            "0"
        };
        flipped.sealed_key.pop();
        flipped.sealed_key.push_str(last);
        assert_eq!(
            request.open(&flipped, &token(1), [2; 32]),
            Err(EnrolError::Seal)
        );
    }

    #[test]
    fn a_request_verifies_only_with_its_token_federation_and_client() {
        let request = EnrolRequest::new("plant-7", "cam-09", &token(1), [2; 32]);
        assert_eq!(
            request.verify("plant-7", "cam-09", &token(2)),
            Err(EnrolError::Tag)
        );
        assert!(matches!(
            request.verify("plant-8", "cam-09", &token(1)),
            Err(EnrolError::Elsewhere(_))
        ));
        // A man in the middle swapping in its own public value breaks the tag.
        let mut swapped = request.clone();
        swapped.device_public =
            EnrolRequest::new("plant-7", "cam-09", &token(1), [7; 32]).device_public;
        assert_eq!(
            swapped.verify("plant-7", "cam-09", &token(1)),
            Err(EnrolError::Tag)
        );
        let refusal = EnrolResponse::refusal(&request, "no enrolment pending".into());
        assert!(matches!(
            request.open(&refusal, &token(1), [2; 32]),
            Err(EnrolError::Refused(_))
        ));
        assert!(EnrolRequest::parse(b"{}").is_err());
    }

    #[test]
    fn tokens_read_in_groups_and_refuse_bad_text() {
        let t = token(0xab);
        let grouped = format!("{}-{}\n", &t.to_hex()[..16], &t.to_hex()[16..]);
        assert_eq!(EnrolToken::from_hex(&grouped).unwrap(), t);
        assert!(EnrolToken::from_hex("abc").is_err());
        assert!(EnrolToken::from_hex(&"zz".repeat(16)).is_err());
        assert_eq!(format!("{t:?}"), "EnrolToken(..)");
    }
}
