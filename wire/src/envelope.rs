//! The frame around every binary payload.
//!
//! Layout: `MAGIC (4 bytes) | version (1) | kind (1) | postcard body | CRC-32/ISO-HDLC of all
//! previous bytes (4, little endian)`.
//!
//! [`decode_frame`] checks, in this order: the length (at least [`HEADER_LEN`] +
//! [`TRAILER_LEN`] bytes, at most [`MAX_MESSAGE_BYTES`]), the magic, the version, the CRC and
//! finally the kind byte. The magic and version come before the CRC so that foreign payloads and
//! payloads of another protocol version are reported as such rather than as damaged; the kind
//! comes after the CRC so that an unknown kind means a newer sender, not a flipped bit.

use serde::Deserialize;

use crate::error::DecodeError;
use crate::messages::{BackboneObject, Chunk, ClientUpdate, RoundTask, Sealed};
use crate::model::ModelRelease;

/// First four bytes of every fedge binary payload.
pub const MAGIC: [u8; 4] = *b"FDGE";
/// Protocol version this crate writes by default.
pub const PROTOCOL_VERSION: u8 = 10;
/// The previous protocol version, which this crate still reads and writes on request
/// ([`encode_as`]) so that devices of both versions share a federation during an upgrade
/// (`crate::compat`).
pub const PREVIOUS_PROTOCOL_VERSION: u8 = 9;
/// Largest framed message (after reassembly) that decoding accepts: 64 MiB.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Bytes before the body: magic, version and kind.
pub const HEADER_LEN: usize = MAGIC.len() + 2;
/// Bytes after the body: the CRC.
pub const TRAILER_LEN: usize = 4;

/// The CRC used by the envelope (CRC-32/ISO-HDLC, the one of zlib and Ethernet).
/// Slice-by-16 tables: every frame (a whole update, a whole task) is checksummed on both ends;
/// 2.3 GiB/s against 0.37 GiB/s for the byte-wise table (`cargo bench --workspace --bench crc`).
const CRC32: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

/// Message kinds, as the byte after the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// [`RoundTask`].
    RoundTask = 1,
    /// [`ClientUpdate`].
    ClientUpdate = 2,
    /// [`Chunk`] of a larger frame.
    Chunk = 3,
    /// [`Sealed`]: an inner frame with HMAC tags.
    Sealed = 4,
    /// [`ModelRelease`]: a released global head.
    Model = 5,
    /// [`BackboneObject`]: a backbone the federation distributes (protocol 8).
    Backbone = 6,
}

impl TryFrom<u8> for Kind {
    type Error = DecodeError;

    /// Reads a kind byte; an unknown byte is [`DecodeError::UnknownKind`].
    fn try_from(byte: u8) -> Result<Self, Self::Error> {
        match byte {
            1 => Ok(Self::RoundTask),
            2 => Ok(Self::ClientUpdate),
            3 => Ok(Self::Chunk),
            4 => Ok(Self::Sealed),
            5 => Ok(Self::Model),
            6 => Ok(Self::Backbone),
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}

/// A decoded binary message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Coordinator to devices.
    RoundTask(RoundTask),
    /// Device to coordinator.
    ClientUpdate(ClientUpdate),
    /// Part of a larger frame; feed it to a `crate::Reassembler`.
    Chunk(Chunk),
    /// An authenticated inner frame; open it with [`Sealed::open`], then decode the inner
    /// frame.
    Sealed(Sealed),
    /// A released global head; check it with [`ModelRelease::verify`].
    Model(ModelRelease),
    /// A backbone the federation distributes; check its digest against the one a round task
    /// names ([`BackboneObject::reference`]).
    Backbone(BackboneObject),
}

impl Message {
    /// The kind byte this message is framed with.
    pub fn kind(&self) -> Kind {
        match self {
            Self::RoundTask(_) => Kind::RoundTask,
            Self::ClientUpdate(_) => Kind::ClientUpdate,
            Self::Chunk(_) => Kind::Chunk,
            Self::Sealed(_) => Kind::Sealed,
            Self::Model(_) => Kind::Model,
            Self::Backbone(_) => Kind::Backbone,
        }
    }
}

/// A checked frame whose body has not been decoded yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Protocol version: [`PROTOCOL_VERSION`] or [`PREVIOUS_PROTOCOL_VERSION`].
    pub version: u8,
    /// Message kind.
    pub kind: Kind,
    /// Postcard body.
    pub body: &'a [u8],
}

