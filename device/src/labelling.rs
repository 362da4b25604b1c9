//! Which served inputs a site asks a person to label (docs/algorithms.md §10).
//!
//! A site that serves a model sees many inputs and can afford labels for few. The queue keeps,
//! within a fixed number of places, two kinds of input:
//!
//! - the ones the model was least sure about, by the margin between its two most likely
//!   classes (margin sampling, Scheffer, Decomain and Wrobel, 2001): `uncertainty = 1 − (p₁ −
//!   p₂)`, 1 when the two best classes tie, 0 when one class takes all the probability. The
//!   `uncertain` places hold the most uncertain inputs seen so far; a newer, more uncertain one
//!   takes the place of the least uncertain one held.
//! - a uniform sample of everything served (reservoir sampling, Vitter's algorithm R), so that
//!   the labels are not only hard cases and a mistake the model makes confidently can surface.
//!
//! Every input is offered to the sample first, so the sample is uniform over everything served;
//! one the sample does not take, or later gives up for a newer one, is offered to the uncertain
//! places. So the uncertain places hold the most uncertain of all the inputs not in the sample.
//! Pure: it sees identifiers, scores and random draws, never images, files or clocks; the
//! device's on-disk queue (`fedge-edge`'s `labelling`) and the simulator's measurement of what
//! the labels are worth (`fedge bench labelling`) both run it.

use serde::{Deserialize, Serialize};

/// Default number of places.
pub const DEFAULT_CAPACITY: usize = 200;
/// Default share of the places given to the uniform sample.
pub const DEFAULT_RANDOM_SHARE: f32 = 0.2;

/// Why an input is in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pick {
    /// Among the most uncertain inputs seen.
    Uncertain,
    /// Drawn uniformly from everything served.
    Random,
}

impl Pick {
    /// The spelling in JSON and on the labelling page.
    pub fn name(self) -> &'static str {
        match self {
            Pick::Uncertain => "uncertain",
            Pick::Random => "random",
        }
    }
}

/// `1 − (p₁ − p₂)` of a probability vector: how close the model came to another answer.
/// One class alone has no rival: its uncertainty is 0.
pub fn uncertainty(probabilities: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &p in probabilities {
        if p > first {
            second = first;
            first = p;
        } else if p > second {
            second = p;
        }
    }
    if !first.is_finite() || !second.is_finite() {
        return 0.0;
    }
    (1.0 - (first - second)).clamp(0.0, 1.0)
}

/// What one offered input did to the queue.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Offered {
    /// Where it went, if it was kept.
    pub kept: Option<Pick>,
    /// The inputs it put out of the queue (to delete).
    pub evicted: Vec<u64>,
    /// Inputs it moved from the sample to the uncertain places (still held, now as
    /// [`Pick::Uncertain`]).
    pub moved: Vec<u64>,
}

/// One input held.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub id: u64,
    pub uncertainty: f32,
    pub pick: Pick,
}

/// The queue's choice of inputs, bounded to `capacity` places.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    uncertain_places: usize,
    random_places: usize,
    uncertain: Vec<Held>,
    random: Vec<Held>,
    /// Inputs offered to the uniform sample so far (algorithm R's `n`).
    offered: u64,
}

