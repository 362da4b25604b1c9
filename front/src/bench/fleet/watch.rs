//! What `fedge bench fleet` reads of the coordinator: each round's metrics (the `metrics`
//! topic) and its retained status (the open buffer, the rejections by reason), and the
//! accounting of every update the devices sent against them.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use fedge_mqtt::BrokerConfig;
use fedge_wire::Topics;
use rumqttc::{AsyncClient, Event, Packet, QoS};
use serde::Serialize;
use tokio::sync::mpsc;

/// One round (one model version in buffered mode) as the coordinator reported it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetRound {
    /// Round number.
    pub round: u64,
    /// Clients the coordinator selected.
    pub selected: u64,
    /// Updates it used.
    pub reported: u64,
    /// Updates it rejected while the round was open.
    pub rejected: u64,
    /// Those rejections by reason.
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Whether the round was aggregated (not abandoned).
    pub aggregated: bool,
    /// Seconds from task to aggregation, as the coordinator measured them.
    pub seconds: f64,
    /// Update bytes it received.
    pub bytes_up: u64,
    /// Buffered mode, when the metrics carry it: the updates used by how many versions behind
    /// they started (index `s`).
    pub staleness: Vec<u64>,
}

impl FleetRound {
    fn parse(v: &serde_json::Value) -> Self {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Self {
            round: n("round"),
            selected: n("clients_selected"),
            reported: n("clients_reported"),
            rejected: n("rejected"),
            rejected_by_reason: counts(&v["rejected_by_reason"]),
            aggregated: v["aggregated"].as_bool().unwrap_or(true),
            seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
            bytes_up: n("bytes_up"),
            staleness: histogram(&v["staleness"]),
        }
    }
}

fn counts(v: &serde_json::Value) -> BTreeMap<String, u64> {
    (v.as_object().into_iter().flatten())
        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
        .collect()
}

fn histogram(v: &serde_json::Value) -> Vec<u64> {
    (v.as_array().into_iter().flatten())
        .map(|n| n.as_u64().unwrap_or(0))
        .collect()
}

/// Rejection reasons of messages other than updates (statuses, operator commands,
/// enrolments): counted by the coordinator with the rest, left out of the accounting.
const NOT_UPDATES: [&str; 3] = ["bad_status_tag", "bad_control", "bad_enrolment"];

/// Every update the devices sent, and where the coordinator says it went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    /// Updates the devices published that the broker acknowledged.
    pub sent: u64,
    /// Updates published whose acknowledgement never came (a broken connection): they may
    /// have reached the coordinator or not.
    pub unconfirmed: u64,
    /// Used in an aggregated round: the `reported` of the rounds' metrics.
    pub applied: u64,
    /// Taken into a round that was abandoned (not aggregated).
    pub abandoned: u64,
    /// Rejected, by reason (the coordinator status's `rejected_updates`, or the rounds'
    /// metrics before a status came).
    pub rejected: BTreeMap<String, u64>,
    /// In the open round's buffer when the run stopped (the status's `clients_reported`).
    pub in_buffer: u64,
    /// `sent − (applied + abandoned + rejected + in_buffer)`: 0 when every update is
    /// accounted for (up to −`unconfirmed` when unconfirmed updates reached the coordinator).
    pub difference: i64,
    /// Whether a coordinator status was read.
    pub status_seen: bool,
}

