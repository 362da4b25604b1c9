//! [`FeatureSet`], the cached backbone features and labels every objective trains on, and
//! [`Fnv64`], the content hash that keys caches and per-device seeds. Computing features (the
//! backbone, the cache files) is the device crate's I/O, not this crate's.

/// Features and labels of one local split, features already computed by the backbone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeatureSet {
    /// Feature size `F`.
    pub dim: usize,
    /// `len × F` values, row-major.
    pub features: Vec<f32>,
    /// Class of each row.
    pub labels: Vec<u32>,
}

impl FeatureSet {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows `indices`, in that order.
    ///
    /// # Panics
    ///
    /// Panics if an index is out of range.
    pub fn rows(&self, indices: &[usize]) -> FeatureSet {
        let mut out = FeatureSet {
            dim: self.dim,
            features: Vec::with_capacity(indices.len() * self.dim),
            labels: Vec::with_capacity(indices.len()),
        };
        for &i in indices {
            out.features
                .extend_from_slice(&self.features[i * self.dim..(i + 1) * self.dim]);
            out.labels.push(self.labels[i]);
        }
        out
    }
}

/// FNV-1a, 64 bit: a stable, dependency-free content hash for cache keys (not for security).
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(pub u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    /// Mixes `bytes` in.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Hash of one byte string.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::default();
        h.write(bytes);
        h.0
    }
}