/// Frames a message.
///
/// The result may exceed [`MAX_MESSAGE_BYTES`] for huge tensors, in which case [`decode`]
/// refuses it; callers publishing it should split it with `crate::split_into_chunks` anyway.
pub fn encode(message: &Message) -> Vec<u8> {
    // A sealed frame speaks the version of the frame it wraps.
    let version = match message {
        Message::Sealed(sealed) => frame_version(&sealed.inner),
        _ => PROTOCOL_VERSION,
    };
    encode_as(message, version)
}

/// The version byte of a frame this crate reads, else [`PROTOCOL_VERSION`].
pub fn frame_version(frame: &[u8]) -> u8 {
    match frame.get(MAGIC.len()) {
        Some(&v) if frame.starts_with(&MAGIC) && accepted(v) => v,
        _ => PROTOCOL_VERSION,
    }
}

fn accepted(version: u8) -> bool {
    version == PROTOCOL_VERSION || version == PREVIOUS_PROTOCOL_VERSION
}

/// Frames a message in protocol `version`: [`PREVIOUS_PROTOCOL_VERSION`] writes releases
/// without what protocol 10 added (the head's tail, `crate::compat::v9`); any other value
/// writes [`PROTOCOL_VERSION`]. The other kinds' bodies are the same in both.
pub fn encode_as(message: &Message, version: u8) -> Vec<u8> {
    let version = if accepted(version) {
        version
    } else {
        PROTOCOL_VERSION
    };
    // Room for the header, the trailer, the bulk of the body and a few varints and strings.
    let bulk = match message {
        Message::RoundTask(task) => task.params.packed_len() + 64 * task.selected.len(),
        Message::ClientUpdate(update) => update.delta.packed_len(),
        Message::Chunk(chunk) => chunk.data.len(),
        Message::Sealed(sealed) => sealed.inner.len() + 48 * sealed.tags.len(),
        Message::Model(model) => model.params.packed_len() + 32 * model.classes.len(),
        Message::Backbone(backbone) => backbone.onnx.len() + backbone.card.len(),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + bulk + 128 + TRAILER_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(version);
    out.push(message.kind() as u8);
    let previous = version == PREVIOUS_PROTOCOL_VERSION;
    let body = match message {
        Message::Model(model) if previous => {
            postcard::to_extend(&crate::compat::v9::ModelRelease::from(model.clone()), out)
        }
        Message::RoundTask(task) => postcard::to_extend(task, out),
        Message::ClientUpdate(update) => postcard::to_extend(update, out),
        Message::Chunk(chunk) => postcard::to_extend(chunk, out),
        Message::Sealed(sealed) => postcard::to_extend(sealed, out),
        Message::Model(model) => postcard::to_extend(model, out),
        Message::Backbone(backbone) => postcard::to_extend(backbone, out),
    };
    // Postcard only fails to serialise into a growable vector for sequences of unknown length,
    // which derived `Serialize` implementations never produce.
    let mut out = body.expect("postcard serialisation of a message into a Vec cannot fail");
    let crc = CRC32.checksum(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A feature summary's tensors hold what their shapes say (its sizes against the head are
/// the receiver's check: `FeatureSummary::check`).
fn validate_summary(summary: &crate::FeatureSummary) -> Result<(), DecodeError> {
    summary.means.validate()?;
    summary.within.validate()
}

/// Checks magic, version, kind and CRC, without decoding the body.
///
/// The checks run in the order given in the module documentation; the first that fails is
/// reported. Never panics.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge(bytes.len()));
    }
    let (covered, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let (header, body) = covered.split_at(HEADER_LEN);
    if header[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = header[MAGIC.len()];
    if !accepted(version) {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let expected = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if CRC32.checksum(covered) != expected {
        return Err(DecodeError::BadChecksum);
    }
    let kind = Kind::try_from(header[MAGIC.len() + 1])?;
    Ok(Frame {
        version,
        kind,
        body,
    })
}

/// Decodes a framed message; never panics.
///
/// Besides the checks of [`decode_frame`], the body must be a postcard encoding of the
/// announced kind with no trailing bytes, and every tensor must match its shape.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    decode_checked(decode_frame(bytes)?)
}

/// Decodes the body of a frame [`decode_frame`] already checked, so a receiver that looks at
/// the kind first (to refuse a kind without decoding it) checks the CRC only once.
pub fn decode_checked(frame: Frame<'_>) -> Result<Message, DecodeError> {
    let previous = frame.version == PREVIOUS_PROTOCOL_VERSION;
    match frame.kind {
        Kind::RoundTask => {
            let task: RoundTask = decode_body(frame.body)?;
            task.params.validate()?;
            for tensor in [&task.insight, &task.prototypes].into_iter().flatten() {
                tensor.validate()?;
            }
            if let Some(pooled) = &task.pooled {
                validate_summary(pooled)?;
            }
            Ok(Message::RoundTask(task))
        }
        Kind::ClientUpdate => {
            let update: ClientUpdate = decode_body(frame.body)?;
            update.delta.validate()?;
            for stats in [&update.class_stats, &update.prototypes]
                .into_iter()
                .flatten()
            {
                stats.means.validate()?;
            }
            if let Some(features) = &update.features {
                validate_summary(features)?;
            }
            Ok(Message::ClientUpdate(update))
        }
        Kind::Chunk => Ok(Message::Chunk(decode_body(frame.body)?)),
        Kind::Sealed => Ok(Message::Sealed(decode_body(frame.body)?)),
        Kind::Model => {
            let model: ModelRelease = if previous {
                decode_body::<crate::compat::v9::ModelRelease>(frame.body)?.into()
            } else {
                decode_body(frame.body)?
            };
            model.params.validate()?;
            if let Some(pooled) = &model.pooled {
                validate_summary(pooled)?;
            }
            Ok(Message::Model(model))
        }
        Kind::Backbone => Ok(Message::Backbone(decode_body(frame.body)?)),
    }
}

/// Decodes a whole postcard body, refusing bytes left over after the value.
fn decode_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed(format!(
            "{} trailing bytes after the body",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::messages::{LocalMetrics, Objective, TrainParams};
    use crate::tensor::TensorF32;

    fn round_task() -> RoundTask {
        RoundTask {
            pooled: None,
            federation: "plant-7".into(),
            run: 0x0123_4567_89ab_cdef,
            round: 7,
            selected: vec!["cam-01".into(), "cam-02".into(), "pi_3".into()],
            classes: vec!["ok".into(), "scratch".into()],
            params: TensorF32::new(vec![2, 3], &[0.5, -1.0, 2.25, 0.0, 1e-3, -7.0]).unwrap(),
            train: TrainParams {
                objective: Objective::FedProx,
                ..TrainParams::default()
            },
            deadline_ms: 60_000,
            insight: None,
            prototypes: None,
            backbone: Some(crate::BackboneRef {
                name: "digits-conv".into(),
                sha256: [0x5a; 32],
            }),
        }
    }

    fn client_update() -> ClientUpdate {
        ClientUpdate {
            features: None,
            run: 0x0123_4567_89ab_cdef,
            round: 7,
            client_id: "cam-01".into(),
            seq: 42,
            num_samples: 512,
            delta: TensorF32::from_slice(&[0.125, -0.25, 3.0]),
            metrics: LocalMetrics {
                train_loss: 0.7,
                val_accuracy: 0.81,
                val_samples: 64,
                train_seconds: 3.5,
            },
            class_stats: None,
            prototypes: None,
        }
    }

    fn chunk() -> Chunk {
        Chunk {
            message_id: u64::MAX,
            index: 2,
            count: 5,
            total_len: 1000,
            data: vec![1, 2, 3, 255],
            tag: Some([0xab; 32]),
        }
    }

    fn all_messages() -> Vec<Message> {
        vec![
            Message::RoundTask(round_task()),
            Message::ClientUpdate(client_update()),
            Message::Chunk(chunk()),
            Message::Sealed(crate::messages::Sealed::new(
                encode(&Message::ClientUpdate(client_update())),
                &[("cam-01", &crate::auth::DeviceKey::from_bytes([9; 32]))],
            )),
            Message::Backbone(BackboneObject {
                card: "name = \"digits-conv\"\nfile = \"digits-conv.onnx\"\n".into(),
                name: "digits-conv".into(),
                onnx: vec![8, 1, 0, 255],
            }),
        ]
    }

    /// Frames an arbitrary body with a valid header and CRC.
    fn frame_body(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(PROTOCOL_VERSION);
        out.push(kind);
        out.extend_from_slice(body);
        let crc = CRC32.checksum(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn every_message_kind_survives_a_round_trip() {
        for message in all_messages() {
            let bytes = encode(&message);
            assert_eq!(decode(&bytes).unwrap(), message);
            assert_eq!(decode_frame(&bytes).unwrap().kind, message.kind());
        }
    }

    #[test]
    fn the_frame_starts_with_magic_version_and_kind_and_ends_with_the_crc() {
        let bytes = encode(&Message::ClientUpdate(client_update()));
        assert_eq!(&bytes[..4], b"FDGE");
        assert_eq!(bytes[4], PROTOCOL_VERSION);
        assert_eq!(bytes[5], Kind::ClientUpdate as u8);
        let (covered, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(crc, crc32_reference(covered).to_le_bytes());
    }

    /// A bitwise CRC-32/ISO-HDLC, independent of the `crc` crate.
    fn crc32_reference(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn the_crc_matches_the_standard_check_value() {
        assert_eq!(CRC32.checksum(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_reference(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_chunk_body_is_the_postcard_encoding_of_the_chunk() {
        let c = chunk();
        let bytes = encode(&Message::Chunk(c.clone()));
        let frame = decode_frame(&bytes).unwrap();
        assert_eq!(frame.body, postcard::to_allocvec(&c).unwrap().as_slice());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        for message in all_messages() {
            let bytes = encode(&message);
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut damaged = bytes.clone();
                    damaged[i] ^= 1 << bit;
                    assert!(
                        decode(&damaged).is_err(),
                        "flip of bit {bit} of byte {i} undetected"
                    );
                }
            }
        }
    }

    #[test]
    fn every_change_of_a_single_byte_is_detected() {
        for message in all_messages() {
            let bytes = encode(&message);
            for i in 0..bytes.len() {
                for value in 0..=255u8 {
                    if value == bytes[i] {
                        continue;
                    }
                    let mut damaged = bytes.clone();
                    damaged[i] = value;
                    assert!(
                        decode(&damaged).is_err(),
                        "byte {i} set to {value} undetected"
                    );
                }
            }
        }
    }

    #[test]
    fn every_truncation_and_extension_is_detected() {
        for message in all_messages() {
            let bytes = encode(&message);
            for len in 0..bytes.len() {
                assert!(
                    decode(&bytes[..len]).is_err(),
                    "prefix of {len} bytes accepted"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode(&longer).is_err());
        }
    }

    #[test]
    fn the_checks_report_the_expected_errors() {
        let good = encode(&Message::Chunk(chunk()));
        assert_eq!(decode(&good[..9]), Err(DecodeError::TooShort(9)));
        assert_eq!(decode(&[]), Err(DecodeError::TooShort(0)));

        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad), Err(DecodeError::BadMagic));

        let mut bad = good.clone();
        bad[4] = PROTOCOL_VERSION + 1;
        assert_eq!(
            decode(&bad),
            Err(DecodeError::UnsupportedVersion(PROTOCOL_VERSION + 1))
        );

        let mut bad = good.clone();
        bad[5] = 9;
        assert_eq!(decode(&bad), Err(DecodeError::BadChecksum));

        let last = good.len() - 1;
        let mut bad = good.clone();
        bad[last] ^= 0x80;
        assert_eq!(decode(&bad), Err(DecodeError::BadChecksum));

        let body = decode_frame(&good).unwrap().body.to_vec();
        assert_eq!(
            decode(&frame_body(9, &body)),
            Err(DecodeError::UnknownKind(9))
        );
        assert_eq!(
            decode(&frame_body(0, &body)),
            Err(DecodeError::UnknownKind(0))
        );
    }

    #[test]
    fn an_oversized_payload_is_refused_before_anything_else() {
        let huge = vec![0u8; MAX_MESSAGE_BYTES + 1];
        assert_eq!(
            decode(&huge),
            Err(DecodeError::TooLarge(MAX_MESSAGE_BYTES + 1))
        );
    }

    #[test]
    fn an_empty_body_is_malformed() {
        let bytes = frame_body(Kind::RoundTask as u8, &[]);
        assert_eq!(bytes.len(), 10);
        assert!(matches!(decode(&bytes), Err(DecodeError::Malformed(_))));
        assert!(decode_frame(&bytes).unwrap().body.is_empty());
    }

    #[test]
    fn trailing_bytes_after_the_body_are_refused() {
        let mut body = postcard::to_allocvec(&client_update()).unwrap();
        body.push(0);
        let bytes = frame_body(Kind::ClientUpdate as u8, &body);
        assert!(matches!(decode(&bytes), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn a_body_of_another_kind_is_refused() {
        let body = postcard::to_allocvec(&chunk()).unwrap();
        assert!(decode(&frame_body(Kind::RoundTask as u8, &body)).is_err());
        let body = postcard::to_allocvec(&round_task()).unwrap();
        assert!(decode(&frame_body(Kind::ClientUpdate as u8, &body)).is_err());
    }

    #[test]
    fn a_tensor_that_does_not_match_its_shape_is_refused() {
        // Build a client update whose delta claims shape [4] but carries three values, by
        // patching the postcard body of a valid one: the shape is the first thing after the
        // fixed fields, so re-encode by hand.
        let update = client_update();
        let mut body = Vec::new();
        body.extend(postcard::to_allocvec(&update.run).unwrap());
        body.extend(postcard::to_allocvec(&update.round).unwrap());
        body.extend(postcard::to_allocvec(&update.client_id).unwrap());
        body.extend(postcard::to_allocvec(&update.seq).unwrap());
        body.extend(postcard::to_allocvec(&update.num_samples).unwrap());
        body.extend(postcard::to_allocvec(&vec![4u32]).unwrap());
        body.push(0); // encoding: f32
        let bytes: Vec<u8> = update.delta.values().flat_map(f32::to_le_bytes).collect();
        body.extend(postcard::to_allocvec(&bytes).unwrap());
        body.extend(postcard::to_allocvec(&update.metrics).unwrap());
        body.extend(postcard::to_allocvec(&update.class_stats).unwrap());
        body.extend(postcard::to_allocvec(&update.prototypes).unwrap());
        body.extend(postcard::to_allocvec(&update.features).unwrap());
        let bytes = frame_body(Kind::ClientUpdate as u8, &body);
        assert_eq!(
            decode(&bytes),
            Err(DecodeError::TensorShape {
                shape: vec![4],
                bytes: 12
            })
        );

        let mut task = round_task();
        task.params = TensorF32::from_slice(&[1.0]);
        let mut body = postcard::to_allocvec(&task).unwrap();
        // The body of a task ends with the train params and the deadline; the tensor's shape
        // is right after the selected ids (then its encoding, f32 = 0, and 4 bytes). Patch its
        // single dimension from 1 to 2.
        let shape_at = body.windows(4).position(|w| w == [1, 1, 0, 4]).unwrap();
        body[shape_at + 1] = 2;
        let bytes = frame_body(Kind::RoundTask as u8, &body);
        assert_eq!(
            decode(&bytes),
            Err(DecodeError::TensorShape {
                shape: vec![2],
                bytes: 4
            })
        );
    }

    #[test]
    fn non_finite_values_survive_decoding_for_the_receiver_to_judge() {
        let mut update = client_update();
        update.delta = TensorF32::from_slice(&[1.0, f32::NAN]);
        let Message::ClientUpdate(back) = decode(&encode(&Message::ClientUpdate(update))).unwrap()
        else {
            panic!("wrong kind");
        };
        assert_eq!(back.delta.first_non_finite(), Some(1));
    }

    fn arb_tensor() -> impl Strategy<Value = TensorF32> {
        prop::collection::vec(any::<f32>(), 0..64).prop_map(|v| TensorF32::from_slice(&v))
    }

    proptest! {
        #[test]
        fn decode_of_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_of_arbitrary_bytes_after_a_valid_header_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut framed = MAGIC.to_vec();
            framed.push(PROTOCOL_VERSION);
            framed.extend_from_slice(&bytes);
            let _ = decode(&framed);
        }

        #[test]
        fn decode_of_an_arbitrary_body_with_a_valid_envelope_never_panics(
            kind in prop_oneof![1u8..=4, any::<u8>()],
            body in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let framed = frame_body(kind, &body);
            prop_assert!(decode_frame(&framed).is_ok() || !(1..=4).contains(&kind));
            let _ = decode(&framed);
        }

        #[test]
        fn decode_of_a_damaged_valid_body_never_panics(
            which in 0usize..4,
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let message = &all_messages()[which];
            let mut body = decode_frame(&encode(message)).unwrap().body.to_vec();
            for (at, value) in edits {
                let i = at.index(body.len());
                body[i] = value;
            }
            let _ = decode(&frame_body(message.kind() as u8, &body));
        }

        #[test]
        fn arbitrary_updates_survive_a_round_trip(
            round in any::<u64>(),
            client_id in "[A-Za-z0-9_.-]{1,64}",
            seq in any::<u64>(),
            num_samples in any::<u32>(),
            delta in arb_tensor(),
            train_loss in any::<f32>(),
        ) {
            let message = Message::ClientUpdate(ClientUpdate {
                features: None,
                run: round.rotate_left(7),
                round,
                client_id,
                seq,
                num_samples,
                delta,
                metrics: LocalMetrics { train_loss, ..LocalMetrics::default() },
                class_stats: None,
                prototypes: None,
            });
            let bytes = encode(&message);
            let back = decode(&bytes).unwrap();
            // NaN != NaN, so compare encodings instead of values.
            prop_assert_eq!(encode(&back), bytes);
        }

        #[test]
        fn arbitrary_tasks_survive_a_round_trip(
            round in any::<u64>(),
            selected in prop::collection::vec("\\PC{0,20}", 0..8),
            params in arb_tensor(),
            local_epochs in any::<u32>(),
            learning_rate in any::<f32>(),
            deadline_ms in any::<u64>(),
        ) {
            let message = Message::RoundTask(RoundTask {
                pooled: None,
                federation: selected.first().cloned().unwrap_or_default(),
                run: round.rotate_left(7),
                round,
                classes: selected.clone(),
                selected,
                params,
                train: TrainParams { local_epochs, learning_rate, ..TrainParams::default() },
                deadline_ms,
                insight: None,
                prototypes: None,
                backbone: None,
            });
            let bytes = encode(&message);
            let back = decode(&bytes).unwrap();
            // NaN != NaN, so compare encodings instead of values.
            prop_assert_eq!(encode(&back), bytes);
        }
    }
}
