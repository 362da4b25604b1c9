//! The round's accepted updates, held compactly, with their dot products streamed in.
//!
//! Deltas are copied into one contiguous arena as they are accepted ([`arena`]): `N·M·2` bytes
//! for `N` updates of `M` parameters sent in f16 (kept in f16, widened exactly where they are
//! read), `N·M·4` for f32 and int8 (plus `N²·8` bytes of dot products), reserved once for the
//! selected clients. When the selected clients' deltas would take more than the configured budget and
//! the driver gave the machine a spill file ([`spill::SpillFile`]), the round's arena is
//! that memory-mapped file instead of the heap. An update that would take the arena past its
//! limit (the budget, or the spill file's size) is refused (the round machine rejects it with
//! reason `memory_budget`, and the round aggregates what it holds).
//!
//! When the strategy asks for them (FedOMG), the dot products `Δ_u·Δ_v` are computed while
//! updates arrive: every [`UpdatesConfig::block`] arrivals, the new block is multiplied against
//! all rows held so far ([`gram::cross_dots`]), which reads each earlier delta once per
//! block instead of once per arrival. At the round's end only the last partial block is left,
//! so closing costs O(N²) for the solver plus one weighted sum over the deltas.
//!
//! Views are in client-id order, whatever the arrival order, so aggregation is reproducible.

pub mod arena;
pub mod delta;
pub mod gram;
pub mod norms;
pub mod spill;

pub use arena::Arena;
use arena::Stored;
pub use delta::Delta;
use fedge_wire::Codec;

/// How updates are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdatesConfig {
    /// Stream the dot products between deltas (FedOMG needs them).
    pub dots: bool,
    /// Largest arena, in bytes.
    pub budget_bytes: usize,
    /// Arrivals per block of dot products.
    pub block: usize,
    /// Threads for dot products and weighted sums.
    pub threads: usize,
    /// The codec updates are expected in (the round's): sizes the arena reserved up front.
    /// Each update is held as it came, whatever this says.
    pub codec: Codec,
}

impl Default for UpdatesConfig {
    fn default() -> Self {
        Self {
            dots: false,
            budget_bytes: 1 << 30,
            block: 16,
            threads: gram::default_threads(),
            codec: Codec::F32,
        }
    }
}

/// The update cannot be held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    /// Its delta, with the dot products, would pass the memory budget.
    #[error("holding this update needs {needed} bytes, over the budget of {budget} bytes")]
    Memory {
        /// Bytes the arena and the dot products would need.
        needed: usize,
        /// The budget.
        budget: usize,
    },
    /// The spill file's disk has no room for it.
    #[error("the spill file cannot grow: {0}")]
    Disk(String),
}

/// The accepted updates of one round.
#[derive(Debug, Clone)]
pub struct RoundUpdates {
    m: usize,
    config: UpdatesConfig,
    clients: Vec<String>,
    counts: Vec<u32>,
    /// Where each update's row starts in the arena and how it is stored, arrival order.
    rows: Vec<(usize, Stored)>,
    arena: Arena,
    /// Most words the arena may hold this round.
    limit: usize,
    /// `tri[i][j] = Δ_i·Δ_j` for `j ≤ i`, arrival indices, for rows below `flushed`.
    tri: Vec<Vec<f64>>,
    flushed: usize,
    /// Arrival indices sorted by client id.
    order: Vec<usize>,
}

impl RoundUpdates {
    /// Empty, for deltas of `m` parameters, with room reserved for `expected` updates (capped
    /// by the budget).
    pub fn new(m: usize, expected: usize, config: UpdatesConfig) -> Self {
        Self::reusing(Arena::default(), m, expected, config)
    }

    /// Like [`RoundUpdates::new`], reusing the memory of an earlier round's arena (see
    /// [`RoundUpdates::into_arena`]), so a steady federation does not fault in fresh pages
    /// every round; the arena's spill file, if any, takes the deltas that outgrow the budget.
    pub fn reusing(mut arena: Arena, m: usize, expected: usize, config: UpdatesConfig) -> Self {
        let stored = match config.codec {
            Codec::F16 => Stored::F16,
            Codec::F32 | Codec::Int8 => Stored::F32,
        };
        let wanted = expected.saturating_mul(stored.words(m.max(1)));
        let limit = arena.begin(wanted, config.budget_bytes);
        Self {
            m,
            config,
            clients: Vec::with_capacity(expected),
            counts: Vec::with_capacity(expected),
            rows: Vec::with_capacity(expected),
            arena,
            limit,
            tri: Vec::with_capacity(expected),
            flushed: 0,
            order: Vec::new(),
        }
    }

