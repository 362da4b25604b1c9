//! Decoding errors.

/// Why bytes could not be turned into a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the fixed header and trailer.
    #[error("payload too short: {0} bytes")]
    TooShort(usize),
    /// Larger than `crate::MAX_MESSAGE_BYTES`.
    #[error("payload too large: {0} bytes")]
    TooLarge(usize),
    /// Not a fedge payload.
    #[error("bad magic")]
    BadMagic,
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// A plain message where the receiver requires a sealed one (raised by receivers that
    /// check the kind with `crate::decode_frame` first, never by `crate::decode`).
    #[error("message without an authentication tag")]
    Unauthenticated,
    /// Unknown message kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// CRC mismatch: the bytes were damaged.
    #[error("checksum mismatch")]
    BadChecksum,
    /// The body is not a valid postcard encoding of the announced kind.
    #[error("malformed body: {0}")]
    Malformed(String),
    /// A tensor whose byte length does not match its shape.
    #[error("tensor shape {shape:?} does not match {bytes} bytes")]
    TensorShape {
        /// Declared shape.
        shape: Vec<u32>,
        /// Byte length found.
        bytes: usize,
    },
    /// An int8 tensor whose scale is not a finite non-negative number.
    #[error("tensor int8 scale {0} is not a finite non-negative number")]
    TensorScale(String),
    /// A chunk whose header is inconsistent.
    #[error("bad chunk: {0}")]
    BadChunk(&'static str),
}

/// A name outside a closed set of values (an objective, a codec, a strategy …), with the names
/// that are valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {got:?}; valid values: {}", valid.join(", "))]
pub struct UnknownName {
    /// What was being named (`objective`, `codec`, …).
    pub kind: &'static str,
    /// The name given.
    pub got: String,
    /// Every valid name.
    pub valid: Vec<&'static str>,
}

impl UnknownName {
    /// `got` is not one of `valid`.
    pub fn new(
        kind: &'static str,
        got: &str,
        valid: impl IntoIterator<Item = &'static str>,
    ) -> Self {
        Self {
            kind,
            got: got.to_owned(),
            valid: valid.into_iter().collect(),
        }
    }
}
