//! Forged statuses: retained `online: true` for devices that do not exist, so that the
//! coordinator selects them and waits for them, and retained `online: false` for real
//! devices, written just after they refreshed their own, so that the next round leaves them
//! out (with a forged tag, as a keyed device's status carries one). A device that puts its own status back (`device_reasserted`) refuses the forgery;
//! ghosts the coordinator selects (`ghosts_selected`) show the other half worked.

use std::time::Duration;

use crate::craft;
use crate::ctx::{Beat, Ctx};

/// Made-up devices announced.
const GHOSTS: usize = 3;

/// Once a round: the ghosts online, then (once the real devices refreshed their statuses, or
/// after two seconds) every real device offline.
pub async fn forge(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() {
        return;
    }
    let ghost_prefix = format!("{}-ghost-", ctx.id);
    let selected = ctx.view.read(|v| {
        v.task.as_ref().map_or(0, |t| {
            t.selected
                .iter()
                .filter(|c| c.starts_with(&ghost_prefix))
                .count()
        })
    });
    if beat.new_round && selected > 0 {
        ctx.effect("ghosts_selected", selected as u64);
    }
    for n in 0..GHOSTS {
        let ghost = format!("{}-ghost-{n}", ctx.id);
        let status = craft::status_json(&craft::status(&ghost, true, 600));
        if ctx
            .send(&ctx.topics.edge_status(&ghost), status, true)
            .await
        {
            ctx.effect("ghosts_online", 1);
        }
    }
    let since = ctx
        .view
        .read(|v| v.task.as_ref().map(|t| t.seen_ms).unwrap_or(0));
    let mut stop = ctx.stop.clone();
    let real = ctx.view.read(|v| v.real_devices());
    ctx.view
        .wait_until(Duration::from_secs(2), &mut stop, |v| {
            real.iter()
                .all(|c| v.statuses.get(c).is_some_and(|(_, ms)| *ms > since))
        })
        .await;
    for device in real {
        let status = craft::status_json(&craft::forged_status(&device, false, &mut ctx.rng));
        let topic = ctx.topics.edge_status(&device);
        let ms = ctx.view.now_ms();
        ctx.view.write(|v| v.forged.insert(device.clone(), ms));
        if !ctx.send_as(&device, &topic, status, true).await {
            return;
        }
        ctx.forged.insert(device);
        ctx.effect("real_devices_offline", 1);
    }
}
