//! Envelope and message decoding, sealed messages and chunk reassembly on arbitrary bytes:
//! nothing may panic, and a reassembled frame decodes like a whole one.
//!
//! Input: `mode | body`. Mode 0 (mod 4): `body` is one payload. Mode 2: `body` is a payload
//! without its CRC, which the target appends, so mutations reach the body decoders instead of
//! stopping at the checksum. Odd modes: `body` is a sequence of `len u8 | sender u8 | payload`
//! records fed to one reassembler, as a coordinator would see them from several devices, each
//! chunk's tag checked first.
#![no_main]

use fedge_wire::{DeviceKey, Message, Reassembler};
use libfuzzer_sys::fuzz_target;

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

fn open(payload: &[u8], key: &DeviceKey, depth: u8) {
    match fedge_wire::decode(payload) {
        Ok(Message::Sealed(sealed)) if depth < 2 => {
            let inner = match sealed.open("dev", key) {
                Ok(inner) => inner,
                Err(_) => &sealed.inner[..],
            };
            open(inner, key, depth + 1);
        }
        Ok(Message::ClientUpdate(update)) => {
            let _ = update.delta.first_non_finite();
            let _ = update.delta.first_beyond(1e9);
            let _ = update.delta.l2_norm();
        }
        Ok(Message::RoundTask(task)) => {
            let _ = task.train.check();
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let key = DeviceKey::from_bytes([7; 32]);
    let Some((mode, body)) = data.split_first() else {
        return;
    };
    if mode % 4 == 0 {
        open(body, &key, 0);
        return;
    }
    if mode % 4 == 2 {
        let mut framed = body.to_vec();
        framed.extend(CRC.checksum(body).to_le_bytes());
        open(&framed, &key, 0);
        return;
    }
    let mut reassembler = Reassembler::new(1_000, 1 << 16).with_max_pending(4);
    let mut rest = body;
    let mut now = 0u64;
    while let [len, sender, tail @ ..] = rest {
        let len = (*len as usize).min(tail.len());
        let (payload, next) = tail.split_at(len);
        rest = next;
        now += 100;
        reassembler.expire(now);
        if let Ok(Message::Chunk(chunk)) = fedge_wire::decode(payload) {
            let sender = ["a", "b", "c"][*sender as usize % 3];
            // Tags are checked before reassembly: any bytes, tagged or not, must not panic.
            let _ = key.verify_chunk(sender, &chunk);
            if let Ok(Some(frame)) = reassembler.push(sender, chunk, now) {
                open(&frame, &key, 0);
            }
        }
    }
});
