//! The demo's hostile participant: the attacks of [`crate::attack`] run next to the
//! federation, in the same process, against the same broker. The coordinator's rejection
//! events are collected here with the attack's clock and traced to the attacks at the end.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_mqtt::BrokerConfig;
use tokio::sync::watch;

use crate::attack::{self, AttackConfig, AttackKind, KindReport, Outcome, SeenRejection};

/// Prefix of the hostile participant's client ids.
pub const PREFIX: &str = "mallory";

/// A hostile participant running until the demo's stop.
pub struct Hostile {
    task: tokio::task::JoinHandle<anyhow::Result<Outcome>>,
    origin: Instant,
    rejections: Vec<SeenRejection>,
}

/// What the hostile participant achieved: per attack, what it sent and what was refused, and
/// the coordinator's rejections no attack could be traced to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostileReport {
    /// Per attack.
    pub attacks: BTreeMap<AttackKind, KindReport>,
    /// Rejections by reason traced to no attack.
    pub untraced: BTreeMap<String, u64>,
}

impl Hostile {
    /// Starts `kinds` against `federation` on `broker`, `rate` packets per second per attack,
    /// acting from the first round task on, every round (and every second within one); the
    /// attacks that play a device (in rounds, as an evaluation-only site, serving releases:
    /// [`AttackKind::takes_part`]) sign with `insider_key` when given.
    pub fn start(
        broker: &BrokerConfig,
        federation: &str,
        kinds: &[AttackKind],
        rate: f64,
        seed: u64,
        insider_key: Option<fedge_wire::DeviceKey>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let origin = Instant::now();
        let config = AttackConfig {
            prefix: PREFIX.into(),
            rate,
            insider_key,
            max_packet: broker.max_packet,
            seed,
            wait_for_task: true,
            duration: None,
            grace: Duration::ZERO,
            origin,
            ..AttackConfig::new(broker.clone(), federation, kinds.to_vec())
        };
        Self {
            task: tokio::spawn(attack::run(config, stop)),
            origin,
            rejections: Vec::new(),
        }
    }

    /// The coordinator rejected a packet on `client`'s topic for `reason`.
    pub fn rejected(&mut self, client: &str, reason: &str) {
        self.rejections.push(SeenRejection {
            ms: self.origin.elapsed().as_millis() as u64,
            client: client.to_owned(),
            reason: reason.to_owned(),
        });
    }

    /// Waits for the attacks to end (after the demo's stop) and traces the rejections.
    pub async fn finish(self) -> anyhow::Result<HostileReport> {
        let outcome = self
            .task
            .await
            .context("the hostile participant panicked")??;
        let report = outcome.retrace(&self.rejections);
        Ok(HostileReport {
            attacks: report.kinds,
            untraced: report.federation_answer.unattributed,
        })
    }
}
