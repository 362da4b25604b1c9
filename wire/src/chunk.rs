//! Splitting frames larger than a broker's packet limit, and putting them back together.
//!
//! A chunk is itself a framed message of kind `crate::Kind::Chunk`, so every piece carries
//! its own CRC. The reassembler is sans-IO: time is passed in as milliseconds.

use std::collections::{BTreeMap, HashMap};

use crate::auth::DeviceKey;
use crate::envelope::{HEADER_LEN, Message, TRAILER_LEN, encode_as, frame_version};
use crate::error::DecodeError;
use crate::messages::{Chunk, TAG_LEN};

/// Default largest MQTT payload fedge publishes: 128 KiB.
pub const DEFAULT_MAX_PACKET: usize = 128 * 1024;
/// Default time a partial message waits for its missing chunks.
pub const DEFAULT_REASSEMBLY_TIMEOUT_MS: u64 = 30_000;
/// Default number of partial frames a [`Reassembler`] holds at once.
pub const DEFAULT_MAX_PENDING: usize = 64;
/// Partial frames one sender may have in a [`Reassembler`] at once: a device sends one update
/// at a time; two leave room for a retry overlapping an expiring stream.
pub const MAX_PENDING_PER_SENDER: usize = 2;

/// Largest framed chunk minus its data: the envelope plus the largest postcard header of a
/// [`Chunk`] (varints of at most 10 bytes for the message id, 5 for each of index, count and
/// total length, and 10 for the data length) and its optional tag (1 + 32 bytes).
const CHUNK_OVERHEAD: usize = HEADER_LEN + TRAILER_LEN + 10 + 3 * 5 + 10 + 1 + TAG_LEN;

/// Fewest data bytes a chunk carries, whatever the packet limit.
///
/// With a `max_packet` below `CHUNK_OVERHEAD + MIN_CHUNK_DATA` (109 bytes), which no real
/// broker imposes, the pieces are larger than `max_packet`: splitting into ever smaller pieces
/// would not make them fit anyway.
const MIN_CHUNK_DATA: usize = 64;

/// Returns `frame` itself when it fits in `max_packet` bytes, else the framed chunks (each at
/// most `max_packet` bytes) that a [`Reassembler`] turns back into `frame`.
///
/// Every chunk carries at least 64 data bytes, so with a `max_packet` under 109 bytes the
/// chunks are larger than `max_packet`.
///
/// # Panics
///
/// Panics when a frame that does not fit in `max_packet` is longer than `u32::MAX` bytes, which
/// a chunk header cannot describe (and is far beyond `crate::MAX_MESSAGE_BYTES`).
pub fn split_into_chunks(frame: Vec<u8>, message_id: u64, max_packet: usize) -> Vec<Vec<u8>> {
    split_into_tagged_chunks(frame, message_id, max_packet, None)
}

/// [`split_into_chunks`], each chunk tagged by `signer` (a device and its key) when given, so
/// that a receiver holding the key refuses forged chunks one by one.
///
/// # Panics
///
/// As [`split_into_chunks`].
pub fn split_into_tagged_chunks(
    frame: Vec<u8>,
    message_id: u64,
    max_packet: usize,
    signer: Option<(&str, &DeviceKey)>,
) -> Vec<Vec<u8>> {
    if frame.len() <= max_packet {
        return vec![frame];
    }
    let version = frame_version(&frame);
    let total_len = u32::try_from(frame.len()).expect("a chunked frame is at most u32::MAX bytes");
    let data_len = max_packet
        .saturating_sub(CHUNK_OVERHEAD)
        .max(MIN_CHUNK_DATA);
    let count = u32::try_from(frame.len().div_ceil(data_len))
        .expect("there are fewer chunks than bytes, and the bytes fit in a u32");
    (0..count)
        .zip(frame.chunks(data_len))
        .map(|(index, data)| {
            let mut chunk = Chunk {
                message_id,
                index,
                count,
                total_len,
                data: data.to_vec(),
                tag: None,
            };
            if let Some((device, key)) = signer {
                chunk.tag = Some(key.chunk_tag(device, &chunk));
            }
            // Chunks speak the version of the frame they carry.
            encode_as(&Message::Chunk(chunk), version)
        })
        .collect()
}

