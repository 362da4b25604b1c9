//! Enrolment on a running coordinator: a device's request for its key on
//! `fedge/<f>/edge/<client>/enrol/request`, answered with the key sealed for it
//! (`fedge_wire::enrol`), once per token.
//!
//! The answer's order keeps a token from being spent twice or a key from being lost: under the
//! keys file's lock the key goes into the keys file first, then the token is marked spent by
//! this request, then the machine takes the new keys and the answer is published. The same
//! request again (its answer lost) gets the same key sealed again. A refused request is counted as `bad_enrolment` and
//! answered with the reason (a hint: the device trusts only a key that opens).

use std::path::Path;

use fedge_wire::enrol::{EnrolRequest, EnrolResponse, EnrolToken};
use rand::RngCore;

use super::outbox::Outbox;
use crate::round::Rounds;
use crate::store::audit::{AuditLog, Event};
use crate::store::enrolments::{self, Refusal};

/// Largest request read (a real one is about 250 bytes).
const MAX_REQUEST_BYTES: usize = 2048;

/// Answers the request of `client` in `payload`; `keys_file` is the coordinator's.
pub(super) fn handle_request(
    rounds: &mut Rounds,
    outbox: &mut Outbox,
    audit: Option<&mut AuditLog>,
    federation: &str,
    keys_file: &Path,
    client: &str,
    payload: &[u8],
) {
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if payload.len() > MAX_REQUEST_BYTES {
        let detail = format!("request of {} bytes", payload.len());
        rounds.reject_enrolment(client, detail);
        return;
    }
    let request = match EnrolRequest::parse(payload) {
        Ok(request) => request,
        Err(e) => return rounds.reject_enrolment(client, e.to_string()),
    };
    let response = match answer(&request, federation, keys_file, client, wall_ms) {
        Ok((response, devices)) => {
            tracing::info!(client, "device enrolled");
            if let Some(audit) = audit {
                let how = "token".to_owned();
                let event = Event::Enrolled {
                    client: client.to_owned(),
                    how,
                };
                audit.record(&crate::store::audit::device(client), event);
            }
            rounds.set_device_keys(devices);
            response
        }
        // Logged by the machine's rejection log, which rate-limits a flood of requests.
        Err(reason) => {
            rounds.reject_enrolment(client, reason.clone());
            EnrolResponse::refusal(&request, reason)
        }
    };
    // A response always serialises (strings only).
    let json = serde_json::to_vec(&response).unwrap_or_default();
    let topic = fedge_wire::Topics::new(federation)
        .map(|t| t.enrol_response(client))
        .unwrap_or_default();
    outbox.publish(topic, false, json);
}

/// The sealed key and the keys now in force, or why not (in words for the device: a storage
/// failure is logged in full here and answered without the file's path).
fn answer(
    request: &EnrolRequest,
    federation: &str,
    keys_file: &Path,
    client: &str,
    wall_ms: u64,
) -> Result<(EnrolResponse, crate::round::DeviceKeys), String> {
    let seal = |token: &EnrolToken, key: &fedge_wire::DeviceKey| {
        request
            .verify(federation, client, token)
            .map_err(|e| e.to_string())?;
        let mut secret = [0u8; fedge_wire::enrol::X25519_LEN];
        // The thread generator is a CSPRNG seeded from the operating system.
        rand::rng().fill_bytes(&mut secret);
        request.seal(token, secret, key).map_err(|e| e.to_string())
    };
    let public = &request.device_public;
    enrolments::redeem(keys_file, client, public, wall_ms, seal).map_err(|e| match e {
        Refusal::Storage(e) => {
            tracing::error!(client, error = %e, "enrolment records unusable");
            "the coordinator cannot read or write its enrolment records; ask its operator".into()
        }
        other => other.to_string(),
    })
}