impl Selector {
    /// `capacity` places (at least 1), `random_share` of them (rounded, within 0 and 1) for the
    /// uniform sample.
    pub fn new(capacity: usize, random_share: f32) -> Self {
        let capacity = capacity.max(1);
        let share = if random_share.is_finite() {
            random_share.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let random_places = ((capacity as f32 * share).round() as usize).min(capacity);
        Self {
            uncertain_places: capacity - random_places,
            random_places,
            uncertain: Vec::new(),
            random: Vec::new(),
            offered: 0,
        }
    }

    /// Starts again from what a queue held (after a restart), and how many inputs its sample
    /// had been offered; entries beyond the places are left out.
    pub fn restore(mut self, held: impl IntoIterator<Item = Held>, offered: u64) -> Self {
        for h in held {
            match h.pick {
                Pick::Uncertain if self.uncertain.len() < self.uncertain_places => {
                    self.uncertain.push(h)
                }
                Pick::Random if self.random.len() < self.random_places => self.random.push(h),
                _ => {}
            }
        }
        self.offered = offered.max(self.random.len() as u64);
        self
    }

    /// Offers input `id` with its `uncertainty`; `draw` is a uniform number in `[0, 1)` (the
    /// caller's random source, so that the simulator is seeded).
    pub fn offer(&mut self, id: u64, uncertainty: f32, draw: f64) -> Offered {
        let uncertainty = if uncertainty.is_finite() {
            uncertainty
        } else {
            0.0
        };
        let held = |pick| Held {
            id,
            uncertainty,
            pick,
        };
        let mut out = Offered::default();
        // The sample first, so that it is uniform over everything served.
        if self.random_places > 0 {
            self.offered += 1;
            if self.random.len() < self.random_places {
                self.random.push(held(Pick::Random));
                out.kept = Some(Pick::Random);
                return out;
            }
            // Algorithm R: the n-th input replaces a uniformly chosen place with probability
            // k/n. The input it displaces competes for the uncertain places.
            let slot = (draw.clamp(0.0, 1.0 - f64::EPSILON) * self.offered as f64) as u64;
            if let Some(place) = self.random.get_mut(slot as usize) {
                let displaced = std::mem::replace(place, held(Pick::Random));
                out.kept = Some(Pick::Random);
                let moved = Held {
                    pick: Pick::Uncertain,
                    ..displaced
                };
                match self.offer_uncertain(moved) {
                    Some(dropped) if dropped == displaced.id => out.evicted.push(dropped),
                    Some(dropped) => {
                        out.evicted.push(dropped);
                        out.moved.push(displaced.id);
                    }
                    None => out.moved.push(displaced.id),
                }
                return out;
            }
        }
        match self.offer_uncertain(held(Pick::Uncertain)) {
            Some(dropped) if dropped == id => {}
            Some(dropped) => {
                out.evicted.push(dropped);
                out.kept = Some(Pick::Uncertain);
            }
            None => out.kept = Some(Pick::Uncertain),
        }
        out
    }

    /// Puts `held` in the uncertain places if it is more uncertain than the least uncertain one
    /// there (or a place is free); returns the id that is no longer held, if any (`held`'s own
    /// when it was not taken).
    fn offer_uncertain(&mut self, held: Held) -> Option<u64> {
        if self.uncertain.len() < self.uncertain_places {
            self.uncertain.push(held);
            return None;
        }
        let least = (self.uncertain.iter().enumerate())
            .map(|(i, h)| (h.uncertainty, i))
            .fold(None, |a: Option<(f32, usize)>, b| match a {
                Some(a) if a.0 <= b.0 => Some(a),
                _ => Some(b),
            });
        match least {
            Some((u, at)) if held.uncertainty > u => {
                Some(std::mem::replace(&mut self.uncertain[at], held).id)
            }
            _ => Some(held.id),
        }
    }

    /// Holds `held` again, even over the places (an undone label: the person asked for it
    /// back); the next removal brings the queue within its places again.
    pub fn put_back(&mut self, held: Held) {
        self.remove(held.id);
        match held.pick {
            Pick::Uncertain => self.uncertain.push(held),
            Pick::Random => self.random.push(held),
        }
    }

    /// Takes `id` out (labelled, skipped or lost); whether it was held.
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.uncertain.len() + self.random.len();
        self.uncertain.retain(|h| h.id != id);
        self.random.retain(|h| h.id != id);
        before != self.uncertain.len() + self.random.len()
    }

    /// Everything held, most uncertain first (the order a person is asked in).
    pub fn held(&self) -> Vec<Held> {
        let mut all: Vec<Held> = self.uncertain.iter().chain(&self.random).copied().collect();
        all.sort_by(|a, b| {
            b.uncertainty
                .total_cmp(&a.uncertainty)
                .then(a.id.cmp(&b.id))
        });
        all
    }