/// Collects chunks per (sender, message id) until a frame is complete.
///
/// Memory is bounded: a frame may not announce more than `max_bytes` bytes, the chunks of a
/// frame may not add up to more than it announced, at most [`DEFAULT_MAX_PENDING`] partial
/// frames (see [`Reassembler::with_max_pending`]) are held at once, and at most
/// [`MAX_PENDING_PER_SENDER`] of them per sender. When a chunk of a new frame arrives and its
/// sender already holds its share, or the reassembler is full and the sender holds any, that
/// sender's oldest partial frame is dropped; when the reassembler is full and the sender holds
/// none, the partial frame whose first chunk arrived earliest is dropped. So
/// one sender flooding partial frames only ever evicts its own. Callers should call
/// [`Reassembler::expire`] periodically.
#[derive(Debug)]
pub struct Reassembler {
    timeout_ms: u64,
    max_bytes: usize,
    max_pending: usize,
    max_per_sender: usize,
    next_seq: u64,
    partial: HashMap<(String, u64), Partial>,
}

#[derive(Debug)]
struct Partial {
    /// When the first chunk arrived.
    started_ms: u64,
    /// Arrival order of the first chunk among all partial frames, to find the oldest.
    seq: u64,
    count: u32,
    total_len: u32,
    /// Received chunks by index.
    pieces: BTreeMap<u32, Vec<u8>>,
    /// Sum of the lengths of `pieces`.
    received_bytes: usize,
}

impl Partial {
    fn is_complete(&self) -> bool {
        self.pieces.len() == self.count as usize
    }

    /// Joins the pieces of a complete frame, checking their total length.
    fn join(self) -> Result<Vec<u8>, DecodeError> {
        if self.received_bytes != self.total_len as usize {
            return Err(DecodeError::BadChunk(
                "chunk lengths do not add up to the frame length",
            ));
        }
        let mut frame = Vec::with_capacity(self.received_bytes);
        for piece in self.pieces.into_values() {
            frame.extend_from_slice(&piece);
        }
        Ok(frame)
    }
}

impl Reassembler {
    /// A reassembler dropping partial frames older than `timeout_ms` and refusing frames
    /// larger than `max_bytes`.
    pub fn new(timeout_ms: u64, max_bytes: usize) -> Self {
        Self {
            timeout_ms,
            max_bytes,
            max_pending: DEFAULT_MAX_PENDING,
            max_per_sender: MAX_PENDING_PER_SENDER,
            next_seq: 0,
            partial: HashMap::new(),
        }
    }

    /// The same reassembler holding at most `max_pending` partial frames (at least one).
    pub fn with_max_pending(mut self, max_pending: usize) -> Self {
        self.set_max_pending(max_pending);
        self
    }

    /// Changes how many partial frames are held at once (at least one); a receiver that
    /// expects chunked messages from N senders at a time needs room for N.
    pub fn set_max_pending(&mut self, max_pending: usize) {
        self.max_pending = max_pending.max(1);
    }

