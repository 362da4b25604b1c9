//! What the driver sends the broker, in order, never dropped for want of room.
//!
//! The MQTT client queues requests for its event loop in a bounded channel. After a burst of
//! thousands of updates that channel is full of their acknowledgements, and a publish made
//! then (the next round's task, the release, the status) would fail; before this outbox the
//! driver logged it and went on, so a fleet of 1,000 devices could wait for a round-2 task that
//! was never sent. Requests that do not fit wait here, in order, and go out as the event loop
//! makes room (the driver retries every few milliseconds while any wait).
//!
//! What waits is bounded: a retained publish replaces a waiting publish on the same topic (in
//! its place in the queue: only the last retained value counts), so the queue holds at most
//! one publish per retained topic, the round's metrics and one acknowledgement per unacked
//! update of the broker's in-flight window.

use std::collections::VecDeque;
use std::time::Duration;

use rumqttc::{AsyncClient, ClientError, EventLoop, Publish, QoS};

/// One request for the event loop.
#[derive(Debug)]
enum Request {
    Publish {
        topic: String,
        retain: bool,
        payload: Vec<u8>,
    },
    Ack(Publish),
}

/// The driver's requests to the broker.
pub(super) struct Outbox {
    client: AsyncClient,
    waiting: VecDeque<Request>,
    /// Payload bytes handed to the client since [`Outbox::take_sent`].
    sent: usize,
}

impl Outbox {
    pub(super) fn new(client: AsyncClient) -> Self {
        Self {
            client,
            waiting: VecDeque::new(),
            sent: 0,
        }
    }

    /// The client, for what is not a publish or an acknowledgement (subscriptions).
    pub(super) fn client(&self) -> &AsyncClient {
        &self.client
    }

    /// Publishes at QoS 1 now, or after the requests waiting before it.
    pub(super) fn publish(
        &mut self,
        topic: impl Into<String>,
        retain: bool,
        payload: impl Into<Vec<u8>>,
    ) {
        let (topic, payload) = (topic.into(), payload.into());
        if retain {
            let same = self.waiting.iter_mut().find_map(|r| match r {
                Request::Publish {
                    topic: t,
                    retain: true,
                    payload,
                } if *t == topic => Some(payload),
                _ => None,
            });
            if let Some(waiting) = same {
                *waiting = payload;
                return;
            }
        }
        self.push(Request::Publish {
            topic,
            retain,
            payload,
        });
    }

    /// Acknowledges an update, after the requests waiting before it.
    pub(super) fn ack(&mut self, publish: Publish) {
        self.push(Request::Ack(publish));
    }

    /// Forgets waiting acknowledgements: the session they belonged to is gone and the broker
    /// sends those updates again. Publishes stay.
    pub(super) fn forget_acks(&mut self) {
        self.waiting.retain(|r| !matches!(r, Request::Ack(_)));
    }

    /// Payload bytes published since the last call.
    pub(super) fn take_sent(&mut self) -> usize {
        std::mem::take(&mut self.sent)
    }

    /// Whether requests wait.
    pub(super) fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    fn push(&mut self, request: Request) {
        self.waiting.push_back(request);
        self.flush();
    }

    /// Hands waiting requests to the client, in order, until its queue is full.
    pub(super) fn flush(&mut self) {
        while let Some(request) = self.waiting.front_mut() {
            let sent = match request {
                Request::Publish {
                    topic,
                    retain,
                    payload,
                } => {
                    let bytes = std::mem::take(payload);
                    let len = bytes.len();
                    match self
                        .client
                        .try_publish(topic.as_str(), QoS::AtLeastOnce, *retain, bytes)
                    {
                        Ok(()) => {
                            self.sent += len;
                            true
                        }
                        // The queue is full: the payload comes back with the request, not copied.
                        Err(ClientError::TryRequest(rumqttc::Request::Publish(back))) => {
                            *payload = back.payload.into();
                            false
                        }
                        Err(e) => {
                            // Not a full queue (the event loop is gone): nothing to retry.
                            tracing::error!(%topic, error = %e, "cannot publish");
                            true
                        }
                    }
                }
                Request::Ack(publish) => self.client.try_ack(publish).is_ok(),
            };
            if !sent {
                if self.waiting.len().is_power_of_two() {
                    tracing::debug!(
                        waiting = self.waiting.len(),
                        "requests wait for the MQTT client's queue"
                    );
                }
                return;
            }
            self.waiting.pop_front();
        }
    }

    /// Sends what waits and disconnects cleanly (no Last Will), giving up after `within`.
    pub(super) async fn close(mut self, eventloop: &mut EventLoop, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        while self.is_waiting() && tokio::time::Instant::now() < until {
            self.flush();
            let poll = tokio::time::timeout_at(until, eventloop.poll()).await;
            if !matches!(poll, Ok(Ok(_))) {
                break;
            }
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        fedge_mqtt::flush_and_disconnect(&self.client, eventloop, left).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::MqttOptions;

    fn waiting(outbox: &Outbox) -> Vec<(String, Vec<u8>)> {
        outbox
            .waiting
            .iter()
            .map(|r| match r {
                Request::Publish { topic, payload, .. } => (topic.clone(), payload.clone()),
                Request::Ack(p) => (format!("ack {}", p.topic), Vec::new()),
            })
            .collect()
    }

    #[test]
    fn what_does_not_fit_waits_in_order_and_a_retained_topic_keeps_its_last_value() {
        // A queue of two requests and no event loop taking them: the third request waits.
        let (client, mut eventloop) = AsyncClient::new(MqttOptions::new("t", "127.0.0.1", 1), 2);
        let mut outbox = Outbox::new(client);
        outbox.publish("task", true, b"round 1".to_vec());
        outbox.publish("metrics", false, b"m1".to_vec());
        assert!(!outbox.is_waiting());
        outbox.publish("task", true, b"round 2".to_vec());
        outbox.ack(Publish::new("update/a", QoS::AtLeastOnce, Vec::new()));
        outbox.publish("status", true, b"s1".to_vec());
        outbox.publish("metrics", false, b"m2".to_vec());
        outbox.publish("status", true, b"s2".to_vec());
        outbox.publish("task", true, b"round 3".to_vec());
        assert_eq!(
            waiting(&outbox),
            [
                ("task".to_string(), b"round 3".to_vec()),
                ("ack update/a".to_string(), Vec::new()),
                ("status".to_string(), b"s2".to_vec()),
                ("metrics".to_string(), b"m2".to_vec()),
            ]
        );
        // Acknowledgements of a lost session go; publishes stay.
        outbox.forget_acks();
        assert_eq!(waiting(&outbox).len(), 3);
        // Room in the client's queue: the event loop takes the two queued requests.
        eventloop.clean();
        assert_eq!(eventloop.pending.len(), 2);
        outbox.flush();
        // Two more fit; the one left kept its payload through the failed tries.
        assert_eq!(waiting(&outbox), [("metrics".to_string(), b"m2".to_vec())]);
    }
}
