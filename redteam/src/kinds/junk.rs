//! Junk: random bytes, up to 64 KiB, on every topic of the federation (the task and its chunk
//! topics, the attacker's update and status topics, the metrics and the coordinator's status),
//! none retained but the attacker's own status.

use crate::craft::{self, MAX_JUNK};
use crate::ctx::{Beat, Ctx};

/// Every beat: one junk payload on each topic.
pub async fn junk(ctx: &mut Ctx, _beat: &Beat) {
    let t = &ctx.topics;
    let topics = [
        (t.round_task(), false),
        (format!("{}/0", t.round_task()), false),
        (format!("{}/1", t.round_task()), false),
        (t.update(&ctx.id), false),
        (t.edge_status(&ctx.id), true),
        (t.metrics(), false),
        (t.coordinator_status(), false),
    ];
    for (topic, retain) in topics {
        let payload = craft::junk(&mut ctx.rng, MAX_JUNK);
        if !ctx.send(&topic, payload, retain).await {
            return;
        }
        ctx.effect("junk_payloads", 1);
    }
}
