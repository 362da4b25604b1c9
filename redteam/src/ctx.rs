//! What one attack works with: its connection, the shared view, its own client id, a seeded
//! generator, and the tallies that go into its report.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};

use fedge_mqtt::BrokerConfig;
use fedge_wire::Topics;
use rand::rngs::StdRng;
use tokio::sync::watch;

use super::kind::AttackKind;
use super::link::Link;
use super::observer::View;
use super::view::Touch;

/// How long after an attack's status went out a status of the coordinator is taken to show
/// what it made of it (the coordinator may have published one while the attack's was on its
/// way).
pub const SETTLE_MS: u64 = 500;

/// One step of an attack: attacks act at every beat, some only when a round opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Beats so far, from 0.
    pub index: u64,
    /// The newest task's round, if any was seen.
    pub round: Option<u64>,
    /// Whether that round opened since the previous beat.
    pub new_round: bool,
}

impl Beat {
    /// Whether a once-a-round attack acts now: at the first beat, when a round opened, and
    /// every fifth beat while no round was seen.
    pub fn per_round(&self) -> bool {
        self.index == 0 || self.new_round || (self.round.is_none() && self.index.is_multiple_of(5))
    }
}

/// An attack's working set.
pub struct Ctx {
    /// Which attack.
    pub kind: AttackKind,
    /// Its client id (topic level): `<prefix>-<kind>`.
    pub id: String,
    /// The federation's topics.
    pub topics: Topics,
    /// The other federation replays go into.
    pub replay_into: Topics,
    /// The broker (for attacks that open connections of their own).
    pub broker: BrokerConfig,
    /// The coordinator's MQTT client id.
    pub coordinator_id: String,
    /// Largest payload before the attacker chunks its own updates.
    pub max_packet: usize,
    /// The attack's connection.
    pub link: Link,
    /// The key of an insider device (one the coordinator knows), for attacks that take part.
    pub key: Option<fedge_wire::DeviceKey>,
    /// What the observer saw.
    pub view: View,
    /// Seeded randomness.
    pub rng: StdRng,
    /// Turns true when the attack must end.
    pub stop: watch::Receiver<bool>,
    /// The attacker's sequence number for its own updates.
    pub seq: u64,
    /// Rounds already answered or acted on.
    pub done_rounds: BTreeSet<u64>,
    /// What the attack observed it achieved or was refused, by name.
    pub effects: BTreeMap<String, u64>,
    /// Rejections the attack saw itself (the broker refusing a connection), by reason.
    pub refusals: BTreeMap<String, u64>,
    /// Retained topics it wrote under its own ids, cleared at the end.
    pub retained: BTreeSet<String>,
    /// Real devices whose retained status it overwrote, restored at the end.
    pub forged: BTreeSet<String>,
    /// Packets sent outside the link (connections of its own).
    pub extra_sent: u64,
    /// What the attack keeps between beats, of a type of its own ([`Ctx::memory`]).
    pub memory: Option<Box<dyn Any + Send>>,
}

impl Ctx {
    /// Whether the attack must end.
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Publishes on one of the attacker's own topics; false once stopped.
    pub async fn send(&mut self, topic: &str, payload: Vec<u8>, retain: bool) -> bool {
        if retain && !payload.is_empty() {
            self.retained.insert(topic.to_owned());
        }
        self.link
            .publish(topic, payload, retain, &mut self.stop)
            .await
    }

    /// Publishes under a real device's name (`victim`): the payload is remembered as the
    /// attacker's, and the touch recorded, so that the coordinator's rejections for `victim`
    /// (of the reasons this attack can cause) are traced here.
    pub async fn send_as(
        &mut self,
        victim: &str,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
    ) -> bool {
        let ms = self.view.now_ms();
        let kind = self.kind;
        self.view.write(|v| {
            v.mark_own(&payload);
            v.touches.push(Touch {
                ms,
                kind,
                client: victim.to_owned(),
            });
        });
        self.link
            .publish(topic, payload, retain, &mut self.stop)
            .await
    }

    /// What the attack keeps between beats (what it claimed, what it waits to judge): a `T`,
    /// made with `T::default()` at the first call.
    pub fn memory<T: Default + Send + 'static>(&mut self) -> &mut T {
        if !self.memory.as_ref().is_some_and(|m| m.is::<T>()) {
            self.memory = Some(Box::new(T::default()));
        }
        match self.memory.as_mut().and_then(|m| m.downcast_mut::<T>()) {
            Some(memory) => memory,
            None => unreachable!("the memory was just made a T"),
        }
    }

    /// Counts `n` of an effect.
    pub fn effect(&mut self, name: &str, n: u64) {
        *self.effects.entry(name.to_owned()).or_insert(0) += n;
    }

    /// Counts a refusal by reason.
    pub fn refused(&mut self, reason: &str) {
        *self.refusals.entry(reason.to_owned()).or_insert(0) += 1;
    }
}
