//! A dense f32 tensor as it travels: shape, encoding and packed little-endian bytes.
//!
//! Three encodings ([`Codec`]): `f32` (lossless), `f16` (IEEE half precision, round to nearest
//! even; half the bytes) and `int8` (one scale per tensor, `q = round(x / s)` with
//! `s = max|x| / 127`; a quarter of the bytes). A tensor that a lossy codec cannot carry
//! (non-finite values, or values beyond the f16 range) is sent as f32, so the receiver's
//! checks see the values as they were.

use serde::{Deserialize, Serialize};

use crate::error::DecodeError;

/// How a sender packs the values of a tensor, chosen by the coordinator for a federation's
/// updates (`TrainParams::update_codec`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Codec {
    /// 4 bytes per value, lossless.
    #[default]
    F32,
    /// 2 bytes per value: IEEE 754 half precision (relative error ≤ 2⁻¹¹ in its normal range).
    F16,
    /// 1 byte per value and a 4-byte scale per tensor (error ≤ max|x| / 254 per value).
    Int8,
}

impl Codec {
    /// Name as written in configuration files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Codec::F32 => "f32",
            Codec::F16 => "f16",
            Codec::Int8 => "int8",
        }
    }
}

impl Codec {
    /// The codec round tasks travel in when updates travel in `self`: f32 in lossless mode,
    /// f16 otherwise. Never int8, whose error is relative to a tensor's largest value: a task's
    /// small weights would lose most of their digits (docs/mqtt-topics.md, round tasks).
    pub fn for_tasks(self) -> Codec {
        match self {
            Codec::F32 => Codec::F32,
            Codec::F16 | Codec::Int8 => Codec::F16,
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Codec {
    type Err = crate::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Codec::F32, Codec::F16, Codec::Int8]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| crate::UnknownName::new("codec", s, ["f32", "f16", "int8"]))
    }
}

/// The packing of one tensor's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Encoding {
    F32,
    F16,
    Int8 { scale: f32 },
}

impl Encoding {
    fn width(self) -> usize {
        match self {
            Encoding::F32 => 4,
            Encoding::F16 => 2,
            Encoding::Int8 { .. } => 1,
        }
    }
}

/// A dense row-major f32 tensor.
///
/// The values are kept as packed little-endian bytes so that encoding is one pass and decoding
/// is checked once (length against shape and encoding) instead of per element.
/// A tensor whose shape is empty is a scalar and holds exactly one value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorF32 {
    shape: Vec<u32>,
    encoding: Encoding,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
}

/// Number of elements a tensor of `shape` holds, or `None` when it does not fit in a `usize`.
fn element_count(shape: &[u32]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &dim| {
        acc.checked_mul(usize::try_from(dim).ok()?)
    })
}

/// The largest finite f16 value.
const F16_MAX: f32 = 65504.0;

/// IEEE 754 binary16 bits of `x`, rounded to nearest, ties to even; overflow gives infinity.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        // Infinity stays infinity; NaN stays a (quiet) NaN.
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    // Exponent re-biased for f16 (bias 15 instead of 127).
    let e = exp - 112;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A subnormal f16 (or zero): m10 = m24 · 2^(e − 14), rounded.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        // A carry into the exponent is the correct rounding, up to infinity.
        r += 1;
    }
    sign | r as u16
}

