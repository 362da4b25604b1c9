//! Stale tasks: the oldest genuine round task the observer captured (every chunk of it) is
//! published again, retained, once a later round's selected devices have answered, so that an
//! idle device takes it for new work and a device connecting later finds it instead of the
//! current one.

use std::time::Duration;

use crate::ctx::{Beat, Ctx};

/// When a round opens and an older task was captured: wait until the round's real devices
/// answered it (at most two seconds), then re-publish the old task.
pub async fn republish(ctx: &mut Ctx, beat: &Beat) {
    let Some(round) = beat.round.filter(|_| beat.new_round) else {
        return;
    };
    let Some((old, pieces)) = ctx.view.read(|v| {
        v.tasks
            .iter()
            .find(|(r, _)| **r < round)
            .map(|(r, p)| (*r, p.clone()))
    }) else {
        return;
    };
    let selected = ctx.view.read(|v| v.selected_real());
    let mut stop = ctx.stop.clone();
    ctx.view
        .wait_until(Duration::from_secs(2), &mut stop, |v| {
            selected
                .iter()
                .all(|c| v.updates.get(c).is_some_and(|u| u.round >= round))
        })
        .await;
    ctx.view.write(|v| {
        v.stale_rounds.insert(old);
        for (_, payload) in &pieces {
            v.mark_own(payload);
        }
    });
    for (topic, payload) in pieces {
        if !ctx.link.publish(&topic, payload, true, &mut ctx.stop).await {
            return;
        }
        ctx.retained.insert(topic);
    }
    ctx.effect("stale_tasks", 1);
}