impl Accounting {
    /// Updates rejected for any reason of an update.
    pub fn rejected_updates(&self) -> u64 {
        (self.rejected.iter())
            .filter(|(reason, _)| !NOT_UPDATES.contains(&reason.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Every update sent is applied, abandoned with its round, rejected or in the open buffer.
    pub fn balanced(&self) -> bool {
        self.status_seen && self.difference <= 0 && -self.difference <= self.unconfirmed as i64
    }
}

/// A connection reading the metrics and the coordinator's status. Its event loop runs in a
/// task of its own from the start, so that no round ends unseen while the devices connect.
pub struct Watcher {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<Event>,
    pump: tokio::task::JoinHandle<()>,
    metrics_topic: String,
    status_topic: String,
    /// The rounds reported so far.
    pub rounds: Vec<FleetRound>,
    /// The last coordinator status.
    pub status: Option<serde_json::Value>,
    bar: Option<indicatif::ProgressBar>,
}

impl Watcher {
    /// Subscribes to the metrics and the status and waits for the broker to confirm; with
    /// `rounds`, a progress bar up to them (drawn on a terminal only, hidden when stderr is
    /// not one, as in tests and CI logs).
    pub async fn start(
        broker: &BrokerConfig,
        topics: &Topics,
        rounds: Option<u64>,
    ) -> anyhow::Result<Self> {
        let (client, mut eventloop) = AsyncClient::new(broker.options("fleet-watcher", None), 64);
        let (metrics_topic, status_topic) = (topics.metrics(), topics.coordinator_status());
        for topic in [&metrics_topic, &status_topic] {
            client
                .subscribe(topic, QoS::AtLeastOnce)
                .await
                .context("cannot subscribe to the metrics and status topics")?;
        }
        let (tx, mut events) = mpsc::unbounded_channel();
        let pump = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(event) => {
                        if tx.send(event).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "watcher reconnecting");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let mut acks = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while acks < 2 {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(Event::Incoming(Packet::SubAck(_)))) => acks += 1,
                Ok(Some(_)) => {}
                _ => {
                    pump.abort();
                    anyhow::bail!(
                        "the broker did not confirm the metrics and status subscriptions"
                    );
                }
            }
        }
        let bar = rounds.map(|n| {
            indicatif::ProgressBar::new(n).with_style(
                indicatif::ProgressStyle::with_template("rounds {bar:30} {pos}/{len}, ETA {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            )
        });
        Ok(Self {
            client,
            events,
            pump,
            metrics_topic,
            status_topic,
            rounds: Vec::new(),
            status: None,
            bar,
        })
    }

    /// Reads until `done` holds (true) or `deadline` passes (false).
    pub async fn until(
        &mut self,
        deadline: tokio::time::Instant,
        mut done: impl FnMut(&Self) -> bool,
    ) -> bool {
        loop {
            if done(self) {
                return true;
            }
            let event = match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) | Ok(None) => return false,
                Ok(Some(event)) => event,
            };
            let Event::Incoming(Packet::Publish(p)) = event else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&p.payload) else {
                continue;
            };
            if p.topic == self.metrics_topic {
                self.rounds.push(FleetRound::parse(&v));
                if let Some(bar) = &self.bar {
                    bar.inc(1);
                }
            } else if p.topic == self.status_topic {
                self.status = Some(v);
            }
        }
    }

    /// Where the `sent` updates went (and `unconfirmed` may have), by what was read so far.
    pub fn accounting(&self, sent: u64, unconfirmed: u64) -> Accounting {
        let (applied, abandoned) =
            self.rounds
                .iter()
                .fold((0, 0), |(a, b), r| match r.aggregated {
                    true => (a + r.reported, b),
                    false => (a, b + r.reported),
                });
        let status = self.status.as_ref();
        let rejected = match status {
            Some(s) => counts(&s["rejected_updates"]),
            None => {
                let mut sum = BTreeMap::new();
                for (reason, n) in self.rounds.iter().flat_map(|r| &r.rejected_by_reason) {
                    *sum.entry(reason.clone()).or_default() += n;
                }
                sum
            }
        };
        let in_buffer = status.map_or(0, |s| s["clients_reported"].as_u64().unwrap_or(0));
        let mut accounting = Accounting {
            sent,
            unconfirmed,
            applied,
            abandoned,
            rejected,
            in_buffer,
            difference: 0,
            status_seen: status.is_some(),
        };
        let counted = applied + abandoned + accounting.rejected_updates() + in_buffer;
        accounting.difference = sent as i64 - counted as i64;
        accounting
    }

    /// The updates used by staleness: the rounds' metrics summed, or the status's `buffer`
    /// section when the metrics do not carry it; empty in synchronous mode.
    pub fn staleness(&self) -> Vec<u64> {
        let mut sum: Vec<u64> = Vec::new();
        for r in &self.rounds {
            if sum.len() < r.staleness.len() {
                sum.resize(r.staleness.len(), 0);
            }
            for (s, n) in r.staleness.iter().enumerate() {
                sum[s] += n;
            }
        }
        if sum.is_empty()
            && let Some(status) = &self.status
        {
            sum = histogram(&status["buffer"]["staleness"]);
        }
        sum
    }

    /// Whether the coordinator aggregates buffered (its status has a `buffer` section).
    pub fn buffered(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.get("buffer").is_some_and(|b| !b.is_null()))
    }

    /// Disconnects.
    pub async fn stop(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let _ = self.client.try_disconnect();
        // The DISCONNECT goes out if the event loop gets to it within a moment.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.pump.abort();
    }
}
