//! One held delta as the arena stores it: f32 values, or the f16 values a device sent, kept
//! as f16 and widened where they are read. Widening f16 to f32 is exact, so every reader sees
//! the values an f32 arena would have held, bit for bit.

use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Values widened at a time when a reader needs f32 slices of an f16 delta.
pub const WIDEN_CHUNK: usize = 1024;

/// A read-only view of one delta.
#[derive(Debug, Clone, Copy)]
pub enum Delta<'a> {
    /// Held in f32 (updates sent in f32 or int8, rows rewritten by a robust rule).
    F32(&'a [f32]),
    /// Held in f16, as sent.
    F16(&'a [f16]),
}

impl<'a> Delta<'a> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Delta::F32(v) => v.len(),
            Delta::F16(v) => v.len(),
        }
    }

    /// True when the delta holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `j`.
    #[inline]
    pub fn get(&self, j: usize) -> f32 {
        match self {
            Delta::F32(v) => v[j],
            Delta::F16(v) => v[j].to_f32(),
        }
    }

    /// The values in `range`.
    pub fn slice(&self, range: Range<usize>) -> Delta<'a> {
        match self {
            Delta::F32(v) => Delta::F32(&v[range]),
            Delta::F16(v) => Delta::F16(&v[range]),
        }
    }

    /// The values, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = f32> + 'a {
        let (f32s, f16s): (&'a [f32], &'a [f16]) = match *self {
            Delta::F32(v) => (v, &[]),
            Delta::F16(v) => (&[], v),
        };
        // One of the two is empty; chaining keeps the iterator's type the same for both.
        Widening {
            f32s: f32s.iter(),
            f16s: f16s.iter(),
        }
    }

    /// The values as a vector.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.widen_into(&mut out);
        out
    }

    /// Writes the values into `out` (of the same length).
    pub fn widen_into(&self, out: &mut [f32]) {
        match self {
            Delta::F32(v) => out.copy_from_slice(v),
            Delta::F16(v) => v.convert_to_f32_slice(out),
        }
    }

    /// The values in `range` as an f32 slice: borrowed when held in f32, else widened into
    /// `buf` (grown as needed).
    pub fn f32_range<'b>(&self, range: Range<usize>, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Delta::F32(v) => &v[range],
            Delta::F16(v) => {
                buf.resize(range.len(), 0.0);
                v[range].convert_to_f32_slice(buf);
                buf
            }
        }
    }
}

/// [`Delta::iter`]'s iterator: the f32 values, or the f16 values widened.
struct Widening<'a> {
    f32s: std::slice::Iter<'a, f32>,
    f16s: std::slice::Iter<'a, f16>,
}

impl Iterator for Widening<'_> {
    type Item = f32;

    #[inline]
    fn next(&mut self) -> Option<f32> {
        match self.f32s.next() {
            Some(v) => Some(*v),
            None => self.f16s.next().map(|h| h.to_f32()),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.f32s.len() + self.f16s.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Widening<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f16_delta_reads_as_its_exact_f32_values_every_way() {
        let values = [1.0f32, -2.5, 6.1e-5, 65504.0, -0.0, 3.0e-8];
        let halves: Vec<f16> = values.iter().map(|v| f16::from_f32(*v)).collect();
        let want: Vec<f32> = halves
            .iter()
            .map(|h| fedge_wire::f16_to_f32(h.to_bits()))
            .collect();
        let d = Delta::F16(&halves);
        assert_eq!(d.len(), 6);
        assert_eq!(d.to_vec(), want);
        assert_eq!(d.iter().collect::<Vec<_>>(), want);
        assert_eq!(d.iter().len(), 6);
        assert_eq!((0..6).map(|j| d.get(j)).collect::<Vec<_>>(), want);
        let mut buf = Vec::new();
        assert_eq!(d.f32_range(1..4, &mut buf), &want[1..4]);
        assert_eq!(d.slice(2..3).to_vec(), vec![want[2]]);
    }
}
