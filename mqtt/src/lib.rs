//! MQTT plumbing shared by `fedge-edge` and `fedge-coordinator`.
//!
//! It holds what both binaries need from rumqttc and must get right the same way: broker
//! settings, client options with a raised packet limit, reconnect back-off (rumqttc's
//! `poll()` reconnects immediately), and publishing a framed message in chunks no larger
//! than the broker's packet limit (rumqttc loops forever on an oversized QoS 1 publish).

use std::time::Duration;

mod broker;
mod credentials;
mod session;
mod tls;
pub use broker::{
    BROKER_MAX_PACKET, BrokerConfig, BrokerSettingsError, InvalidBroker, KEEP_ALIVE_RANGE,
    MAX_INCOMING_PACKET, MAX_PACKET_RANGE, PACKET_OVERHEAD, UrlError, describe_error,
};
pub use credentials::{Password, PasswordFileError, read_password_file};
pub use session::{Session, SessionEvent};
pub use tls::{TlsError, TlsMaterial, TlsSettings, install_crypto_provider};

use rumqttc::{AsyncClient, QoS};

/// Exponential reconnect back-off with jitter: the ceiling starts at 100 ms and doubles up to
/// 10 s, reset on success; each delay is drawn uniformly from the upper half of the ceiling
/// ("equal jitter"), so a fleet that lost its broker at the same moment does not reconnect in
/// lockstep.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The ceiling after `failures` failures, in milliseconds.
    fn ceiling_ms(failures: u32) -> u64 {
        let ms = 100u64.saturating_mul(1 << failures.min(8).saturating_sub(1));
        ms.min(10_000)
    }

    /// Delay before the next attempt, after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let ceiling = Self::ceiling_ms(self.failures);
        let ms = rand::Rng::random_range(&mut rand::rng(), ceiling / 2..=ceiling);
        Duration::from_millis(ms)
    }

    /// True before the first failure of a streak (to log that failure loudly, and not the
    /// retries after it).
    pub fn is_fresh(&self) -> bool {
        self.failures == 0
    }

    /// Forget past failures.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The client could not queue a publish.
#[derive(Debug, thiserror::Error)]
#[error("cannot publish on {topic}: {message}")]
pub struct PublishError {
    /// Topic.
    pub topic: String,
    /// rumqttc's message.
    pub message: String,
}

/// Queues `frame` on `topic` at QoS 1, split into chunks of at most `max_packet` bytes, each
/// tagged by `signer` (a device id and its key) when given. Returns the bytes queued. Never
/// blocks: the client's request queue must be large enough (see [`REQUEST_QUEUE`]).
pub fn publish_frame(
    client: &AsyncClient,
    topic: &str,
    frame: Vec<u8>,
    (message_id, max_packet): (u64, usize),
    retain: bool,
    signer: Option<(&str, &fedge_wire::DeviceKey)>,
) -> Result<u64, PublishError> {
    let mut bytes = 0;
    let pieces = fedge_wire::split_into_tagged_chunks(frame, message_id, max_packet, signer);
    for piece in pieces {
        bytes += piece.len() as u64;
        client
            .try_publish(topic, QoS::AtLeastOnce, retain, piece)
            .map_err(|e| PublishError {
                topic: topic.to_owned(),
                message: e.to_string(),
            })?;
    }
    Ok(bytes)
}

/// Capacity of the request queue between a client handle and its event loop.
pub const REQUEST_QUEUE: usize = 1024;

/// The current time in RFC 3339 (UTC, milliseconds), as dashboards expect.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Lets queued publishes reach the broker, then disconnects cleanly so that the broker does
/// not publish the Last Will; gives up after `within`.
///
/// The event loop is polled until it reports the closed connection: rumqttc announces the
/// outgoing DISCONNECT before it has flushed the packets queued ahead of it.
pub async fn flush_and_disconnect(
    client: &AsyncClient,
    eventloop: &mut rumqttc::EventLoop,
    within: Duration,
) {
    let until = tokio::time::Instant::now() + within;
    let _ = client.try_disconnect();
    while let Ok(Ok(_)) = tokio::time::timeout_at(until, eventloop.poll()).await {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps_and_resets_with_jitter_in_the_upper_half() {
        let mut b = Backoff::default();
        let ceilings = [
            100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000, 10_000,
        ];
        let mut spread = std::collections::BTreeSet::new();
        for _ in 0..20 {
            b.reset();
            for ceiling in ceilings {
                let d = b.next_delay().as_millis() as u64;
                assert!(
                    (ceiling / 2..=ceiling).contains(&d),
                    "{d} ms for ceiling {ceiling}"
                );
                if ceiling == 10_000 {
                    spread.insert(d);
                }
            }
        }
        assert!(spread.len() > 10, "delays are jittered: {spread:?}");
        b.reset();
        assert!(b.next_delay().as_millis() <= 100);
    }
}
