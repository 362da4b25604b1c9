//! Attacks on what devices serve, over their MQTT inference topics (`[inference] mqtt = true`):
//!
//! - `inference-flood`: bursts of prediction requests to every device at every beat (junk
//!   images: what counts is how many a device takes on at once, which its `max_in_flight`
//!   bounds; the rest are answered busy before their image is read);
//! - `image-bomb`: a PNG of 65 bytes whose header says 8192 × 8192 RGBA, 256 MiB once
//!   decoded; a device judges it on its header and refuses it without decoding a pixel.
//!
//! Each request's id is the attack's id with a number, so the devices' answers (on their
//! `infer/response` topics, read by the observer) are counted back to the attack: refusals by
//! kind, and `predictions_answered` for a request a device did predict.

use base64::Engine;

use crate::ctx::{Beat, Ctx};

/// Requests to each device at every beat of the flood.
const BURST: usize = 8;

/// The flood: [`BURST`] junk images to every device known, each beat.
pub async fn flood(ctx: &mut Ctx, _beat: &Beat) {
    tally_answers(ctx);
    let junk: Vec<u8> = (0..64).map(|i| (i * 37 % 251) as u8).collect();
    for device in ctx.view.read(|v| v.real_devices()) {
        for _ in 0..BURST {
            if !request(ctx, &device, &junk).await {
                return;
            }
        }
    }
}

/// The bomb: one request with [`bomb_png`] to every device known, each beat.
pub async fn bomb(ctx: &mut Ctx, _beat: &Beat) {
    tally_answers(ctx);
    let png = bomb_png(8192, 8192);
    for device in ctx.view.read(|v| v.real_devices()) {
        if !request(ctx, &device, &png).await {
            return;
        }
    }
}

/// Publishes one prediction request for `image` to `device`, numbered with the attack's id.
async fn request(ctx: &mut Ctx, device: &str, image: &[u8]) -> bool {
    ctx.seq += 1;
    let body = serde_json::json!({
        "id": format!("{}-{}", ctx.id, ctx.seq),
        "image": base64::engine::general_purpose::STANDARD.encode(image),
    });
    let topic = ctx.topics.infer_request(device);
    let sent = ctx.send(&topic, body.to_string().into_bytes(), false).await;
    if sent {
        ctx.effect("requests", 1);
    }
    sent
}

/// Takes the devices' answers to this attack's requests: refusals by kind, predictions as an
/// effect.
fn tally_answers(ctx: &mut Ctx) {
    let mine = format!("{}-", ctx.id);
    let answers = ctx.view.write(|v| {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut v.infer_answers)
            .into_iter()
            .partition(|(id, _)| id.starts_with(&mine));
        v.infer_answers = rest;
        mine
    });
    for (_, outcome) in answers {
        match outcome {
            "prediction" => ctx.effect("predictions_answered", 1),
            refusal => ctx.refused(refusal),
        }
    }
}

/// A PNG that is only a header: signature, IHDR of `width` × `height` RGBA at 8 bits, an
/// empty IDAT, IEND.
/// A decoder that trusts the header allocates width × height × 4 bytes before it finds no
/// data.
pub fn bomb_png(width: u32, height: u32) -> Vec<u8> {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        png.extend_from_slice(&body);
        png.extend_from_slice(&CRC.checksum(&body).to_be_bytes());
    };
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    // 8 bits a channel, colour type 6 (RGBA), deflate, adaptive filtering, no interlace.
    header.extend_from_slice(&[8, 6, 0, 0, 0]);
    chunk(b"IHDR", &header);
    // An empty deflate stream: decoders read the header up to the first data chunk.
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    png
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bomb_is_a_png_header_of_65_bytes_naming_its_size() {
        let png = bomb_png(8192, 8192);
        assert_eq!(png.len(), 65);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 8192);
        // The IEND chunk's CRC is the one every PNG ends with.
        assert_eq!(&png[61..65], &[0xae, 0x42, 0x60, 0x82]);
    }
}
