//! The devices training a task in buffered mode: which version each was given and since when.
//! A device is in flight from the task that names it until its update is accepted or refused,
//! it declines, or its version falls out of `max_staleness`; while in flight it is not given
//! another task. Slots are counted over the devices online and within `round_timeout_s`, so a
//! device that vanished or stalls does not hold one.

use std::collections::{BTreeMap, BTreeSet};

/// One device in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    round: u64,
    since_ms: u64,
}

/// The devices in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    entries: BTreeMap<String, Entry>,
}

impl InFlight {
    /// The round (version) `client` was given, if it is in flight.
    pub fn round_of(&self, client: &str) -> Option<u64> {
        self.entries.get(client).map(|e| e.round)
    }

    /// Whether `client` is in flight.
    pub fn contains(&self, client: &str) -> bool {
        self.entries.contains_key(client)
    }

    /// Devices in flight, online or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no device is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `client` was given `round` at `now_ms`.
    pub fn start(&mut self, client: &str, round: u64, now_ms: u64) {
        let entry = Entry {
            round,
            since_ms: now_ms,
        };
        self.entries.insert(client.to_owned(), entry);
    }

    /// `client` answered (or declined, or was refused): no longer in flight. Its round, if it was.
    pub fn finish(&mut self, client: &str) -> Option<u64> {
        self.entries.remove(client).map(|e| e.round)
    }

    /// Drops the devices given a round before `oldest` (their updates would be refused as
    /// stale); returns them.
    pub fn drop_before(&mut self, oldest: u64) -> Vec<String> {
        let gone: Vec<String> = (self.entries.iter())
            .filter(|(_, e)| e.round < oldest)
            .map(|(c, _)| c.clone())
            .collect();
        for client in &gone {
            self.entries.remove(client);
        }
        gone
    }

    /// The devices holding a slot at `now_ms`: online and in flight for less than `timeout_ms`.
    pub fn busy(&self, online: &BTreeSet<String>, now_ms: u64, timeout_ms: u64) -> usize {
        (self.entries.iter())
            .filter(|(c, e)| online.contains(*c) && now_ms < e.since_ms.saturating_add(timeout_ms))
            .count()
    }

    /// When the next slot frees by timeout, if any device online holds one.
    pub fn next_expiry(
        &self,
        online: &BTreeSet<String>,
        now_ms: u64,
        timeout_ms: u64,
    ) -> Option<u64> {
        (self.entries.iter())
            .filter(|(c, _)| online.contains(*c))
            .map(|(_, e)| e.since_ms.saturating_add(timeout_ms))
            .filter(|&t| t > now_ms)
            .min()
    }

    /// Up to `wanted` of `free` in a fixed order drawn from `seed` and `round`: the same
    /// devices whatever the arrival order of their statuses, and another order each version.
    pub fn pick<'a>(
        free: impl IntoIterator<Item = &'a String>,
        wanted: usize,
        seed: u64,
        round: u64,
    ) -> Vec<String> {
        let mut keyed: Vec<(u64, &String)> = (free.into_iter())
            .map(|c| (order_key(seed, round, c), c))
            .collect();
        keyed.sort();
        let mut picked: Vec<String> = keyed
            .into_iter()
            .take(wanted)
            .map(|(_, c)| c.clone())
            .collect();
        picked.sort();
        picked
    }

    /// The entries of rounds before `round`, for the checkpoint (the open round's are in its
    /// journal).
    pub fn saved(&self, round: u64) -> Vec<(String, u64)> {
        (self.entries.iter())
            .filter(|(_, e)| e.round < round)
            .map(|(c, e)| (c.clone(), e.round))
            .collect()
    }

    /// The entries of a checkpoint, in flight since `now_ms`.
    pub fn restored(saved: Vec<(String, u64)>, now_ms: u64) -> Self {
        let entries = (saved.into_iter())
            .map(|(c, round)| {
                (
                    c,
                    Entry {
                        round,
                        since_ms: now_ms,
                    },
                )
            })
            .collect();
        Self { entries }
    }
}

/// FNV-1a over the seed, the round and the client id.
fn order_key(seed: u64, round: u64, client: &str) -> u64 {
    let bytes = seed
        .to_le_bytes()
        .into_iter()
        .chain(round.to_le_bytes())
        .chain(client.bytes());
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_online_devices_within_the_timeout() {
        let mut f = InFlight::default();
        f.start("a", 1, 0);
        f.start("b", 1, 500);
        f.start("c", 2, 0);
        let online: BTreeSet<String> = ["a", "b"].map(String::from).into();
        assert_eq!(f.busy(&online, 900, 1000), 2);
        assert_eq!(f.busy(&online, 1000, 1000), 1, "a timed out");
        assert_eq!(f.next_expiry(&online, 1000, 1000), Some(1500));
        assert_eq!(f.drop_before(2), vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(f.saved(3), vec![("c".to_owned(), 2)]);
        assert_eq!(f.finish("c"), Some(2));
        assert!(f.is_empty());
    }

    #[test]
    fn picks_are_reproducible_and_change_with_the_round() {
        let free: Vec<String> = (0..50).map(|i| format!("d{i}")).collect();
        let one = InFlight::pick(&free, 5, 7, 1);
        assert_eq!(one, InFlight::pick(free.iter().rev(), 5, 7, 1));
        assert_ne!(one, InFlight::pick(&free, 5, 7, 2));
        assert_eq!(InFlight::pick(&free, 100, 7, 1).len(), 50);
    }
}
