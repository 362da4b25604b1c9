//! What the simulated network does to a message: latency, random loss, duplication and extra
//! delay (which reorders), and targeted rules that drop, duplicate or delay the next messages
//! on a topic. All draws come from the simulation's seeded generator.

use rand::Rng;
use rand::rngs::StdRng;

/// The network's behaviour for every message.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// Milliseconds from a publish to its delivery.
    pub latency_ms: u64,
    /// Probability that a delivery is lost.
    pub drop: f64,
    /// Probability that a delivery happens twice.
    pub duplicate: f64,
    /// Up to this many more milliseconds, drawn per delivery (messages overtake each other).
    pub jitter_ms: u64,
}

impl Default for Network {
    fn default() -> Self {
        Self {
            latency_ms: 1,
            drop: 0.0,
            duplicate: 0.0,
            jitter_ms: 0,
        }
    }
}

/// What a [`Rule`] does to a message it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The delivery is lost.
    Drop,
    /// The message is delivered twice.
    Duplicate,
    /// The delivery is this many milliseconds late.
    Delay(u64),
}

/// A targeted fault: the next `count` deliveries on a topic matching `filter` (an MQTT topic
/// filter) suffer `fault`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// MQTT topic filter.
    pub filter: String,
    /// What happens.
    pub fault: Fault,
    /// Deliveries left.
    pub count: usize,
}

/// The delays at which one publish is delivered to one subscriber (none: lost).
pub(crate) fn deliveries(
    network: &Network,
    rules: &mut Vec<Rule>,
    rng: &mut StdRng,
    topic: &str,
) -> Vec<u64> {
    let mut delay = network.latency_ms;
    if network.jitter_ms > 0 {
        delay += rng.random_range(0..=network.jitter_ms);
    }
    let mut copies = 1;
    if network.drop > 0.0 && rng.random_bool(network.drop.min(1.0)) {
        copies = 0;
    } else if network.duplicate > 0.0 && rng.random_bool(network.duplicate.min(1.0)) {
        copies = 2;
    }
    if let Some(rule) = rules
        .iter_mut()
        .find(|r| r.count > 0 && crate::broker::matches(&r.filter, topic))
    {
        rule.count -= 1;
        match rule.fault {
            Fault::Drop => copies = 0,
            Fault::Duplicate => copies = 2,
            Fault::Delay(ms) => delay += ms,
        }
    }
    rules.retain(|r| r.count > 0);
    (0..copies).map(|i| delay + i).collect()
}
