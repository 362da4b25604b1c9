//! Which release each device serves: the coordinator's retained pointer on
//! `fedge/<f>/model/serving`, JSON, sealed with every device key when the federation has keys.
//!
//! ```json
//! {"federation": "plant-7", "seq": 1764115200000, "sha256": "<64 hex>", "round": 12,
//!  "stage": "canary", "canary": ["cam-03"], "previous": "<64 hex>"}
//! ```
//!
//! Releases travel on `model/current` (and candidates on `model/candidate`); a device keeps the
//! last few it received and serves the one the pointer names for it: during a `canary` stage
//! the devices listed in `canary` serve `sha256` and the others keep `previous`; at `all` every
//! device serves `sha256`. A rollback is a pointer like any other, naming an older release.
//! `seq` grows from one pointer to the next (the coordinator takes the time in milliseconds
//! when it is ahead of the last one), and a device takes only a pointer above the last it
//! took, so a captured pointer cannot move it back.

use serde::{Deserialize, Serialize};

use crate::{DeviceKey, Message};

/// Most devices a pointer may list as canaries (a pointer is one MQTT packet).
pub const MAX_CANARIES: usize = 4096;

/// How far a promoted release has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Only the listed canary devices serve the release; the others keep the previous one.
    Canary,
    /// Every device serves the release.
    All,
}

impl Stage {
    /// The name, as JSON and the status spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Canary => "canary",
            Self::All => "all",
        }
    }
}

/// The retained pointer on `model/serving`; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingPointer {
    /// The federation it is for.
    pub federation: String,
    /// Grows from one pointer to the next.
    pub seq: u64,
    /// SHA-256 (hex) of the release to serve ([`crate::ModelRelease::sha256`]).
    pub sha256: String,
    /// That release's round, for people reading the topic.
    pub round: u64,
    /// How far the release has gone.
    pub stage: Stage,
    /// During a canary stage: the devices that serve `sha256`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canary: Vec<String>,
    /// During a canary stage: what the other devices keep serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The operator pinned this release (`ctl rollback`): no release is promoted until
    /// `ctl promote`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

impl ServingPointer {
    /// The release (hex SHA-256) `client` is to serve.
    pub fn release_for(&self, client: &str) -> &str {
        match (&self.stage, &self.previous) {
            (Stage::Canary, Some(previous)) if !self.canary.iter().any(|c| c == client) => previous,
            _ => &self.sha256,
        }
    }

    /// The JSON payload (before sealing).
    pub fn to_payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a pointer serialises")
    }

    /// A pointer read from its JSON payload: `None` unless every digest is 64 hex digits, every
    /// canary a valid client id and the list within [`MAX_CANARIES`].
    pub fn from_payload(payload: &[u8]) -> Option<Self> {
        let pointer: Self = serde_json::from_slice(payload).ok()?;
        let digest = |d: &str| crate::hex::decode_array::<32>(d).is_some();
        let fits = digest(&pointer.sha256)
            && pointer.previous.as_deref().is_none_or(digest)
            && pointer.canary.len() <= MAX_CANARIES
            && pointer.canary.iter().all(|c| crate::valid_client_id(c));
        fits.then_some(pointer)
    }
}

/// The pointer in a `model/serving` payload: with a key, only one sealed for this device by the
/// coordinator (anyone on the broker could write a plain one); without, a plain one (or the
/// inside of a sealed one).
pub fn decode_serving(
    payload: &[u8],
    client_id: &str,
    key: Option<&DeviceKey>,
) -> Option<ServingPointer> {
    match (crate::decode(payload), key) {
        (Ok(Message::Sealed(sealed)), Some(key)) => {
            ServingPointer::from_payload(sealed.open(client_id, key).ok()?)
        }
        (Ok(Message::Sealed(sealed)), None) => ServingPointer::from_payload(&sealed.inner),
        (_, Some(_)) => None,
        (_, None) => ServingPointer::from_payload(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(stage: Stage) -> ServingPointer {
        ServingPointer {
            federation: "plant".into(),
            seq: 7,
            sha256: "ab".repeat(32),
            round: 3,
            stage,
            canary: vec!["cam-1".into()],
            previous: Some("cd".repeat(32)),
            pinned: false,
        }
    }

    #[test]
    fn canaries_serve_the_new_release_and_the_others_the_previous_one() {
        let canary = pointer(Stage::Canary);
        assert_eq!(canary.release_for("cam-1"), "ab".repeat(32));
        assert_eq!(canary.release_for("cam-2"), "cd".repeat(32));
        let all = pointer(Stage::All);
        assert_eq!(all.release_for("cam-2"), "ab".repeat(32));
    }

    #[test]
    fn a_device_with_a_key_believes_only_a_pointer_sealed_for_it() {
        let key = DeviceKey::from_bytes([3; crate::KEY_LEN]);
        let other = DeviceKey::from_bytes([4; crate::KEY_LEN]);
        let plain = pointer(Stage::All).to_payload();
        let sealed = crate::seal(plain.clone(), &[("cam-1", &key)]);
        assert_eq!(
            decode_serving(&sealed, "cam-1", Some(&key)),
            Some(pointer(Stage::All))
        );
        assert_eq!(decode_serving(&sealed, "cam-1", Some(&other)), None);
        assert_eq!(decode_serving(&plain, "cam-1", Some(&key)), None);
        assert_eq!(
            decode_serving(&plain, "cam-1", None),
            Some(pointer(Stage::All))
        );
        assert_eq!(
            decode_serving(&sealed, "cam-1", None),
            Some(pointer(Stage::All))
        );
    }

    #[test]
    fn a_pointer_sealed_for_a_thousand_fleet_devices_fits_one_default_packet() {
        let keys: Vec<(String, DeviceKey)> = (0..1000)
            .map(|i| {
                (
                    format!("fleet-{i:05}"),
                    DeviceKey::from_bytes([i as u8; crate::KEY_LEN]),
                )
            })
            .collect();
        let signers: Vec<(&str, &DeviceKey)> = keys.iter().map(|(c, k)| (c.as_str(), k)).collect();
        let plain = pointer(Stage::All).to_payload();
        let one = crate::seal(plain.clone(), &signers[..1]).len();
        let all = crate::seal(plain, &signers).len();
        let per_device = (all - one) as f64 / 999.0;
        eprintln!("sealed pointer: {all} bytes for 1000 devices, {per_device:.1} per device");
        assert!(all < crate::DEFAULT_MAX_PACKET, "{all}");
    }

    #[test]
    fn malformed_pointers_are_refused() {
        let mut bad = pointer(Stage::All);
        bad.sha256 = "xyz".into();
        assert_eq!(ServingPointer::from_payload(&bad.to_payload()), None);
        let mut bad = pointer(Stage::Canary);
        bad.canary = vec!["no/slash".into()];
        assert_eq!(ServingPointer::from_payload(&bad.to_payload()), None);
        assert_eq!(ServingPointer::from_payload(b"{\"seq\": 1}"), None);
        assert_eq!(ServingPointer::from_payload(b"\xff"), None);
    }
}
