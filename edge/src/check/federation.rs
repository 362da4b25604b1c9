//! `fedge-edge check` against the running federation: the retained round task and released
//! model on the broker, read for a few seconds, tell the protocol version the coordinator speaks
//! and the backbone its model was trained on; both must be this device's.

use std::time::{Duration, Instant};

use fedge_wire::{DecodeError, PROTOCOL_VERSION, Reassembler, Topics};
use rumqttc::{Client, Event, Packet, QoS};

use crate::config::EdgeConfig;

/// How long the retained messages are waited for.
const LISTEN: Duration = Duration::from_secs(3);

/// What the broker holds for the federation.
#[derive(Debug, Default)]
struct Seen {
    /// Frames read.
    frames: usize,
    /// The protocol version of a frame this device cannot read.
    other_version: Option<u8>,
    /// The released model's round and backbone.
    release: Option<(u64, String)>,
}

/// The federation check: what matches (`Ok`) or what to fix (`Err`); `backbone` is this
/// device's backbone name (its card's).
pub fn check_federation(config: &EdgeConfig, backbone: &str) -> Result<String, String> {
    let seen = listen(config)?;
    if let Some(version) = seen.other_version {
        return Err(format!(
            "the federation speaks protocol {version}, this device speaks {PROTOCOL_VERSION}: \
             install the fedge-edge release that matches the coordinator"
        ));
    }
    match seen.release {
        Some((round, theirs)) if theirs != backbone => Err(format!(
            "the federation's model (round {round}) was trained on backbone {theirs:?}, this \
                 profile runs {backbone:?}: point `backbone` at the federation's card"
        )),
        Some((round, theirs)) => Ok(format!(
            "protocol {PROTOCOL_VERSION} and backbone {theirs:?}, as the federation's model of \
             round {round}"
        )),
        None if seen.frames > 0 => Ok(format!(
            "protocol {PROTOCOL_VERSION}, as the federation's round task (no model released yet)"
        )),
        None => Ok(
            "nothing retained on the broker yet (no round started): protocol and \
                    backbone not compared"
                .into(),
        ),
    }
}

fn listen(config: &EdgeConfig) -> Result<Seen, String> {
    let topics = Topics::new(&config.federation).map_err(|e| e.to_string())?;
    let key = config.load_key().map_err(|e| format!("{e:#}"))?;
    let id = format!("fedge-check-{}", config.client_id);
    let (client, mut connection) = Client::new(config.broker.options(&id, None), 16);
    for base in [topics.round_task(), topics.model_current()] {
        for filter in [base.clone(), format!("{base}/+")] {
            client
                .subscribe(filter, QoS::AtLeastOnce)
                .map_err(|e| e.to_string())?;
        }
    }
    let mut seen = Seen::default();
    let mut reassembler =
        Reassembler::new(LISTEN.as_millis() as u64, fedge_wire::MAX_MESSAGE_BYTES);
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
        seen.frames += 1;
        if let Err(DecodeError::UnsupportedVersion(v)) = fedge_wire::decode(&p.payload) {
            seen.other_version = Some(v);
        }
        if p.topic.starts_with(&model) {
            let now = start.elapsed().as_millis() as u64;
            let payload = &p.payload;
            let release = fedge_wire::decode_release(
                &mut reassembler,
                payload,
                now,
                &config.client_id,
                key.as_ref(),
            );
            if let Ok(Some(release)) = release {
                seen.release = Some((release.round, release.backbone));
            }
        }
    }
    let _ = client.disconnect();
    Ok(seen)
}
