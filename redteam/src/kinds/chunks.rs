//! Attacks on chunk reassembly. The flood opens many chunk streams that never complete, under
//! the attacker's id and many made-up ones, to fill every slot a receiver has for partial
//! messages; the hijack forges chunks on real devices' update topics with the message ids they
//! are about to use (their sequence numbers, which their last update gives away).

use rand::Rng;

use crate::craft;
use crate::ctx::{Beat, Ctx};

/// Partial streams per beat under the attacker's own id.
const OWN_STREAMS: u64 = 64;
/// Made-up client ids per beat, one partial stream each.
const MADE_UP_IDS: u64 = 64;
/// Chunks a flooding stream announces.
const FLOOD_COUNT: u32 = 16;
/// Bytes a flooding stream announces.
const FLOOD_BYTES: u32 = 16 * 1024;

/// Every beat: partial streams on the attacker's own topic (the first followed by a chunk
/// that contradicts it), and one on each of many made-up ids.
pub async fn flood(ctx: &mut Ctx, beat: &Beat) {
    let own = ctx.topics.update(&ctx.id);
    let base = beat.index * OWN_STREAMS;
    for i in 0..OWN_STREAMS {
        let chunk = craft::partial_chunk(base + i, FLOOD_COUNT, FLOOD_BYTES, false, &mut ctx.rng);
        if !ctx.send(&own, chunk, false).await {
            return;
        }
        ctx.effect("partial_streams", 1);
        if i == 0 {
            let contradiction = craft::contradicting_chunk(base, FLOOD_COUNT, &mut ctx.rng);
            if !ctx.send(&own, contradiction, false).await {
                return;
            }
            ctx.effect("contradicting_chunks", 1);
        }
    }
    for n in 0..MADE_UP_IDS {
        let topic = ctx.topics.update(&format!("{}-{n}", ctx.id));
        let id = ctx.rng.random();
        let chunk = craft::partial_chunk(id, FLOOD_COUNT, FLOOD_BYTES, false, &mut ctx.rng);
        if !ctx.send(&topic, chunk, false).await {
            return;
        }
        ctx.effect("partial_streams_made_up_ids", 1);
    }
}

/// When a round opens, for every selected real device (every known one when none is
/// selected): the first chunk of the stream it is
/// about to send (its next sequence number, the chunk count and length of its last update),
/// which its own chunks then contradict, and a complete stream of garbage under the sequence
/// number after that; every forged chunk carries a forged tag, as a keyed device's would.
pub async fn hijack(ctx: &mut Ctx, beat: &Beat) {
    if !beat.new_round {
        return;
    }
    let victims = ctx.view.read(|v| {
        let selected = v.selected_real();
        let devices = if selected.is_empty() {
            v.real_devices()
        } else {
            selected
        };
        devices
            .into_iter()
            .map(|c| {
                let last = v.updates.get(&c);
                let next = last.map(|u| u.seq + 1).unwrap_or(1);
                let shape = last.and_then(|u| u.chunking).unwrap_or((2, 4096));
                (c, next, shape)
            })
            .collect::<Vec<_>>()
    });
    for (victim, next, (count, total_len)) in victims {
        let topic = ctx.topics.update(&victim);
        let first = craft::partial_chunk(next, count, total_len, true, &mut ctx.rng);
        if !ctx.send_as(&victim, &topic, first, false).await {
            return;
        }
        ctx.effect("forged_first_chunks", 1);
        for piece in craft::garbage_stream(next + 1, 2, 2048, true, &mut ctx.rng) {
            if !ctx.send_as(&victim, &topic, piece, false).await {
                return;
            }
        }
        ctx.effect("forged_streams", 1);
    }
}
