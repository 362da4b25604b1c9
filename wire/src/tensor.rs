//! A dense f32 tensor as it travels: shape plus little-endian bytes.

use serde::{Deserialize, Serialize};

use crate::error::DecodeError;

/// A dense row-major f32 tensor.
///
/// The values are kept as little-endian bytes so that encoding is one copy and decoding is
/// checked once (length against shape) instead of per element.
/// A tensor whose shape is empty is a scalar and holds exactly one value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorF32 {
    shape: Vec<u32>,
    #[serde(with = "serde_bytes")]
    le_bytes: Vec<u8>,
}

/// Number of elements a tensor of `shape` holds, or `None` when it does not fit in a `usize`.
fn element_count(shape: &[u32]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &dim| {
        acc.checked_mul(usize::try_from(dim).ok()?)
    })
}

/// The little-endian bytes of `values`, in order.
fn to_le_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

impl TensorF32 {
    /// Builds a tensor; fails when `values.len()` is not the product of `shape`.
    ///
    /// A shape whose product overflows a `usize` is an error as well.
    pub fn new(shape: Vec<u32>, values: &[f32]) -> Result<Self, DecodeError> {
        if element_count(&shape) != Some(values.len()) {
            return Err(DecodeError::TensorShape {
                shape,
                bytes: values.len().saturating_mul(4),
            });
        }
        Ok(Self {
            shape,
            le_bytes: to_le_bytes(values),
        })
    }

    /// A rank-1 tensor holding `values`.
    ///
    /// # Panics
    ///
    /// Panics when `values` holds more than `u32::MAX` elements, which no shape can describe.
    pub fn from_slice(values: &[f32]) -> Self {
        let len =
            u32::try_from(values.len()).expect("a rank-1 tensor holds at most u32::MAX values");
        Self {
            shape: vec![len],
            le_bytes: to_le_bytes(values),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[u32] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.le_bytes.len() / 4
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.le_bytes.is_empty()
    }

    /// Decoded values.
    pub fn to_vec(&self) -> Vec<f32> {
        self.values().collect()
    }

    /// The raw little-endian bytes of the values.
    pub fn as_le_bytes(&self) -> &[u8] {
        &self.le_bytes
    }

    /// Checks the invariant (byte length = 4 x product of shape) after deserialisation.
    ///
    /// A shape whose byte size overflows a `usize` is reported as a mismatch; this never
    /// panics.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let expected = element_count(&self.shape).and_then(|n| n.checked_mul(4));
        if expected == Some(self.le_bytes.len()) {
            Ok(())
        } else {
            Err(DecodeError::TensorShape {
                shape: self.shape.clone(),
                bytes: self.le_bytes.len(),
            })
        }
    }

    /// Index of the first NaN or infinite value, if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        self.values().position(|value| !value.is_finite())
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
    fn values(&self) -> impl Iterator<Item = f32> + '_ {
        self.le_bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

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
        assert_eq!(t.as_le_bytes(), &[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
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
        assert_eq!(bytes, vec![1, 1, 4, 0, 0, 0x80, 0x3f]);
    }

    #[test]
    fn validate_rejects_a_deserialised_tensor_whose_bytes_do_not_match_its_shape() {
        // Shape [2] but only one value's worth of bytes.
        let bytes = [1u8, 2, 4, 0, 0, 0x80, 0x3f];
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
            le_bytes: vec![0; 8],
        };
        assert!(t.validate().is_err());
        let t = TensorF32 {
            shape: vec![1 << 31, 1 << 31],
            le_bytes: vec![],
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
    }
}
