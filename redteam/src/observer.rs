//! The attacker's eyes: one connection subscribed to every topic of the federation, feeding
//! what it hears into a [`ViewState`] that the attacks share through a [`View`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fedge_mqtt::BrokerConfig;
use fedge_wire::Topics;
use rumqttc::{AsyncClient, Event, Packet, QoS};
use tokio::sync::watch;

use super::link::attacker_options;
use super::view::ViewState;

/// A shared handle on what the observer saw.
#[derive(Clone)]
pub struct View {
    state: Arc<Mutex<ViewState>>,
    rounds: watch::Receiver<Option<u64>>,
    changes: watch::Receiver<u64>,
    origin: std::time::Instant,
}

impl View {
    /// Reads the state.
    pub fn read<R>(&self, f: impl FnOnce(&ViewState) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Changes the state (the attacks record what they touched).
    pub fn write<R>(&self, f: impl FnOnce(&mut ViewState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Milliseconds since the attack's origin.
    pub fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The newest task's round, changing as rounds open.
    pub fn rounds(&self) -> watch::Receiver<Option<u64>> {
        self.rounds.clone()
    }

    /// Waits until `done` holds, `timeout` passed or `stop` turned true; returns whether
    /// `done` held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        stop: &mut watch::Receiver<bool>,
        done: impl Fn(&ViewState) -> bool,
    ) -> bool {
        let mut changes = self.changes.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.read(&done) {
                return true;
            }
            if *stop.borrow() {
                return false;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return false },
                _ = tokio::time::sleep_until(deadline) => return self.read(&done),
                _ = stop.changed() => {}
            }
        }
    }
}

/// The observing connection.
pub struct Observer {
    view: View,
    client: AsyncClient,
    connected: watch::Receiver<bool>,
    events: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Connects as `client_id` and subscribes to all of `topics`' federation; ids starting
    /// with `prefix-` are the attacker's.
    pub fn start(
        broker: &BrokerConfig,
        client_id: &str,
        topics: &Topics,
        prefix: &str,
        origin: std::time::Instant,
    ) -> Self {
        let (client, mut eventloop) = AsyncClient::new(
            attacker_options(broker, client_id),
            fedge_mqtt::REQUEST_QUEUE,
        );
        let state = Arc::new(Mutex::new(ViewState::new(topics.clone(), prefix)));
        let (rounds_tx, rounds) = watch::channel(None);
        let (changes_tx, changes) = watch::channel(0u64);
        let (connected_tx, connected) = watch::channel(false);
        let filters = [
            topics.round_task(),
            format!("{}/+", topics.round_task()),
            topics.update_filter(),
            topics.edge_status_filter(),
            topics.metrics(),
            topics.coordinator_status(),
            topics.control(),
            topics.infer_response("+"),
            topics.model_current(),
            format!("{}/+", topics.model_current()),
            topics.model_candidate(),
            format!("{}/+", topics.model_candidate()),
            topics.model_serving(),
        ];
        let view = View {
            state: Arc::clone(&state),
            rounds,
            changes,
            origin,
        };
        let subscriber = client.clone();
        let events = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        for filter in &filters {
                            let _ = subscriber.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = connected_tx.send(true);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let now_ms = origin.elapsed().as_millis() as u64;
                        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                        if s.absorb(&p.topic, &p.payload, now_ms) {
                            let round = s.task.as_ref().map(|t| t.round);
                            let _ = rounds_tx.send(round);
                        }
                        drop(s);
                        changes_tx.send_modify(|n| *n += 1);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        Self {
            view,
            client,
            connected,
            events,
        }
    }

    /// The shared view.
    pub fn view(&self) -> View {
        self.view.clone()
    }

    /// Waits up to `timeout` until the broker accepted the subscriptions.
    pub async fn wait_subscribed(&self, timeout: Duration) -> bool {
        let mut connected = self.connected.clone();
        tokio::time::timeout(timeout, connected.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Publishes each `(topic, payload)` retained (an empty payload clears the topic), then
    /// disconnects.
    pub async fn clear_and_close(self, retained: &[(String, Vec<u8>)]) {
        for (topic, payload) in retained {
            let _ =
                self.client
                    .try_publish(topic.as_str(), QoS::AtLeastOnce, true, payload.clone());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = self.client.try_disconnect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.events.abort();
    }
}
