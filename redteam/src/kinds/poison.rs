//! A device that plays by the rules until it is selected: it says it is online with a
//! well-formed status, reads the round task like an agent does, and answers with a poisoned
//! update (a huge finite delta with `u32::MAX` samples, or NaN and infinities), chunked like a
//! genuine one. With an insider key (a compromised device) its statuses, updates and chunks
//! carry valid tags: only the checks on the values can stop it.

use crate::craft::{self, Poison};
use crate::ctx::{Beat, Ctx};

/// Announces the device once a round; answers every task that selects it, once.
pub async fn answer(ctx: &mut Ctx, beat: &Beat, poison: Poison) {
    if beat.per_round() {
        let mut status = craft::status(&ctx.id, true, 600);
        if let Some(key) = &ctx.key {
            status.sign(ctx.topics.federation(), key);
        }
        let topic = ctx.topics.edge_status(&ctx.id);
        ctx.send(&topic, craft::status_json(&status), true).await;
    }
    let Some(task) = ctx.view.read(|v| v.task.clone()) else {
        return;
    };
    if !task.selected.contains(&ctx.id) || ctx.done_rounds.contains(&task.round) {
        return;
    }
    ctx.done_rounds.insert(task.round);
    ctx.effect("selected", 1);
    ctx.seq += 1;
    let update = craft::poisoned_update(&task, &ctx.id, ctx.seq, poison);
    let mut frame = fedge_wire::encode(&fedge_wire::Message::ClientUpdate(update));
    let signer = ctx.key.as_ref().map(|key| (ctx.id.as_str(), key));
    if let Some(signer) = signer {
        frame = fedge_wire::seal(frame, &[signer]);
    }
    let pieces = fedge_wire::split_into_tagged_chunks(frame, ctx.seq, ctx.max_packet, signer);
    let topic = ctx.topics.update(&ctx.id);
    let mut all = true;
    for piece in pieces {
        all &= ctx.send(&topic, piece, false).await;
    }
    if all {
        ctx.effect("updates", 1);
    }
}
