//! The demo's unseen site: an evaluation-only agent holds the held-out domain, scores every
//! released model, and reports its accuracy in its status, as a deployment's unseen site
//! does. The demo reads that status (with keys, only when its tag verifies; never a retained
//! one, which an earlier run may have left) and reports the site's figure as the round's
//! target accuracy.

use std::time::Duration;

use fedge_mqtt::BrokerConfig;
use fedge_wire::{DeviceKey, EdgeStatus, SiteEvaluation, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};
use tokio::sync::{mpsc, watch};

/// Reads an evaluation-only device's status until the demo stops.
pub struct SiteWatcher {
    scores: mpsc::UnboundedReceiver<SiteEvaluation>,
    latest: Option<SiteEvaluation>,
}

impl SiteWatcher {
    /// Subscribes to `client`'s status in `federation`; with `key`, believes only statuses
    /// signed with it.
    pub fn start(
        broker: &BrokerConfig,
        federation: &str,
        client: &str,
        key: Option<DeviceKey>,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let topics = Topics::new(federation)?;
        let topic = topics.edge_status(client);
        let id = format!("fedge-demo-watch-{:08x}", rand::random::<u32>());
        let (mqtt, mut events) = AsyncClient::new(broker.options(&id, None), 16);
        let (tx, scores) = mpsc::unbounded_channel();
        let (federation, client) = (federation.to_owned(), client.to_owned());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = events.poll() => match event {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            let _ = mqtt.try_subscribe(topic.clone(), QoS::AtLeastOnce);
                        }
                        // A retained status was written before this watcher subscribed: by
                        // the site of an earlier run on the same broker, or by anyone. Only
                        // what the site publishes from now on is this run's.
                        Ok(Event::Incoming(Packet::Publish(p))) if p.retain => {}
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            let Ok(status) = serde_json::from_slice::<EdgeStatus>(&p.payload) else {
                                continue;
                            };
                            let genuine = key
                                .as_ref()
                                .is_none_or(|k| status.verify(&federation, &client, k));
                            if let (true, Some(evaluation)) = (genuine, status.evaluation)
                                && tx.send(evaluation).is_err()
                            {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    },
                    _ = stop.changed() => break,
                }
            }
            let _ = mqtt.try_disconnect();
        });
        Ok(Self {
            scores,
            latest: None,
        })
    }

    /// The site's score of the release of `round` (or a later one), waiting up to `patience`.
    pub async fn score_of(&mut self, round: u64, patience: Duration) -> Option<SiteEvaluation> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(latest) = &self.latest
                && latest.model_round >= round
            {
                return Some(latest.clone());
            }
            match tokio::time::timeout_at(deadline, self.scores.recv()).await {
                Ok(Some(score)) => self.latest = Some(score),
                Ok(None) | Err(_) => return None,
            }
        }
    }
}
