//! `fedge-edge enroll`: the device's side of enrolment (`fedge_wire::enrol`). It asks the
//! running coordinator for its key with the one-time token the operator gave, opens the sealed
//! answer and writes the key to the profile's `key_file`, private to its owner.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fedge_wire::Topics;
use fedge_wire::enrol::{EnrolRequest, EnrolResponse, EnrolToken, X25519_LEN};
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
    let topics = Topics::new(&config.federation)?;
    let mut secret = [0u8; X25519_LEN];
    // The thread generator is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut secret);
    let request = EnrolRequest::new(&config.federation, &config.client_id, token, secret);
    let id = format!("fedge-enrol-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    let response_topic = topics.enrol_response(&config.client_id);
    client.subscribe(response_topic.clone(), QoS::AtLeastOnce)?;
    let start = Instant::now();
    let mut response = None;
    while let Some(left) = timeout.checked_sub(start.elapsed()) {
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
                match EnrolResponse::parse(&p.payload) {
                    Ok(r) => {
                        response = Some(r);
                        break;
                    }
                    Err(e) => tracing::warn!(error = %e, "unreadable enrolment response ignored"),
                }
            }
            _ => {}
        }
    }
    let _ = client.disconnect();
    let Some(response) = response else {
        anyhow::bail!(
            "no answer from the coordinator in {}: is it running with [auth] keys_file, and \
             does the broker let {} publish on {}?",
            humantime::format_duration(timeout),
            config.client_id,
            topics.enrol_request(&config.client_id)
        );
    };
    let key = request.open(&response, token, secret)?;
    fedge_daemon::write_atomically(
        &key_file,
        format!("{}\n", key.to_hex()).as_bytes(),
        fedge_daemon::Visibility::Private,
    )?;
    Ok(key_file)
}
