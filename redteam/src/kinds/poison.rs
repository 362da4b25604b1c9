//! A device that plays by the rules until it is selected: it says it is online with a
//! well-formed status, reads the round task like an agent does, and answers with a poisoned
//! update (a huge finite delta with `u32::MAX` samples, or NaN and infinities), chunked like a
//! genuine one. With an insider key (a compromised device) its statuses, updates and chunks
//! carry valid tags: only the checks on the values can stop it.
//!
//! The other attacks that play a device (`poison-summary`, `canary-veto`) go online, sign and
//! answer their tasks through the same helpers.

use fedge_wire::{ClientUpdate, EdgeStatus};

use crate::craft::{self, Poison};
use crate::ctx::{Beat, Ctx};
use crate::view::TaskSeen;

/// Announces the device once a round; answers every task that selects it, once.
pub async fn answer(ctx: &mut Ctx, beat: &Beat, poison: Poison) {
    if beat.per_round() {
        announce(ctx, craft::status(&ctx.id, true, 600)).await;
    }
    let Some(task) = selected(ctx) else {
        return;
    };
    ctx.seq += 1;
    let update = craft::poisoned_update(&task, &ctx.id, ctx.seq, poison);
    if send_update(ctx, update).await {
        ctx.effect("updates", 1);
    }
}

/// Publishes `status` (retained) on the attacker's status topic, signed with the insider key
/// when it has one (after its time stamp is final); false once stopped.
pub async fn announce(ctx: &mut Ctx, mut status: EdgeStatus) -> bool {
    if let Some(key) = &ctx.key {
        status.sign(ctx.topics.federation(), key);
    }
    let topic = ctx.topics.edge_status(&ctx.id);
    ctx.send(&topic, craft::status_json(&status), true).await
}

/// The newest task, when it selects the attacker and was not answered yet: marked answered
/// and counted as `selected`.
pub fn selected(ctx: &mut Ctx) -> Option<TaskSeen> {
    let task = ctx.view.read(|v| v.task.clone())?;
    if !task.selected.contains(&ctx.id) || ctx.done_rounds.contains(&task.round) {
        return None;
    }
    ctx.done_rounds.insert(task.round);
    ctx.effect("selected", 1);
    Some(task)
}

/// Sends `update` as a device does: sealed, and chunked with a tag on every chunk, when the
/// attacker has an insider key; plain and chunked otherwise. Whether every piece went out.
pub async fn send_update(ctx: &mut Ctx, update: ClientUpdate) -> bool {
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
    all
}