    /// Adds a chunk from `sender` received at `now_ms`; returns the whole frame once the last
    /// missing chunk arrives. Duplicated chunks are ignored; inconsistent ones are an error.
    ///
    /// A chunk is refused, leaving any partial frame as it was, when its count is zero, its
    /// index is not below its count, it is empty or longer than its frame, its frame announces
    /// more than `max_bytes` ([`DecodeError::TooLarge`]), its count or total length differ from
    /// those of the first chunk of its frame, it has the index of an earlier chunk but other
    /// bytes, or the chunks received would exceed the announced length. When the last chunk
    /// arrives and the lengths do not add up, the partial frame is dropped and an error
    /// returned.
    pub fn push(
        &mut self,
        sender: &str,
        chunk: Chunk,
        now_ms: u64,
    ) -> Result<Option<Vec<u8>>, DecodeError> {
        let Chunk {
            message_id,
            index,
            count,
            total_len,
            data,
            tag: _,
        } = chunk;
        if count == 0 {
            return Err(DecodeError::BadChunk("chunk count is zero"));
        }
        if index >= count {
            return Err(DecodeError::BadChunk(
                "chunk index is not below the chunk count",
            ));
        }
        let total = total_len as usize;
        if total > self.max_bytes {
            return Err(DecodeError::TooLarge(total));
        }
        if data.is_empty() {
            return Err(DecodeError::BadChunk("empty chunk"));
        }
        if data.len() > total {
            return Err(DecodeError::BadChunk("chunk longer than its frame"));
        }

        let key = (sender.to_owned(), message_id);
        if let Some(partial) = self.partial.get_mut(&key) {
            if partial.count != count {
                return Err(DecodeError::BadChunk(
                    "chunk count differs from earlier chunks",
                ));
            }
            if partial.total_len != total_len {
                return Err(DecodeError::BadChunk(
                    "frame length differs from earlier chunks",
                ));
            }
            if let Some(earlier) = partial.pieces.get(&index) {
                return if *earlier == data {
                    Ok(None)
                } else {
                    Err(DecodeError::BadChunk(
                        "two different chunks with the same index",
                    ))
                };
            }
            if partial.received_bytes + data.len() > total {
                return Err(DecodeError::BadChunk("chunks longer than their frame"));
            }
            partial.received_bytes += data.len();
            partial.pieces.insert(index, data);
            if !partial.is_complete() {
                return Ok(None);
            }
            return match self.partial.remove(&key) {
                Some(partial) => partial.join().map(Some),
                None => Ok(None),
            };
        }

        let partial = Partial {
            started_ms: now_ms,
            seq: self.next_seq,
            count,
            total_len,
            received_bytes: data.len(),
            pieces: BTreeMap::from([(index, data)]),
        };
        if partial.is_complete() {
            return partial.join().map(Some);
        }
        self.next_seq += 1;
        let own = |r: &Self| r.partial.keys().filter(|(s, _)| s == sender).count();
        while own(self) >= self.max_per_sender {
            self.drop_oldest(Some(sender));
        }
        while self.partial.len() >= self.max_pending {
            // A full reassembler makes room from the sender's own frames first.
            let whose = (own(self) > 0).then_some(sender);
            self.drop_oldest(whose);
        }
        self.partial.insert(key, partial);
        Ok(None)
    }

    /// Drops the partial frame whose first chunk arrived earliest, among `sender`'s if given.
    fn drop_oldest(&mut self, sender: Option<&str>) {
        let oldest = self
            .partial
            .iter()
            .filter(|((s, _), _)| sender.is_none_or(|sender| s == sender))
            .min_by_key(|(_, partial)| partial.seq)
            .map(|(key, _)| key.clone());
        if let Some(key) = oldest {
            self.partial.remove(&key);
        }
    }