    /// Holds all of `updates` (client, samples, delta) and finishes the dot products; for tests
    /// and offline replay. Panics if a delta's length differs from `m`.
    pub fn from_updates<'a>(
        m: usize,
        dots: bool,
        updates: impl IntoIterator<Item = (&'a str, u32, &'a [f32])>,
    ) -> Self {
        let config = UpdatesConfig {
            dots,
            budget_bytes: usize::MAX,
            ..UpdatesConfig::default()
        };
        let mut held = Self::new(m, 0, config);
        for (client, n, delta) in updates {
            held.push(client, n, delta).expect("no budget");
        }
        held.finish();
        held
    }

    /// The arena's memory, for the next round.
    pub fn into_arena(self) -> Arena {
        self.arena
    }

    /// Whether this round's deltas are in the spill file.
    pub fn is_spilled(&self) -> bool {
        self.arena.is_spilled()
    }

    /// Parameters per delta.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Updates held.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// No update held.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Whether `client` has an update held.
    pub fn contains(&self, client: &str) -> bool {
        self.clients.iter().any(|c| c == client)
    }

    /// Bytes of the delta arena in use.
    pub fn arena_bytes(&self) -> usize {
        self.arena.len() * 4
    }

    /// Holds one update; `delta.len()` must be `m` (the round machine checks shapes first).
    pub fn push(
        &mut self,
        client: &str,
        num_samples: u32,
        delta: &[f32],
    ) -> Result<(), OverBudget> {
        self.push_values(client, num_samples, delta.iter().copied())
    }

    /// [`RoundUpdates::push`] straight from a decoded wire tensor, without an intermediate
    /// copy of the delta; a tensor sent in f16 is held in f16.
    pub fn push_tensor(
        &mut self,
        client: &str,
        num_samples: u32,
        delta: &fedge_wire::TensorF32,
    ) -> Result<(), OverBudget> {
        assert_eq!(delta.len(), self.m, "delta length");
        match delta.packed_f16() {
            Some(packed) => {
                let m = self.m;
                self.hold(client, num_samples, Stored::F16, |arena| {
                    arena.push_f16(m, packed)
                })
            }
            None => self.push_values(client, num_samples, delta.values()),
        }
    }

    pub(crate) fn push_values(
        &mut self,
        client: &str,
        num_samples: u32,
        delta: impl ExactSizeIterator<Item = f32>,
    ) -> Result<(), OverBudget> {
        assert_eq!(delta.len(), self.m, "delta length");
        self.hold(client, num_samples, Stored::F32, |arena| {
            arena.push_f32(delta)
        })
    }

    /// Checks the budget for one more row stored as `stored`, then `write`s it.
    fn hold(
        &mut self,
        client: &str,
        num_samples: u32,
        stored: Stored,
        write: impl FnOnce(&mut Arena),
    ) -> Result<(), OverBudget> {
        let start = self.arena.len();
        let needed = start + stored.words(self.m);
        // The dot products live on the heap whatever holds the deltas.
        let rows = self.len() + 1;
        let dots = if self.config.dots {
            rows.saturating_mul(rows + 1) / 2 * 8
        } else {
            0
        };
        let heap = if self.arena.is_spilled() {
            0
        } else {
            needed.saturating_mul(4)
        };
        if needed > self.limit || heap.saturating_add(dots) > self.config.budget_bytes {
            return Err(OverBudget::Memory {
                needed: heap.saturating_add(dots).max(needed.saturating_mul(4)),
                budget: self.config.budget_bytes,
            });
        }
        self.arena
            .reserve(needed)
            .map_err(|e| OverBudget::Disk(e.to_string()))?;
        self.clients.push(client.to_string());
        self.counts.push(num_samples);
        self.rows.push((start, stored));
        write(&mut self.arena);
        self.order.clear();
        if self.config.dots && self.len() - self.flushed >= self.config.block.max(1) {
            self.flush();
        }
        Ok(())
    }

    /// Cuts every sample count above `cap` down to it; returns the clients cut with the
    /// counts they claimed, in client order. The weights of the aggregation are the counts, so
    /// this bounds any one update's weight.
    pub fn cap_samples(&mut self, cap: u32) -> Vec<(String, u32)> {
        let mut capped: Vec<(String, u32)> = Vec::new();
        for (client, count) in self.clients.iter().zip(&mut self.counts) {
            if *count > cap {
                capped.push((client.clone(), *count));
                *count = cap;
            }
        }
        capped.sort();
        capped
    }

    /// Keeps the updates whose `keep[i]` is true (`i` in client order), compacting the arena
    /// where it is (heap or spill file); the dot products of the kept pairs are kept, so
    /// nothing is recomputed. Call after [`RoundUpdates::finish`]; the result is finished.
    pub fn retain(&mut self, keep: &[bool]) {
        assert_eq!(keep.len(), self.len(), "one flag per update");
        let mut kept = vec![false; self.len()];
        for (i, &k) in keep.iter().enumerate() {
            kept[self.physical(i)] = k;
        }
        let mut next = 0;
        for (u, _) in kept.iter().enumerate().filter(|(_, k)| **k) {
            let (start, stored) = self.rows[u];
            let words = stored.words(self.m);
            self.arena.move_words(start, words, next);
            self.rows[u].0 = next;
            next += words;
        }
        self.arena.truncate(next);
        let mut flags = kept.iter();
        self.rows.retain(|_| *flags.next().unwrap_or(&false));
        let mut flags = kept.iter();
        self.clients.retain(|_| *flags.next().unwrap_or(&false));
        let mut flags = kept.iter();
        self.counts.retain(|_| *flags.next().unwrap_or(&false));
        // Flushed rows come first in arrival order, so the kept ones stay first.
        let rows: Vec<usize> = (0..self.tri.len()).filter(|&u| kept[u]).collect();
        self.tri = rows
            .iter()
            .enumerate()
            .map(|(a, &u)| rows[..=a].iter().map(|&v| self.tri[u][v]).collect())
            .collect();
        self.flushed = rows.len();
        self.finish();
    }

    /// Whether the dot products between deltas are kept (FedOMG needs them).
    pub fn keeps_dots(&self) -> bool {
        self.config.dots
    }

    /// A copy with update `i`'s delta (`i` as in [`RoundUpdates::client`]) scaled by
    /// `scales[i]`, held on the heap (no budget: this round's arena already held these rows),
    /// with dot products when `dots`. Finished.
    pub fn scaled(&self, scales: &[f32], dots: bool) -> RoundUpdates {
        assert_eq!(scales.len(), self.len(), "one scale per update");
        let config = UpdatesConfig {
            budget_bytes: usize::MAX,
            dots,
            ..self.config
        };
        let mut out = RoundUpdates::new(self.m, self.len(), config);
        for (i, &scale) in scales.iter().enumerate() {
            let values = self.delta(i).iter().map(|v| v * scale);
            let pushed = out.push_values(self.client(i), self.num_samples(i), values);
            debug_assert!(pushed.is_ok());
        }
        out.finish();
        out
    }

    /// Completes the dot products and the client order; call before reading.
    pub fn finish(&mut self) {
        if self.config.dots {
            self.flush();
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|a, b| self.clients[*a].cmp(&self.clients[*b]));
        self.order = order;
    }

    fn flush(&mut self) {
        let (start, end) = (self.flushed, self.len());
        if start == end {
            return;
        }
        let rows: Vec<Delta<'_>> = (0..end).map(|u| self.row(u)).collect();
        let dots = gram::cross_dots(&rows, start..end, 0..end, self.config.threads);
        for (r, i) in (start..end).enumerate() {
            self.tri.push(dots[r * end..r * end + i + 1].to_vec());
        }
        self.flushed = end;
    }

    fn physical(&self, i: usize) -> usize {
        assert_eq!(self.order.len(), self.len(), "call finish() first");
        self.order[i]
    }

    /// Client id of the `i`-th update in client order.
    pub fn client(&self, i: usize) -> &str {
        &self.clients[self.physical(i)]
    }

    /// Sample count of the `i`-th update in client order.
    pub fn num_samples(&self, i: usize) -> u32 {
        self.counts[self.physical(i)]
    }

    /// The delta of arrival `u`.
    fn row(&self, u: usize) -> Delta<'_> {
        let (start, stored) = self.rows[u];
        self.arena.row(start, self.m, stored)
    }

    /// Delta of the `i`-th update in client order.
    pub fn delta(&self, i: usize) -> Delta<'_> {
        self.row(self.physical(i))
    }

    /// Sum of the sample counts.
    pub fn total_samples(&self) -> f64 {
        self.counts.iter().map(|n| *n as f64).sum()
    }

    /// `Δ_i·Δ_j` in client order, if dot products were streamed.
    pub fn dot(&self, i: usize, j: usize) -> Option<f64> {
        if !self.config.dots {
            return None;
        }
        let (a, b) = (self.physical(i), self.physical(j));
        let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
        Some(self.tri[hi][lo])
    }

    /// `Σ_i coef_i Δ_i` (client order), in f64.
    pub fn weighted_sum(&self, coef: &[f64]) -> Vec<f64> {
        assert_eq!(coef.len(), self.len());
        let rows: Vec<Delta<'_>> = (0..self.len()).map(|i| self.delta(i)).collect();
        gram::weighted_sum(&rows, coef, self.config.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retain_compacts_in_place_as_if_only_the_kept_updates_had_arrived() {
        let rows: [(&str, u32, [f32; 3]); 5] = [
            ("e", 5, [1.0, -2.0, 0.5]),
            ("b", 2, [3.0, 0.0, 1.0]),
            ("d", 4, [-1.0, 1.0, 2.0]),
            ("a", 1, [0.5, 0.5, 0.5]),
            ("c", 3, [2.0, 2.0, -1.0]),
        ];
        let config = UpdatesConfig {
            dots: true,
            block: 2,
            threads: 1,
            ..UpdatesConfig::default()
        };
        let mut held = RoundUpdates::new(3, 5, config);
        for (client, n, delta) in &rows {
            held.push(client, *n, delta).unwrap();
        }
        held.finish();
        // Client order a, b, c, d, e: drop b and e.
        held.retain(&[true, false, true, true, false]);
        let kept = rows.iter().filter(|(c, ..)| !matches!(*c, "b" | "e"));
        let want = RoundUpdates::from_updates(3, true, kept.map(|(c, n, d)| (*c, *n, &d[..])));
        assert_eq!(held.len(), 3);
        for i in 0..3 {
            assert_eq!(held.client(i), want.client(i));
            assert_eq!(held.num_samples(i), want.num_samples(i));
            assert_eq!(held.delta(i).to_vec(), want.delta(i).to_vec());
            for j in 0..3 {
                assert_eq!(held.dot(i, j), want.dot(i, j));
            }
        }
        assert_eq!(held.arena_bytes(), 3 * 3 * 4);
    }

    #[test]
    fn views_are_in_client_order_and_dots_are_streamed() {
        let config = UpdatesConfig {
            dots: true,
            block: 2,
            threads: 1,
            ..UpdatesConfig::default()
        };
        let mut held = RoundUpdates::new(2, 3, config);
        held.push("c", 3, &[1.0, 2.0]).unwrap();
        held.push("a", 1, &[3.0, 4.0]).unwrap();
        held.push("b", 2, &[5.0, 6.0]).unwrap();
        held.finish();
        assert_eq!(
            (0..3).map(|i| held.client(i)).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(held.delta(0).to_vec(), [3.0, 4.0]);
        assert_eq!(held.num_samples(2), 3);
        assert_eq!(held.dot(0, 2), Some(11.0));
        assert_eq!(held.dot(2, 0), Some(11.0));
        assert_eq!(held.dot(1, 1), Some(61.0));
        assert_eq!(held.weighted_sum(&[1.0, 0.0, 2.0]), vec![5.0, 8.0]);
        assert_eq!(held.total_samples(), 6.0);
    }

    #[test]
    fn an_update_over_the_budget_is_refused_and_nothing_changes() {
        let config = UpdatesConfig {
            budget_bytes: 16,
            ..UpdatesConfig::default()
        };
        let mut held = RoundUpdates::new(2, 10, config);
        held.push("a", 1, &[1.0, 2.0]).unwrap();
        held.push("b", 1, &[1.0, 2.0]).unwrap();
        let err = held.push("c", 1, &[1.0, 2.0]).unwrap_err();
        assert_eq!(
            err,
            OverBudget::Memory {
                needed: 24,
                budget: 16
            }
        );
        assert_eq!(held.len(), 2);
        assert_eq!(held.arena_bytes(), 16);
    }

    #[test]
    fn the_dot_products_count_against_the_budget() {
        // Three rows of 2 values: 24 bytes of deltas and 6 dot products of 8 bytes.
        let config = |budget_bytes| UpdatesConfig {
            dots: true,
            budget_bytes,
            ..UpdatesConfig::default()
        };
        let mut fits = RoundUpdates::new(2, 3, config(24 + 48));
        let mut tight = RoundUpdates::new(2, 3, config(24 + 47));
        for c in ["a", "b", "c"] {
            fits.push(c, 1, &[1.0, 2.0]).unwrap();
        }
        tight.push("a", 1, &[1.0, 2.0]).unwrap();
        tight.push("b", 1, &[1.0, 2.0]).unwrap();
        assert!(matches!(
            tight.push("c", 1, &[1.0, 2.0]),
            Err(OverBudget::Memory { needed: 72, .. })
        ));
    }

    #[test]
    fn without_dots_there_are_none() {
        let held = RoundUpdates::from_updates(1, false, [("a", 1, &[1.0f32][..])]);
        assert_eq!(held.dot(0, 0), None);
    }

    /// Rows with values f16 cannot carry exactly, so a mix-up of f16 and f32 storage shows.
    fn fine_rows(n: usize, m: usize) -> Vec<Vec<f32>> {
        (0..n)
            .map(|u| {
                (0..m)
                    .map(|j| ((u * 7919 + j * 104_729) % 2003) as f32 / 1001.3 - 1.0)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn f16_updates_are_held_in_f16_and_read_as_their_exact_f32_values() {
        use fedge_wire::TensorF32;
        // An odd length (a padded last word) and more than one segment of the dot products.
        let m = gram::SEGMENT + 3;
        let rows = fine_rows(4, m);
        let clients = ["d", "b", "a", "c"];
        let tensors: Vec<TensorF32> = rows
            .iter()
            .enumerate()
            // "a" sends f32 (a device whose values f16 cannot carry does): storage is mixed.
            .map(|(u, r)| match clients[u] {
                "a" => TensorF32::from_slice(r),
                _ => TensorF32::from_slice_with(r, Codec::F16),
            })
            .collect();
        let widened: Vec<Vec<f32>> = tensors.iter().map(TensorF32::to_vec).collect();
        for spill in [false, true] {
            let config = UpdatesConfig {
                dots: true,
                block: 3,
                threads: 2,
                codec: Codec::F16,
                budget_bytes: if spill { 1 << 10 } else { usize::MAX },
            };
            let dir = tempfile::tempdir().unwrap();
            let arena = match spill {
                true => Arena::with_spill(spill::SpillFile::create(dir.path(), 64 << 20).unwrap()),
                false => Arena::default(),
            };
            let mut held = RoundUpdates::reusing(arena, m, 4, config);
            assert_eq!(held.is_spilled(), spill);
            for (u, t) in tensors.iter().enumerate() {
                held.push_tensor(clients[u], 10 + u as u32, t).unwrap();
            }
            held.finish();
            // Three rows of ⌈M/2⌉ words and one of M.
            assert_eq!(held.arena_bytes(), 3 * m.div_ceil(2) * 4 + m * 4);
            let want = RoundUpdates::from_updates(
                m,
                true,
                (0..4).map(|u| (clients[u], 10 + u as u32, &widened[u][..])),
            );
            let same = |held: &RoundUpdates, want: &RoundUpdates| {
                for i in 0..held.len() {
                    assert_eq!(held.client(i), want.client(i));
                    assert_eq!(held.delta(i).to_vec(), want.delta(i).to_vec());
                    for j in 0..held.len() {
                        let (a, b) = (held.dot(i, j).unwrap(), want.dot(i, j).unwrap());
                        assert_eq!(a.to_bits(), b.to_bits(), "dot {i},{j}");
                    }
                }
                let coef: Vec<f64> = (0..held.len()).map(|i| 0.3 - i as f64).collect();
                let (a, b) = (held.weighted_sum(&coef), want.weighted_sum(&coef));
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            };
            same(&held, &want);
            // Client order a, b, c, d: drop b; the rows left move down, f32 and f16 alike.
            held.retain(&[true, false, true, true]);
            assert_eq!(held.arena_bytes(), 2 * m.div_ceil(2) * 4 + m * 4);
            let kept = [0, 2, 3].map(|u| (clients[u], 10 + u as u32, &widened[u][..]));
            same(&held, &RoundUpdates::from_updates(m, true, kept));
        }
    }
}