/// The f32 value of IEEE 754 binary16 bits (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    match exp {
        0 => {
            // Zero or subnormal: man · 2⁻²⁴, exact in f32.
            let magnitude = man as f32 * f32::from_bits(0x3380_0000);
            if sign != 0 { -magnitude } else { magnitude }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// The packed bytes of `values` under `codec`, falling back to f32 when the codec cannot
/// carry them.
fn pack(values: &[f32], codec: Codec) -> (Encoding, Vec<u8>) {
    // One pass for what the lossy codecs need to know; none for f32.
    let (finite, max_abs) = match codec {
        Codec::F32 => (true, 0.0),
        _ => values.iter().fold((true, 0f32), |(finite, max), v| {
            (finite && v.is_finite(), max.max(v.abs()))
        }),
    };
    match codec {
        Codec::F16 if finite && max_abs <= F16_MAX => (
            Encoding::F16,
            values
                .iter()
                .flat_map(|&v| f32_to_f16(v).to_le_bytes())
                .collect(),
        ),
        Codec::Int8 if finite => {
            let scale = max_abs / 127.0;
            let bytes = values
                .iter()
                .map(|&v| {
                    let q = if scale > 0.0 {
                        (v / scale).round()
                    } else {
                        0.0
                    };
                    q.clamp(-127.0, 127.0) as i8 as u8
                })
                .collect();
            (Encoding::Int8 { scale }, bytes)
        }
        _ => (
            Encoding::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    }
}

impl TensorF32 {
    /// Builds a lossless tensor; fails when `values.len()` is not the product of `shape`.
    ///
    /// A shape whose product overflows a `usize` is an error as well.
    pub fn new(shape: Vec<u32>, values: &[f32]) -> Result<Self, DecodeError> {
        if element_count(&shape) != Some(values.len()) {
            return Err(DecodeError::TensorShape {
                shape,
                bytes: values.len().saturating_mul(4),
            });
        }
        let (encoding, bytes) = pack(values, Codec::F32);
        Ok(Self {
            shape,
            encoding,
            bytes,
        })
    }

    /// A lossless rank-1 tensor holding `values`.
    ///
    /// # Panics
    ///
    /// Panics when `values` holds more than `u32::MAX` elements, which no shape can describe.
    pub fn from_slice(values: &[f32]) -> Self {
        Self::from_slice_with(values, Codec::F32)
    }

    /// A rank-1 tensor holding `values`, packed with `codec`.
    ///
    /// # Panics
    ///
    /// Panics when `values` holds more than `u32::MAX` elements, which no shape can describe.
    pub fn from_slice_with(values: &[f32], codec: Codec) -> Self {
        let len =
            u32::try_from(values.len()).expect("a rank-1 tensor holds at most u32::MAX values");
        let (encoding, bytes) = pack(values, codec);
        Self {
            shape: vec![len],
            encoding,
            bytes,
        }
    }

    /// The same values, shape kept, packed with `codec` (falling back to f32 as
    /// [`TensorF32::from_slice_with`] does).
    pub fn recoded(&self, codec: Codec) -> Self {
        let (encoding, bytes) = pack(&self.to_vec(), codec);
        Self {
            shape: self.shape.clone(),
            encoding,
            bytes,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[u32] {
        &self.shape
    }

    /// The codec the values were packed with.
    pub fn codec(&self) -> Codec {
        match self.encoding {
            Encoding::F32 => Codec::F32,
            Encoding::F16 => Codec::F16,
            Encoding::Int8 { .. } => Codec::Int8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.encoding.width()
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Decoded values.
    pub fn to_vec(&self) -> Vec<f32> {
        self.values().collect()
    }

    /// The packed little-endian f16 values, when the tensor travels in f16: what a receiver
    /// may keep as f16 (widening them later gives exactly [`TensorF32::values`]).
    pub fn packed_f16(&self) -> Option<&[u8]> {
        matches!(self.encoding, Encoding::F16).then_some(&self.bytes[..])
    }

    /// Bytes the values take on the wire.
    pub fn packed_len(&self) -> usize {
        self.bytes.len()
    }

    /// Checks the invariant (byte length = value width x product of shape, a finite
    /// non-negative int8 scale) after deserialisation.
    ///
    /// A shape whose byte size overflows a `usize` is reported as a mismatch; this never
    /// panics.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let expected =
            element_count(&self.shape).and_then(|n| n.checked_mul(self.encoding.width()));
        if expected != Some(self.bytes.len()) {
            return Err(DecodeError::TensorShape {
                shape: self.shape.clone(),
                bytes: self.bytes.len(),
            });
        }
        if let Encoding::Int8 { scale } = self.encoding
            && !(scale.is_finite() && scale >= 0.0)
        {
            return Err(DecodeError::TensorScale(scale.to_string()));
        }
        Ok(())
    }

    /// Index of the first NaN or infinite value, if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        self.values().position(|value| !value.is_finite())
    }

    /// Index of the first value that is not finite or whose magnitude passes `limit`.
    pub fn first_beyond(&self, limit: f32) -> Option<usize> {
        self.values()
            .position(|value| !value.is_finite() || value.abs() > limit)
    }

    /// Euclidean norm, summed in f64 in index order.
    pub fn l2_norm(&self) -> f64 {
        self.values()
            .map(|v| (v as f64) * (v as f64))
            .sum::<f64>()
            .sqrt()
    }

    /// The values, decoded one by one; trailing bytes that do not form a whole value are
    /// ignored (they cannot exist once [`TensorF32::validate`] passed).
    pub fn values(&self) -> Values<'_> {
        let width = self.encoding.width();
        Values {
            encoding: self.encoding,
            chunks: self.bytes.chunks_exact(width),
        }
    }
}

/// The decoded values of a [`TensorF32`], in order.
#[derive(Debug, Clone)]
pub struct Values<'a> {
    encoding: Encoding,
    chunks: std::slice::ChunksExact<'a, u8>,
}

impl Iterator for Values<'_> {
    type Item = f32;

    #[inline]
    fn next(&mut self) -> Option<f32> {
        let b = self.chunks.next()?;
        Some(match self.encoding {
            Encoding::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Encoding::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            Encoding::Int8 { scale } => b[0] as i8 as f32 * scale,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl ExactSizeIterator for Values<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keeps_shape_and_values() {
        let t = TensorF32::new(vec![2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-30, f32::MAX]).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.len(), 6);
        assert!(!t.is_empty());
        assert_eq!(t.to_vec(), vec![1.0, -2.0, 3.5, 0.0, 1e-30, f32::MAX]);
        assert!(t.validate().is_ok());
    }

    #[test]
    fn new_rejects_a_length_that_does_not_match_the_shape() {
        let err = TensorF32::new(vec![2, 3], &[1.0; 5]).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TensorShape {
                shape: vec![2, 3],
                bytes: 20
            }
        );
    }

    #[test]
    fn new_rejects_a_shape_whose_product_overflows() {
        let shape = vec![u32::MAX, u32::MAX, u32::MAX];
        assert!(TensorF32::new(shape, &[]).is_err());
    }

    #[test]
    fn a_scalar_has_an_empty_shape_and_one_value() {
        let t = TensorF32::new(vec![], &[4.0]).unwrap();
        assert_eq!(t.to_vec(), vec![4.0]);
        assert!(TensorF32::new(vec![], &[]).is_err());
    }

    #[test]
    fn a_zero_dimension_gives_an_empty_tensor() {
        let t = TensorF32::new(vec![3, 0], &[]).unwrap();
        assert!(t.is_empty());
        assert!(t.validate().is_ok());
    }

    #[test]
    fn from_slice_builds_a_rank_one_tensor() {
        let t = TensorF32::from_slice(&[1.0, 2.0]);
        assert_eq!(t.shape(), &[2]);
        assert_eq!(t.to_vec(), vec![1.0, 2.0]);
        assert_eq!(t.codec(), Codec::F32);
        assert_eq!(t.packed_len(), 8);
    }

    #[test]
    fn postcard_round_trip_preserves_every_bit() {
        let values = [
            0.0,
            -0.0,
            1.5,
            f32::MIN_POSITIVE,
            f32::NAN,
            f32::INFINITY,
            -1e38,
        ];
        let t = TensorF32::new(vec![7], &values).unwrap();
        let bytes = postcard::to_allocvec(&t).unwrap();
        let back: TensorF32 = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.shape(), t.shape());
        let a: Vec<u32> = t.to_vec().iter().map(|v| v.to_bits()).collect();
        let b: Vec<u32> = back.to_vec().iter().map(|v| v.to_bits()).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn the_postcard_body_is_shape_then_length_prefixed_bytes() {
        let t = TensorF32::from_slice(&[1.0]);
        let bytes = postcard::to_allocvec(&t).unwrap();
        // shape [1], encoding F32 (variant 0), 4 bytes.
        assert_eq!(bytes, vec![1, 1, 0, 4, 0, 0, 0x80, 0x3f]);
    }

    #[test]
    fn validate_rejects_a_deserialised_tensor_whose_bytes_do_not_match_its_shape() {
        // Shape [2] but only one value's worth of bytes.
        let bytes = [1u8, 2, 0, 4, 0, 0, 0x80, 0x3f];
        let t: TensorF32 = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            t.validate(),
            Err(DecodeError::TensorShape {
                shape: vec![2],
                bytes: 4
            })
        );
    }

    #[test]
    fn validate_does_not_panic_on_an_overflowing_shape() {
        let t = TensorF32 {
            shape: vec![u32::MAX; 4],
            encoding: Encoding::F32,
            bytes: vec![0; 8],
        };
        assert!(t.validate().is_err());
        let t = TensorF32 {
            shape: vec![1 << 31, 1 << 31],
            encoding: Encoding::Int8 { scale: 1.0 },
            bytes: vec![],
        };
        assert!(t.validate().is_err());
    }

    #[test]
    fn first_non_finite_finds_nan_and_infinities() {
        assert_eq!(TensorF32::from_slice(&[1.0, 2.0]).first_non_finite(), None);
        assert_eq!(
            TensorF32::from_slice(&[1.0, f32::NAN, 2.0]).first_non_finite(),
            Some(1)
        );
        assert_eq!(
            TensorF32::from_slice(&[f32::NEG_INFINITY]).first_non_finite(),
            Some(0)
        );
        assert_eq!(
            TensorF32::from_slice(&[0.0, 0.0, f32::INFINITY]).first_non_finite(),
            Some(2)
        );
        assert_eq!(TensorF32::from_slice(&[]).first_non_finite(), None);
        let t = TensorF32::from_slice(&[1.0, -2.0, 1e30, f32::NAN]);
        assert_eq!(t.first_beyond(2.0), Some(2));
        assert_eq!(t.first_beyond(f32::MAX), Some(3));
    }

    /// Next f16 value towards +infinity from finite `h` (bit order follows value order on
    /// each side of zero).
    fn f16_up(h: u16) -> u16 {
        match h {
            0x8000 => 0x0001,
            _ if h & 0x8000 != 0 => h - 1,
            _ => h + 1,
        }
    }

    #[test]
    fn every_f16_survives_a_round_trip_through_f32() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f16_to_f32(f32_to_f16(x)).is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f32_to_f16(x), h, "{h:#06x} -> {x}");
            }
        }
    }

    #[test]
    fn f16_rounding_picks_the_nearest_value_and_ties_to_even() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            if !x.is_finite() || x.abs() >= F16_MAX {
                continue;
            }
            let h = f32_to_f16(x);
            let got = f16_to_f32(h) as f64;
            // The neighbours on both sides are no closer.
            let lo = f16_to_f32(if x >= 0.0 {
                h.saturating_sub(1)
            } else {
                f16_up(h)
            }) as f64;
            let hi = f16_to_f32(if x >= 0.0 {
                h + 1
            } else {
                h.wrapping_sub(1) | 0x8000
            }) as f64;
            let err = (got - x as f64).abs();
            assert!(err <= (lo - x as f64).abs(), "{x}: {got} vs {lo}");
            if hi.is_finite() {
                assert!(err <= (hi - x as f64).abs(), "{x}: {got} vs {hi}");
            }
        }
        // Ties: 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰; the even one (1) wins.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Overflow, the largest value, the smallest subnormal and below it.
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(-2f32.powi(-25) * 1.5), 0x8001);
    }

    #[test]
    fn lossy_codecs_keep_their_error_bounds_and_sizes() {
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 1e-3)
            .collect();
        let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let f16 = TensorF32::from_slice_with(&values, Codec::F16);
        assert_eq!((f16.codec(), f16.packed_len()), (Codec::F16, 2000));
        for (a, b) in values.iter().zip(f16.values()) {
            assert!(
                (a - b).abs() <= a.abs() * 2f32.powi(-11) + 2f32.powi(-25),
                "{a} {b}"
            );
        }
        let int8 = TensorF32::from_slice_with(&values, Codec::Int8);
        assert_eq!((int8.codec(), int8.packed_len()), (Codec::Int8, 1000));
        for (a, b) in values.iter().zip(int8.values()) {
            assert!((a - b).abs() <= max / 254.0 * 1.0001, "{a} {b}");
        }
        // The largest magnitude is exact in int8 (q = ±127).
        let i = values.iter().position(|v| v.abs() == max).unwrap();
        assert_eq!(int8.to_vec()[i].abs(), max);
        assert!(int8.validate().is_ok() && f16.validate().is_ok());
        assert_eq!(int8.values().len(), 1000);
        // All zeros in int8: scale 0, values 0.
        assert_eq!(
            TensorF32::from_slice_with(&[0.0; 3], Codec::Int8).to_vec(),
            [0.0; 3]
        );
    }

    #[test]
    fn what_a_lossy_codec_cannot_carry_goes_as_f32() {
        for codec in [Codec::F16, Codec::Int8] {
            let t = TensorF32::from_slice_with(&[1.0, f32::NAN], codec);
            assert_eq!(t.codec(), Codec::F32);
            assert_eq!(t.first_non_finite(), Some(1));
        }
        let big = TensorF32::from_slice_with(&[1e6, 1.0], Codec::F16);
        assert_eq!((big.codec(), big.to_vec()), (Codec::F32, vec![1e6, 1.0]));
        assert_eq!(
            TensorF32::from_slice_with(&[1e6, 1.0], Codec::Int8).codec(),
            Codec::Int8
        );
    }

    #[test]
    fn a_bad_int8_scale_or_length_is_refused_after_decoding() {
        for scale in [f32::NAN, f32::INFINITY, -1.0] {
            let t = TensorF32 {
                shape: vec![2],
                encoding: Encoding::Int8 { scale },
                bytes: vec![1, 2],
            };
            let back: TensorF32 =
                postcard::from_bytes(&postcard::to_allocvec(&t).unwrap()).unwrap();
            assert!(matches!(back.validate(), Err(DecodeError::TensorScale(_))));
        }
        let t = TensorF32 {
            shape: vec![2],
            encoding: Encoding::F16,
            bytes: vec![0; 3],
        };
        assert!(matches!(t.validate(), Err(DecodeError::TensorShape { .. })));
    }

    #[test]
    fn codec_names_parse_and_print_back() {
        for codec in [Codec::F32, Codec::F16, Codec::Int8] {
            assert_eq!(codec.name().parse::<Codec>(), Ok(codec));
        }
        assert!(
            "bf16"
                .parse::<Codec>()
                .unwrap_err()
                .to_string()
                .contains("f32, f16, int8")
        );
    }
}
