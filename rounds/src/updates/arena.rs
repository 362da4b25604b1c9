//! Where a round's deltas live: one contiguous run of 4-byte words on the heap, or in the
//! spill file when they outgrow the budget. A delta sent in f16 is kept in f16 (two values a
//! word, `⌈M/2⌉` words), any other in f32 (`M` words); each row remembers which
//! ([`Stored`]), so an f16 round holds `N·M·2` bytes and a round that mixes codecs still holds
//! every row exactly.

use half::f16;

use super::delta::Delta;
use super::spill::SpillFile;

/// How one row is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// `M` words of f32.
    F32,
    /// `⌈M/2⌉` words holding `M` f16 values (the last half-word of an odd row is zero).
    F16,
}

impl Stored {
    /// Words a row of `m` values takes.
    pub fn words(self, m: usize) -> usize {
        match self {
            Stored::F32 => m,
            Stored::F16 => m.div_ceil(2),
        }
    }
}

/// The arena's memory. Kept from round to round, so a steady federation neither faults in
/// fresh pages nor remaps.
#[derive(Debug, Default)]
pub struct Arena {
    heap: Vec<u32>,
    spill: Option<SpillFile>,
    /// Words in use in the spill file; `None` while the heap is in use.
    spilled: Option<usize>,
}

impl Clone for Arena {
    /// A copy on the heap (a spill file is not shared).
    fn clone(&self) -> Self {
        Self {
            heap: self.words().to_vec(),
            spill: None,
            spilled: None,
        }
    }
}

impl Arena {
    /// An arena that spills to `file` when a round outgrows its budget.
    pub fn with_spill(file: SpillFile) -> Self {
        Self {
            heap: Vec::new(),
            spill: Some(file),
            spilled: None,
        }
    }

    /// Empties the arena for a round expected to take `wanted` words under `budget_bytes`:
    /// the spill file when they do not fit the budget and the file is there, else the heap
    /// with room reserved for what the budget allows. Returns the most words it may hold.
    pub(super) fn begin(&mut self, wanted: usize, budget_bytes: usize) -> usize {
        self.heap.clear();
        self.spilled = None;
        let heap_limit = budget_bytes / 4;
        match &self.spill {
            Some(file) if wanted > heap_limit && file.capacity_words() > heap_limit => {
                self.heap.shrink_to_fit();
                self.spilled = Some(0);
                file.capacity_words()
            }
            _ => {
                self.heap.reserve(wanted.min(heap_limit));
                heap_limit
            }
        }
    }

    /// Whether this round's deltas are in the spill file.
    pub fn is_spilled(&self) -> bool {
        self.spilled.is_some()
    }

    /// Words in use.
    pub(super) fn len(&self) -> usize {
        self.spilled.unwrap_or(self.heap.len())
    }

    fn words(&self) -> &[u32] {
        match (&self.spill, self.spilled) {
            (Some(file), Some(len)) => &file.words()[..len],
            _ => &self.heap,
        }
    }

    fn words_mut(&mut self) -> &mut [u32] {
        match (&mut self.spill, self.spilled) {
            (Some(file), Some(len)) => &mut file.words_mut()[..len],
            _ => &mut self.heap,
        }
    }

    /// The row of `m` values stored as `stored` from word `start`.
    pub(super) fn row(&self, start: usize, m: usize, stored: Stored) -> Delta<'_> {
        let words = &self.words()[start..start + stored.words(m)];
        match stored {
            Stored::F32 => Delta::F32(bytemuck::cast_slice(words)),
            Stored::F16 => Delta::F16(&bytemuck::cast_slice::<u32, f16>(words)[..m]),
        }
    }

    /// Moves `len` words from `from` to `to` (compaction; `to ≤ from`).
    pub(super) fn move_words(&mut self, from: usize, len: usize, to: usize) {
        self.words_mut().copy_within(from..from + len, to);
    }

    pub(super) fn truncate(&mut self, len: usize) {
        match &mut self.spilled {
            Some(used) => *used = (*used).min(len),
            None => self.heap.truncate(len),
        }
    }

    /// Makes room for `words` in all (reserving disk space when spilled).
    pub(super) fn reserve(&mut self, words: usize) -> std::io::Result<()> {
        match (&mut self.spill, self.spilled) {
            (Some(file), Some(_)) => file.reserve(words),
            _ => Ok(()),
        }
    }

    /// Appends `words` words and returns them to be filled; the caller checked that they fit
    /// (and reserved them when spilled).
    fn grow(&mut self, words: usize) -> &mut [u32] {
        match (&mut self.spill, &mut self.spilled) {
            (Some(file), Some(len)) => {
                let start = *len;
                *len += words;
                &mut file.words_mut()[start..start + words]
            }
            _ => {
                let start = self.heap.len();
                self.heap.resize(start + words, 0);
                &mut self.heap[start..]
            }
        }
    }

    /// Appends a row of f32 values (on the heap without zeroing it first).
    pub(super) fn push_f32(&mut self, row: impl ExactSizeIterator<Item = f32>) {
        if self.spilled.is_none() {
            self.heap.extend(row.map(f32::to_bits));
            return;
        }
        let slots: &mut [f32] = bytemuck::cast_slice_mut(self.grow(row.len()));
        for (slot, value) in slots.iter_mut().zip(row) {
            *slot = value;
        }
    }

    /// Appends a row of `m` f16 values from their packed little-endian bytes.
    pub(super) fn push_f16(&mut self, m: usize, packed: &[u8]) {
        let words = Stored::F16.words(m);
        let slots: &mut [u16] = bytemuck::cast_slice_mut(self.grow(words));
        for (slot, bytes) in slots.iter_mut().zip(packed.chunks_exact(2)) {
            *slot = u16::from_le_bytes([bytes[0], bytes[1]]);
        }
        // A spill file's words may hold an earlier round's values: clear an odd row's pad.
        slots[m..].fill(0);
    }
}
