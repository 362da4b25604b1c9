//! Replays: a genuine update captured on the update wildcard (anyone may subscribe on an open
//! broker) is published again, byte for byte, in a later round on its device's topic and into
//! another federation. A sealed update is also re-dated to the open round under its old tags
//! (the run and everything else kept). An update without tags is not re-dated: changed, it is
//! no replay but a forgery in the device's name, which only device keys can tell apart.

use crate::ctx::{Beat, Ctx};

/// When a round opens, every device's last captured update from an earlier round, verbatim
/// here and in the other federation, and re-dated when it is sealed.
pub async fn replay(ctx: &mut Ctx, beat: &Beat) {
    let Some(round) = beat.round.filter(|_| beat.new_round) else {
        return;
    };
    let captured = ctx.view.read(|v| {
        v.updates
            .iter()
            .filter(|(_, u)| u.round < round)
            .map(|(c, u)| (c.clone(), u.clone()))
            .collect::<Vec<_>>()
    });
    for (client, update) in captured {
        let topic = ctx.topics.update(&client);
        for piece in &update.pieces {
            if !ctx.send_as(&client, &topic, piece.clone(), false).await {
                return;
            }
        }
        ctx.effect("replayed", 1);
        let elsewhere = ctx.replay_into.update(&client);
        for piece in &update.pieces {
            if !ctx.send(&elsewhere, piece.clone(), false).await {
                return;
            }
        }
        ctx.effect("replayed_into_other_federation", 1);
        if let (true, Some(sealed), Some(mut genuine)) =
            (update.sealed, update.seal.clone(), update.update.clone())
        {
            genuine.round = round;
            let inner = fedge_wire::encode(&fedge_wire::Message::ClientUpdate(genuine));
            let frame = fedge_wire::encode(&fedge_wire::Message::Sealed(fedge_wire::Sealed {
                inner,
                ..sealed
            }));
            let id = update.seq;
            for piece in fedge_wire::split_into_chunks(frame, id, ctx.max_packet) {
                if !ctx.send_as(&client, &topic, piece, false).await {
                    return;
                }
            }
            ctx.effect("redated", 1);
        }
    }
}