    /// Drops partial frames that timed out; returns how many were dropped.
    ///
    /// A partial frame times out once `timeout_ms` have passed since its first chunk arrived.
    /// A clock that went backwards times nothing out.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        self.expire_senders(now_ms).len()
    }

    /// Like [`Reassembler::expire`], returning the sender of each dropped frame (sorted, one
    /// entry per frame), so a receiver can count incomplete chunk streams per sender.
    pub fn expire_senders(&mut self, now_ms: u64) -> Vec<String> {
        let timeout_ms = self.timeout_ms;
        let mut dropped = Vec::new();
        self.partial.retain(|(sender, _), partial| {
            let keep = now_ms.saturating_sub(partial.started_ms) < timeout_ms;
            if !keep {
                dropped.push(sender.clone());
            }
            keep
        });
        dropped.sort();
        dropped
    }

    /// When the oldest partial frame times out, if any is waiting.
    pub fn next_expiry(&self) -> Option<u64> {
        self.partial
            .values()
            .map(|p| p.started_ms.saturating_add(self.timeout_ms))
            .min()
    }

    /// Number of frames waiting for chunks.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::envelope::{decode, encode};
    use crate::messages::{ClientUpdate, LocalMetrics};
    use crate::tensor::TensorF32;
    use crate::{Kind, MAX_MESSAGE_BYTES};

    const TIMEOUT: u64 = 1_000;

    fn reassembler() -> Reassembler {
        Reassembler::new(TIMEOUT, MAX_MESSAGE_BYTES)
    }

    /// A frame-like byte string whose bytes depend on their position.
    fn frame_of(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn as_chunk(piece: &[u8]) -> Chunk {
        match decode(piece) {
            Ok(Message::Chunk(chunk)) => chunk,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    fn chunks_of(frame: &[u8], max_packet: usize) -> Vec<Chunk> {
        let pieces = split_into_chunks(frame.to_vec(), 9, max_packet);
        assert!(pieces.len() > 1);
        pieces.iter().map(|p| as_chunk(p)).collect()
    }

    fn chunk(index: u32, count: u32, total_len: u32, data: &[u8]) -> Chunk {
        Chunk {
            message_id: 1,
            index,
            count,
            total_len,
            data: data.to_vec(),
            tag: None,
        }
    }

    #[test]
    fn a_frame_that_fits_is_returned_unchanged() {
        let frame = frame_of(100);
        assert_eq!(
            split_into_chunks(frame.clone(), 1, 100),
            vec![frame.clone()]
        );
        assert_eq!(split_into_chunks(frame.clone(), 1, 1000), vec![frame]);
        assert_eq!(split_into_chunks(Vec::new(), 1, 0), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn every_piece_fits_in_the_packet_limit_for_a_range_of_sizes() {
        let limits = [
            CHUNK_OVERHEAD + MIN_CHUNK_DATA,
            110,
            128,
            200,
            257,
            1000,
            4096,
        ];
        for max_packet in limits {
            for len in (0..3 * max_packet)
                .step_by(7)
                .chain([max_packet, max_packet + 1])
            {
                let frame = frame_of(len);
                let pieces = split_into_chunks(frame.clone(), u64::MAX, max_packet);
                let mut r = reassembler();
                let mut out = None;
                for piece in &pieces {
                    assert!(piece.len() <= max_packet, "{} > {max_packet}", piece.len());
                    if pieces.len() > 1 {
                        out = r.push("a", as_chunk(piece), 0).unwrap();
                    }
                }
                if pieces.len() == 1 {
                    assert_eq!(pieces[0], frame);
                } else {
                    assert_eq!(out, Some(frame), "len {len}, max_packet {max_packet}");
                }
                assert_eq!(r.pending(), 0);
            }
        }
    }

    #[test]
    fn the_largest_header_still_fits_in_the_packet_limit() {
        // Varints at their widest: the largest id and a frame length needing five bytes.
        let max_packet = 4096;
        let frame = frame_of(300_000);
        let key = DeviceKey::from_bytes([1; 32]);
        for signer in [None, Some(("a-device-id-of-some-length", &key))] {
            let slack = if signer.is_some() {
                20
            } else {
                20 + 1 + TAG_LEN
            };
            for piece in split_into_tagged_chunks(frame.clone(), u64::MAX, max_packet, signer) {
                assert!(piece.len() <= max_packet);
                // The conservative overhead wastes few bytes: all but the last piece are nearly
                // full.
                let c = as_chunk(&piece);
                assert!(piece.len() + slack > max_packet || c.index + 1 == c.count);
            }
        }
    }

    #[test]
    fn a_tiny_packet_limit_falls_back_to_the_minimum_chunk_size() {
        let frame = frame_of(1000);
        let pieces = split_into_chunks(frame.clone(), 3, 10);
        assert_eq!(pieces.len(), 1000usize.div_ceil(MIN_CHUNK_DATA));
        let mut r = reassembler();
        let mut out = None;
        for piece in &pieces {
            out = r.push("a", as_chunk(piece), 0).unwrap();
        }
        assert_eq!(out, Some(frame));
    }

    #[test]
    fn a_large_update_is_split_and_reassembled_into_the_same_message() {
        let values: Vec<f32> = (0..100_000).map(|i| i as f32 * 0.5).collect();
        let message = Message::ClientUpdate(ClientUpdate {
            features: None,
            run: 1,
            round: 3,
            client_id: "cam-01".into(),
            seq: 1,
            num_samples: 10,
            delta: TensorF32::from_slice(&values),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        });
        let frame = encode(&message);
        let pieces = split_into_chunks(frame, 77, DEFAULT_MAX_PACKET);
        assert_eq!(pieces.len(), 4);
        let mut r = Reassembler::new(DEFAULT_REASSEMBLY_TIMEOUT_MS, MAX_MESSAGE_BYTES);
        let mut out = None;
        for piece in pieces.iter().rev() {
            assert!(piece.len() <= DEFAULT_MAX_PACKET);
            assert_eq!(crate::decode_frame(piece).unwrap().kind, Kind::Chunk);
            out = r.push("cam-01", as_chunk(piece), 5).unwrap();
        }
        assert_eq!(decode(&out.unwrap()).unwrap(), message);
    }

    #[test]
    fn reordered_and_duplicated_chunks_reassemble_the_frame() {
        let frame = frame_of(1100);
        let chunks = chunks_of(&frame, 200);
        let n = chunks.len();
        // `i ↦ 3i + 1 mod n` is a permutation when 3 does not divide n.
        assert!(n >= 5 && !n.is_multiple_of(3), "{n} chunks");
        // Every chunk twice, in a scrambled order, the last one completing the frame.
        let order: Vec<usize> = (0..n).map(|i| (i * 3 + 1) % n).collect();
        let mut r = reassembler();
        for (step, &i) in order.iter().enumerate() {
            let out = r.push("a", chunks[i].clone(), step as u64).unwrap();
            if step + 1 < n {
                assert_eq!(out, None);
                assert_eq!(r.push("a", chunks[i].clone(), step as u64).unwrap(), None);
                assert_eq!(r.pending(), 1);
            } else {
                assert_eq!(out, Some(frame.clone()));
            }
        }
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn a_lost_chunk_never_completes_and_expire_drops_the_frame() {
        let frame = frame_of(1000);
        let chunks = chunks_of(&frame, 200);
        let mut r = reassembler();
        for c in chunks.iter().skip(1) {
            assert_eq!(r.push("a", c.clone(), 100).unwrap(), None);
        }
        assert_eq!(r.pending(), 1);
        assert_eq!(r.next_expiry(), Some(100 + TIMEOUT));
        assert_eq!(r.expire(100 + TIMEOUT - 1), 0);
        assert_eq!(r.pending(), 1);
        assert_eq!(r.expire(100 + TIMEOUT), 1);
        assert_eq!(r.pending(), 0);
        // The lost chunk arriving late starts a new frame that cannot complete.
        assert_eq!(r.push("a", chunks[0].clone(), 100 + TIMEOUT).unwrap(), None);
        assert_eq!(r.pending(), 1);
    }

    #[test]
    fn a_frame_times_out_from_its_first_chunk_even_while_chunks_keep_arriving() {
        let frame = frame_of(1000);
        let chunks = chunks_of(&frame, 200);
        let mut r = reassembler();
        r.push("a", chunks[0].clone(), 0).unwrap();
        r.push("a", chunks[1].clone(), TIMEOUT - 1).unwrap();
        assert_eq!(r.expire(TIMEOUT - 1), 0);
        assert_eq!(r.expire(TIMEOUT), 1);
        let mut out = None;
        for c in &chunks[2..] {
            out = r.push("a", c.clone(), TIMEOUT + 1).unwrap();
        }
        assert_eq!(out, None);
        assert_eq!(r.expire(u64::MAX), 1);
    }

    #[test]
    fn a_clock_going_backwards_expires_nothing() {
        let chunks = chunks_of(&frame_of(1000), 200);
        let mut r = reassembler();
        r.push("a", chunks[0].clone(), 5_000).unwrap();
        assert_eq!(r.expire(0), 0);
        assert_eq!(r.pending(), 1);
    }

    #[test]
    fn senders_and_message_ids_are_kept_apart() {
        let frame = frame_of(500);
        let chunks = chunks_of(&frame, 200);
        let mut r = reassembler();
        let mut other_id = chunks[0].clone();
        other_id.message_id += 1;
        r.push("a", chunks[0].clone(), 0).unwrap();
        r.push("b", chunks[0].clone(), 0).unwrap();
        r.push("a", other_id, 0).unwrap();
        assert_eq!(r.pending(), 3);
        let mut out = None;
        for c in &chunks[1..] {
            out = r.push("b", c.clone(), 0).unwrap();
        }
        assert_eq!(out, Some(frame));
        assert_eq!(r.pending(), 2);
    }

    #[test]
    fn inconsistent_chunk_headers_are_refused() {
        let mut r = Reassembler::new(TIMEOUT, 1000);
        let bad =
            |e: Result<Option<Vec<u8>>, DecodeError>| matches!(e, Err(DecodeError::BadChunk(_)));
        assert!(bad(r.push("a", chunk(0, 0, 10, &[1]), 0)));
        assert!(bad(r.push("a", chunk(3, 3, 10, &[1]), 0)));
        assert!(bad(r.push("a", chunk(0, 2, 10, &[]), 0)));
        assert!(bad(r.push("a", chunk(0, 2, 1, &[1, 2]), 0)));
        assert_eq!(
            r.push("a", chunk(0, 2, 1001, &[1]), 0),
            Err(DecodeError::TooLarge(1001))
        );
        assert_eq!(r.pending(), 0);

        assert_eq!(r.push("a", chunk(0, 3, 6, &[1, 2]), 0), Ok(None));
        assert!(bad(r.push("a", chunk(1, 4, 6, &[3, 4]), 0)));
        assert!(bad(r.push("a", chunk(1, 3, 7, &[3, 4]), 0)));
        assert!(bad(r.push("a", chunk(0, 3, 6, &[9, 9]), 0)));
        assert!(bad(r.push("a", chunk(1, 3, 6, &[3, 4, 5, 6, 7]), 0)));
        // The refused chunks left the partial frame untouched.
        assert_eq!(r.push("a", chunk(0, 3, 6, &[1, 2]), 0), Ok(None));
        assert_eq!(r.push("a", chunk(2, 3, 6, &[5, 6]), 0), Ok(None));
        assert_eq!(
            r.push("a", chunk(1, 3, 6, &[3, 4]), 0),
            Ok(Some(vec![1, 2, 3, 4, 5, 6]))
        );
    }

    #[test]
    fn chunks_shorter_than_their_frame_are_refused_when_the_last_arrives() {
        let mut r = reassembler();
        assert_eq!(r.push("a", chunk(0, 2, 6, &[1, 2]), 0), Ok(None));
        assert!(matches!(
            r.push("a", chunk(1, 2, 6, &[3]), 0),
            Err(DecodeError::BadChunk(_))
        ));
        assert_eq!(r.pending(), 0);
        assert!(matches!(
            r.push("a", chunk(0, 1, 6, &[3]), 0),
            Err(DecodeError::BadChunk(_))
        ));
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn a_single_chunk_frame_completes_at_once() {
        let mut r = reassembler().with_max_pending(1);
        r.push("a", chunk(0, 2, 2, &[1]), 0).unwrap();
        assert_eq!(
            r.push("b", chunk(0, 1, 2, &[7, 8]), 0),
            Ok(Some(vec![7, 8]))
        );
        // The pending frame of "a" was not evicted for it.
        assert_eq!(r.push("a", chunk(1, 2, 2, &[2]), 0), Ok(Some(vec![1, 2])));
    }

    #[test]
    fn a_full_reassembler_drops_its_oldest_partial_frame() {
        let mut r = reassembler();
        let sender = |id: u64| format!("s{id}");
        for id in 0..DEFAULT_MAX_PENDING as u64 + 10 {
            let mut c = chunk(0, 2, 2, &[1]);
            c.message_id = id;
            r.push(&sender(id), c, id).unwrap();
            assert!(r.pending() <= DEFAULT_MAX_PENDING);
        }
        assert_eq!(r.pending(), DEFAULT_MAX_PENDING);
        // Frame 9 was dropped: its second chunk starts a new frame, which in turn drops the
        // oldest frame left, frame 10.
        let second = |id| Chunk {
            message_id: id,
            ..chunk(1, 2, 2, &[2])
        };
        assert_eq!(r.push(&sender(9), second(9), 100), Ok(None));
        assert_eq!(r.pending(), DEFAULT_MAX_PENDING);
        // Frame 11 is still there and completes.
        assert_eq!(r.push(&sender(11), second(11), 100), Ok(Some(vec![1, 2])));
        assert_eq!(r.pending(), DEFAULT_MAX_PENDING - 1);
        // Frame 10 is gone: its second chunk starts a new frame, with room to spare.
        assert_eq!(r.push(&sender(10), second(10), 100), Ok(None));
        assert_eq!(r.pending(), DEFAULT_MAX_PENDING);
        assert_eq!(r.expire(100 + TIMEOUT), DEFAULT_MAX_PENDING);
    }

    #[test]
    fn a_flooding_sender_evicts_only_its_own_partial_frames() {
        let mut r = reassembler().with_max_pending(8);
        // Seven honest devices are halfway through their updates.
        for d in 0..7u64 {
            r.push(&format!("cam-{d}"), chunk(0, 2, 2, &[1]), d)
                .unwrap();
        }
        // One sender opens a thousand streams it never completes.
        for id in 0..1000u64 {
            let mut c = chunk(0, 3, 3, &[9]);
            c.message_id = 100 + id;
            r.push("mallory", c, 10).unwrap();
        }
        assert_eq!(r.pending(), 8, "seven honest frames and one of mallory's");
        // Every honest update still completes.
        for d in 0..7u64 {
            let done = r.push(&format!("cam-{d}"), chunk(1, 2, 2, &[2]), 20);
            assert_eq!(done, Ok(Some(vec![1, 2])), "cam-{d}");
        }
    }

    #[test]
    fn tagged_chunks_carry_the_signers_tag_and_reassemble_as_plain_ones() {
        let key = DeviceKey::from_bytes([3; 32]);
        let frame = frame_of(1000);
        let pieces = split_into_tagged_chunks(frame.clone(), 5, 300, Some(("cam-1", &key)));
        let mut r = reassembler();
        let mut out = None;
        for piece in &pieces {
            assert!(piece.len() <= 300, "{} bytes", piece.len());
            let c = as_chunk(piece);
            assert!(key.verify_chunk("cam-1", &c));
            out = r.push("cam-1", c, 0).unwrap();
        }
        assert_eq!(out, Some(frame));
    }

    fn arb_chunk() -> impl Strategy<Value = Chunk> {
        (
            0u64..4,
            0u32..6,
            0u32..6,
            0u32..40,
            prop::collection::vec(any::<u8>(), 0..12),
        )
            .prop_map(|(message_id, index, count, total_len, data)| Chunk {
                message_id,
                index,
                count,
                total_len,
                data,
                tag: None,
            })
    }

    proptest! {
        #[test]
        fn push_of_arbitrary_chunks_never_panics(
            pushes in prop::collection::vec((0usize..3, arb_chunk(), 0u64..3_000), 0..64),
            max_bytes in 0usize..64,
            max_pending in 0usize..6,
        ) {
            let mut r = Reassembler::new(TIMEOUT, max_bytes).with_max_pending(max_pending);
            for (sender, chunk, now) in pushes {
                let sender = ["a", "b", "c"][sender];
                if let Ok(Some(frame)) = r.push(sender, chunk.clone(), now) {
                    prop_assert_eq!(frame.len(), chunk.total_len as usize);
                    prop_assert!(frame.len() <= max_bytes);
                }
                prop_assert!(r.pending() <= max_pending.max(1));
                r.expire(now);
            }
        }

        #[test]
        fn push_of_extreme_chunk_headers_never_panics(
            chunks in prop::collection::vec(
                (any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), prop::collection::vec(any::<u8>(), 0..8)),
                0..32,
            ),
            now in any::<u64>(),
        ) {
            let mut r = Reassembler::new(u64::MAX, usize::MAX);
            for (message_id, index, count, total_len, data) in chunks {
                let _ = r.push("a", Chunk { message_id, index, count, total_len, data, tag: None }, now);
                r.expire(now);
            }
        }

        #[test]
        fn split_then_reassemble_in_any_order_gives_the_frame_back(
            len in 0usize..5_000,
            max_packet in 100usize..1_500,
            seed in any::<u64>(),
        ) {
            let frame = frame_of(len);
            let mut pieces = split_into_chunks(frame.clone(), seed, max_packet);
            prop_assert!(pieces.iter().all(|p| p.len() <= max_packet.max(CHUNK_OVERHEAD + MIN_CHUNK_DATA)));
            if pieces.len() == 1 {
                prop_assert_eq!(&pieces[0], &frame);
                return Ok(());
            }
            prop_assert!(pieces.iter().all(|p| p.len() <= max_packet || max_packet < CHUNK_OVERHEAD + MIN_CHUNK_DATA));
            // A deterministic shuffle driven by the seed.
            let mut state = seed | 1;
            for i in (1..pieces.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                pieces.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut r = reassembler();
            let last = pieces.len() - 1;
            for (i, piece) in pieces.iter().enumerate() {
                let out = r.push("a", as_chunk(piece), 0).unwrap();
                prop_assert_eq!(out.is_some(), i == last);
                if let Some(out) = out {
                    prop_assert_eq!(&out, &frame);
                }
            }
        }
    }
}
