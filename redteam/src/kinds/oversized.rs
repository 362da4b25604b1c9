//! Packets past the limits: a retained status of about 200 KB (and one that is not JSON),
//! and single update publishes of about 200 KB and above 1 MiB. A receiver with a packet limit
//! under 200 KB drops its connection on each, and a retained one comes back at every
//! reconnect; a broker should refuse the one above 1 MiB.

use std::time::Duration;

use rand::Rng;

use crate::craft::{self, ABOVE_BROKER_LIMIT, OVERSIZED_BYTES};
use crate::ctx::{Beat, Ctx};

/// Once a round: a retained garbage status under `<id>-garbage`, then the retained ~200 KB
/// status under `<id>`.
pub async fn status(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() {
        return;
    }
    let garbage_topic = ctx.topics.edge_status(&format!("{}-garbage", ctx.id));
    let len = ctx.rng.random_range(16..1024);
    let garbage: Vec<u8> = (0..len).map(|_| ctx.rng.random()).collect();
    if ctx.send(&garbage_topic, garbage, true).await {
        ctx.effect("garbage_statuses", 1);
    }
    let topic = ctx.topics.edge_status(&ctx.id);
    let big = craft::oversized_status(&ctx.id, OVERSIZED_BYTES);
    if ctx.send(&topic, big, true).await {
        ctx.effect("oversized_statuses", 1);
    }
}

/// Once a round: a ~200 KB update in one publish, and a moment later one above 1 MiB.
pub async fn update(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() {
        return;
    }
    let round = beat.round.unwrap_or(1);
    let run = ctx
        .view
        .read(|v| v.task.as_ref().map(|t| t.run).unwrap_or(0));
    let topic = ctx.topics.update(&ctx.id);
    let frame = craft::update_of_size(&ctx.id, run, round, OVERSIZED_BYTES);
    if ctx.send(&topic, frame, false).await {
        ctx.effect("updates_200k", 1);
    }
    // Let the first reach the broker before the second (which may cost the connection).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frame = craft::update_of_size(&ctx.id, run, round, ABOVE_BROKER_LIMIT);
    if ctx.send(&topic, frame, false).await {
        ctx.effect("updates_above_1mib", 1);
    }
}
