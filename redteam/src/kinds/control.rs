//! Control replay: every operator command the observer captured on the control topic is
//! published again at every round, as someone who recorded them would after the coordinator
//! restarted; with none captured, a command with a made-up tag. A coordinator with an operator
//! key refuses each (`bad_control`: a replay, an old or a forged command); one without takes
//! no commands at all.

use rand::RngCore;

use crate::ctx::{Beat, Ctx};

/// At each new round: the captured commands again, or one forged.
pub async fn replay(ctx: &mut Ctx, beat: &Beat) {
    if !beat.new_round {
        return;
    }
    let mut commands = ctx.view.read(|v| v.controls.clone());
    if commands.is_empty() {
        let mut tag = [0u8; 32];
        ctx.rng.fill_bytes(&mut tag);
        let tag = fedge_wire::hex::encode(&tag);
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let forged = serde_json::json!({
            "federation": ctx.topics.federation(),
            "seq": seq,
            "command": "pause",
            "tag": tag,
        });
        commands.push(forged.to_string().into_bytes());
        ctx.effect("forged_commands", 1);
    } else {
        ctx.effect("replayed_commands", commands.len() as u64);
    }
    let topic = ctx.topics.control();
    for command in commands {
        if !ctx.send_as("operator", &topic, command, false).await {
            return;
        }
    }
}
