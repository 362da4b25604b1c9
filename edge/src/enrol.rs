//! `fedge-edge enroll`: the device's side of enrolment (`fedge_wire::enrol`). It asks the
//! running coordinator for its key with the one-time token the operator gave, opens the sealed
//! answer and writes the key to the profile's `key_file`, private to its owner.
//!
//! Only an answer that opens with the request's secret is taken: anyone who may publish on the
//! response topic can post junk or a refusal, so a refusal ends the wait only after a short
//! grace in which a real answer may still come. The request's secret is kept beside the key
//! file (`<key_file>.request`, private) until the key is written, so running the command again
//! after a lost answer sends the same request, and the coordinator seals the same key again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fedge_wire::Topics;
use fedge_wire::enrol::{EnrolError, EnrolRequest, EnrolResponse, EnrolToken, X25519_LEN};
use rand::RngCore;
use rumqttc::{Client, Event, Packet, QoS};

use crate::config::EdgeConfig;

/// Enrols the device of `config` with `token`, waiting up to `timeout` for the coordinator;
/// refuses to replace an existing key file unless `replace`. Returns the key file written.
pub fn enrol(
    config: &EdgeConfig,
    token: &EnrolToken,
    timeout: Duration,
    replace: bool,
) -> anyhow::Result<PathBuf> {
    let Some(key_file) = config.key_file.clone() else {
        anyhow::bail!("the profile has no key_file: set key_file to where the device's key goes");
    };
    if key_file.exists() && !replace {
        anyhow::bail!(
            "{} exists: this device has a key already (pass --replace to enrol again)",
            key_file.display()
        );
    }
    // Held until the key is written: an agent running with the old key would not take the
    // new one, and would fight this command for the device's client id on the broker.
    let _alone = match key_file.exists() {
        true => match fedge_daemon::hold_alone(&key_file)? {
            fedge_daemon::Hold::Held(lock) => Some(lock),
            fedge_daemon::Hold::Taken => anyhow::bail!(
                "the agent of {} is running with {}: stop it first (e.g. `systemctl stop \
                 fedge-edge`), enrol, then start it again; the token was not used",
                config.client_id,
                key_file.display()
            ),
        },
        false => None,
    };
    let topics = Topics::new(&config.federation)?;
    let request_file = request_file(&key_file);
    let secret = request_secret(&request_file, token)?;
    let request = EnrolRequest::new(&config.federation, &config.client_id, token, secret);
    let id = format!("fedge-enrol-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    let response_topic = topics.enrol_response(&config.client_id);
    client.subscribe(response_topic.clone(), QoS::AtLeastOnce)?;
    let start = Instant::now();
    let mut key = None;
    let mut refused: Option<(String, Instant)> = None;
    while let Some(mut left) = timeout.checked_sub(start.elapsed()) {
        if let Some((_, at)) = &refused {
            match REFUSAL_GRACE.checked_sub(at.elapsed()) {
                Some(grace) => left = left.min(grace),
                None => break,
            }
        }
        let event = match connection.recv_timeout(left) {
            Ok(Ok(event)) => event,
            Ok(Err(e)) => anyhow::bail!("the broker: {}", fedge_mqtt::describe_error(&e)),
            Err(_) => break,
        };
        match event {
            // Asked only once the answer's subscription holds, so the answer cannot be missed.
            Event::Incoming(Packet::SubAck(_)) => client.publish(
                topics.enrol_request(&config.client_id),
                QoS::AtLeastOnce,
                false,
                serde_json::to_vec(&request)?,
            )?,
            Event::Incoming(Packet::Publish(p)) if p.topic == response_topic => {
                let opened =
                    EnrolResponse::parse(&p.payload).and_then(|r| request.open(&r, token, secret));
                match opened {
                    Ok(k) => {
                        key = Some(k);
                        break;
                    }
                    Err(EnrolError::Refused(reason)) => {
                        refused.get_or_insert((reason, Instant::now()));
                    }
                    Err(e) => tracing::warn!(error = %e, "an answer that does not open ignored"),
                }
            }
            _ => {}
        }
    }
    let _ = client.disconnect();
    let Some(key) = key else {
        if let Some((reason, _)) = refused {
            anyhow::bail!("the coordinator refused: {reason}");
        }
        anyhow::bail!(
            "no answer from the coordinator in {}: is it running with [auth] keys_file, and \
             does the broker let {} publish on {}? (running this again sends the same request)",
            humantime::format_duration(timeout),
            config.client_id,
            topics.enrol_request(&config.client_id)
        );
    };
    fedge_daemon::write_atomically(
        &key_file,
        format!("{}\n", key.to_hex()).as_bytes(),
        fedge_daemon::Visibility::Private,
    )?;
    let _ = std::fs::remove_file(&request_file);
    Ok(key_file)
}

/// How long a refusal waits for a real answer before it is taken as the coordinator's.
const REFUSAL_GRACE: Duration = Duration::from_secs(2);

/// Where the secret of a request not answered yet is kept.
fn request_file(key_file: &Path) -> PathBuf {
    let mut name = key_file.as_os_str().to_owned();
    name.push(".request");
    PathBuf::from(name)
}

/// The secret of the request for `token`: the one kept from an earlier attempt with the same
/// token, else a fresh one, kept (private) before it is used.
fn request_secret(path: &Path, token: &EnrolToken) -> anyhow::Result<[u8; X25519_LEN]> {
    if let Ok(text) = fedge_daemon::read_secret(path)
        && let Some((kept_token, hex)) = text.trim().split_once(' ')
        && kept_token == token.to_hex()
        && let Some(secret) = fedge_wire::hex::decode_array::<X25519_LEN>(hex)
    {
        return Ok(secret);
    }
    let mut secret = [0u8; X25519_LEN];
    // The thread generator is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut secret);
    let line = format!("{} {}\n", token.to_hex(), fedge_wire::hex::encode(&secret));
    fedge_daemon::write_atomically(path, line.as_bytes(), fedge_daemon::Visibility::Private)?;
    Ok(secret)
}
