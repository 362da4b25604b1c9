//! The simulator's broker: a topic table with retained messages, subscriptions with MQTT's
//! wildcards, and persistent sessions (what arrives for a node that is offline waits for it,
//! at least once, as a QoS 1 session kept by `clean_session = false` does).

use std::collections::BTreeMap;
use std::sync::Arc;

/// Who is connected to the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeId {
    /// A coordinator (the global one is 0, site aggregators follow).
    Coordinator(usize),
    /// A device agent.
    Device(usize),
}

/// A message on a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The topic.
    pub topic: String,
    /// The payload (shared: a task goes to many devices).
    pub payload: Arc<[u8]>,
}

/// The topic table.
#[derive(Debug, Default)]
pub struct Broker {
    retained: BTreeMap<String, Arc<[u8]>>,
    subscriptions: BTreeMap<NodeId, Vec<String>>,
}

impl Broker {
    /// Keeps `payload` as `topic`'s retained message (an empty payload clears it).
    pub fn retain(&mut self, topic: &str, payload: &Arc<[u8]>) {
        if payload.is_empty() {
            self.retained.remove(topic);
        } else {
            self.retained.insert(topic.to_owned(), Arc::clone(payload));
        }
    }

    /// Adds `filter` to `node`'s subscriptions and returns the retained messages it matches,
    /// in topic order.
    pub fn subscribe(&mut self, node: NodeId, filter: &str) -> Vec<Message> {
        let filters = self.subscriptions.entry(node).or_default();
        if !filters.iter().any(|f| f == filter) {
            filters.push(filter.to_owned());
        }
        (self.retained.iter())
            .filter(|(topic, _)| matches(filter, topic))
            .map(|(topic, payload)| Message {
                topic: topic.clone(),
                payload: Arc::clone(payload),
            })
            .collect()
    }

    /// The nodes subscribed to `topic` (each once), in node order.
    pub fn subscribers(&self, topic: &str) -> Vec<NodeId> {
        (self.subscriptions.iter())
            .filter(|(_, filters)| filters.iter().any(|f| matches(f, topic)))
            .map(|(node, _)| *node)
            .collect()
    }

    /// The retained message of `topic`, if any.
    pub fn retained(&self, topic: &str) -> Option<&Arc<[u8]>> {
        self.retained.get(topic)
    }
}

/// Whether `topic` matches the MQTT topic filter `filter` (`+` one level, `#` the rest).
pub fn matches(filter: &str, topic: &str) -> bool {
    let mut levels = topic.split('/');
    for part in filter.split('/') {
        match (part, levels.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (part, Some(level)) if part == level => {}
            _ => return false,
        }
    }
    levels.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_mqtt_says() {
        assert!(matches(
            "fedge/f/edge/+/update",
            "fedge/f/edge/cam-1/update"
        ));
        assert!(!matches(
            "fedge/f/edge/+/update",
            "fedge/f/edge/cam-1/status"
        ));
        assert!(matches("fedge/f/round/task/+", "fedge/f/round/task/3"));
        assert!(!matches("fedge/f/round/task/+", "fedge/f/round/task"));
        assert!(matches("fedge/#", "fedge/f/round/task"));
        assert!(!matches("fedge/f", "fedge/f/round"));
    }

    #[test]
    fn a_subscription_gets_the_retained_messages_it_matches_and_an_empty_payload_clears() {
        let mut broker = Broker::default();
        let payload: Arc<[u8]> = Arc::from(&b"task"[..]);
        broker.retain("f/round/task", &payload);
        broker.retain("f/model/current", &payload);
        let got = broker.subscribe(NodeId::Device(0), "f/round/task");
        assert_eq!(got.len(), 1);
        assert_eq!(broker.subscribers("f/round/task"), [NodeId::Device(0)]);
        broker.retain("f/round/task", &Arc::from(&b""[..]));
        assert!(
            broker
                .subscribe(NodeId::Device(1), "f/round/task")
                .is_empty()
        );
    }
}
