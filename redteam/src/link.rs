//! One attacker connection: an MQTT client under its own client id whose event loop runs in
//! the background, a pace that bounds its packets per second, and counters of what it sent
//! and of how often the broker dropped or refused it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fedge_mqtt::BrokerConfig;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::watch;
use tokio::time::Instant;

/// Largest packet an attacker's connection sends or takes: well above every broker's limit,
/// so that it is the broker that refuses, not the attacker's own client.
pub const ATTACKER_MAX_PACKET: usize = 8 << 20;

/// What a link did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets handed to the client.
    pub sent: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Connections the broker accepted.
    pub connects: u64,
    /// Connections the broker closed after accepting them (an oversized packet, a takeover).
    pub drops: u64,
    /// Connection attempts that failed before the broker accepted them.
    pub refused: u64,
}

/// A token bucket: at most `rate` packets per second on average, bursts of up to one
/// second's worth.
#[derive(Debug, Clone)]
pub struct Pace {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Pace {
    /// A full bucket for `rate` packets per second (at least one per minute).
    pub fn new(rate: f64) -> Self {
        let rate = if rate.is_finite() {
            rate.max(1.0 / 60.0)
        } else {
            1e6
        };
        Self {
            rate,
            tokens: rate.max(1.0),
            last: Instant::now(),
        }
    }

    /// How long to wait before the next packet, taking its token when there is one.
    pub fn take(&mut self) -> Duration {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.rate.max(1.0));
        self.last = now;
        // The token is taken now; a negative balance is the wait until it would have been there.
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// Client options for an attacker: a clean session (a refused packet is not re-sent after
/// reconnecting), no Last Will and the large packet limit.
pub fn attacker_options(broker: &BrokerConfig, client_id: &str) -> MqttOptions {
    let mut options = broker.options(client_id, None);
    options.set_clean_session(true);
    options.set_max_packet_size(ATTACKER_MAX_PACKET, ATTACKER_MAX_PACKET);
    options
}

/// An attacker's connection.
pub struct Link {
    client: AsyncClient,
    stats: Arc<Mutex<LinkStats>>,
    pace: Pace,
    events: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Connects as `client_id` (in the background: publishing waits in the client's queue
    /// until the broker accepts), sending at most `rate` packets per second.
    pub fn connect(broker: &BrokerConfig, client_id: &str, rate: f64) -> Self {
        let options = attacker_options(broker, client_id);
        let (client, mut eventloop) = AsyncClient::new(options, fedge_mqtt::REQUEST_QUEUE);
        let stats = Arc::new(Mutex::new(LinkStats::default()));
        let counters = Arc::clone(&stats);
        let events = tokio::spawn(async move {
            let mut connected = false;
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connected = true;
                        count(&counters, |s| s.connects += 1);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        count(&counters, |s| {
                            if connected {
                                s.drops += 1
                            } else {
                                s.refused += 1
                            }
                        });
                        connected = false;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        Self {
            client,
            stats,
            pace: Pace::new(rate),
            events,
        }
    }

    /// Publishes at QoS 1 once the pace allows; false when `stop` turned true first or the
    /// client's queue stayed full for a second.
    pub async fn publish(
        &mut self,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let wait = self.pace.take();
        if !wait.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
        if *stop.borrow() {
            return false;
        }
        let bytes = payload.len() as u64;
        let queued = tokio::time::timeout(
            Duration::from_secs(1),
            self.client
                .publish(topic, QoS::AtLeastOnce, retain, payload),
        )
        .await;
        let ok = matches!(queued, Ok(Ok(())));
        if ok {
            count(&self.stats, |s| {
                s.sent += 1;
                s.bytes += bytes;
            });
        }
        ok
    }

    /// The counters so far.
    pub fn stats(&self) -> LinkStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Waits up to `timeout` until the broker accepted this link once.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stats().connects > 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Lets queued packets go out for `linger`, then disconnects; the counters are those
    /// from before the disconnection (which is no drop by the broker).
    pub async fn close(self, linger: Duration) -> LinkStats {
        tokio::time::sleep(linger).await;
        let stats = self.stats();
        let _ = self.client.try_disconnect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.events.abort();
        stats
    }
}

fn count(stats: &Mutex<LinkStats>, f: impl FnOnce(&mut LinkStats)) {
    if let Ok(mut s) = stats.lock() {
        f(&mut s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_lets_a_burst_through_then_spaces_packets() {
        let mut pace = Pace::new(10.0);
        for _ in 0..10 {
            assert_eq!(pace.take(), Duration::ZERO);
        }
        let first = pace.take();
        let second = pace.take();
        assert!(first > Duration::from_millis(50), "{first:?}");
        assert!(first <= Duration::from_millis(100), "{first:?}");
        assert!(second > first + Duration::from_millis(50), "{second:?}");
    }
}