    /// How many inputs are held.
    pub fn len(&self) -> usize {
        self.uncertain.len() + self.random.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many inputs the uniform sample has been offered (kept across restarts).
    pub fn offered(&self) -> u64 {
        self.offered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn uncertainty_is_one_minus_the_margin() {
        assert_eq!(uncertainty(&[0.5, 0.5]), 1.0);
        assert!((uncertainty(&[0.7, 0.2, 0.1]) - 0.5).abs() < 1e-6);
        assert!((uncertainty(&[0.1, 0.2, 0.7]) - 0.5).abs() < 1e-6);
        assert_eq!(uncertainty(&[1.0, 0.0]), 0.0);
        assert_eq!(uncertainty(&[1.0]), 0.0);
        assert_eq!(uncertainty(&[]), 0.0);
    }

    /// The uncertain places end up holding exactly the most uncertain inputs of those the
    /// sample did not take, whatever their order; the sample holds its share.
    #[test]
    fn the_uncertain_places_keep_the_most_uncertain_inputs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let scores: Vec<f32> = (0..5_000).map(|_| rng.random::<f32>()).collect();
        let mut selector = Selector::new(50, 0.2);
        let mut live = std::collections::BTreeSet::new();
        for (id, &u) in scores.iter().enumerate() {
            let offered = selector.offer(id as u64, u, rng.random());
            if offered.kept.is_some() {
                live.insert(id as u64);
            }
            for gone in offered.evicted {
                assert!(live.remove(&gone), "evicted {gone}, which was not held");
            }
        }
        let held = selector.held();
        assert_eq!(held.len(), 50);
        assert_eq!(live, held.iter().map(|h| h.id).collect());
        let sampled: std::collections::BTreeSet<u64> = (held.iter())
            .filter(|h| h.pick == Pick::Random)
            .map(|h| h.id)
            .collect();
        let mut rest: Vec<f32> = (scores.iter().enumerate())
            .filter(|(id, _)| !sampled.contains(&(*id as u64)))
            .map(|(_, u)| *u)
            .collect();
        rest.sort_by(|a, b| b.total_cmp(a));
        let uncertain: Vec<f32> = (held.iter())
            .filter(|h| h.pick == Pick::Uncertain)
            .map(|h| h.uncertainty)
            .collect();
        assert_eq!(uncertain.len(), 40);
        assert!(uncertain.iter().all(|u| *u >= rest[39]));
        assert_eq!(held.iter().filter(|h| h.pick == Pick::Random).count(), 10);
    }

    /// Algorithm R keeps every input with the same probability: over many streams, the early,
    /// middle and late thirds of a stream are held about equally often.
    #[test]
    fn the_sample_is_uniform_over_the_stream() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut thirds = [0u32; 3];
        for _ in 0..400 {
            let mut selector = Selector::new(10, 1.0);
            for id in 0..300u64 {
                selector.offer(id, 0.0, rng.random());
            }
            for h in selector.held() {
                thirds[(h.id / 100) as usize] += 1;
            }
        }
        let total: u32 = thirds.iter().sum();
        assert_eq!(total, 4_000);
        for n in thirds {
            let share = n as f64 / total as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.04, "{thirds:?}");
        }
    }

    #[test]
    fn removing_frees_a_place_and_restore_keeps_the_bounds() {
        let mut selector = Selector::new(4, 0.5);
        // Two fill the sample; a late draw keeps the next two out of it.
        for id in 0..4 {
            selector.offer(id, 0.9, 0.99);
        }
        assert_eq!(selector.len(), 4);
        assert!(selector.remove(0));
        assert!(!selector.remove(0));
        assert_eq!(selector.offer(9, 0.1, 0.0).kept, Some(Pick::Random));
        let again = Selector::new(2, 0.5).restore(selector.held(), 7);
        assert_eq!(again.len(), 2);
        assert_eq!(again.offered(), 7);
    }
}
