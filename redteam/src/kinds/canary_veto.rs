//! A forged drift alarm: a device that says it is online (so that a canary stage may draw it)
//! and declines the rounds that select it, as a device busy serving may (so that rounds do not
//! wait for it and the model owes it nothing), and whose status, whenever the serving pointer
//! on `model/serving` changes, says it serves the release the pointer names (the canary's
//! during a canary stage; a sealed pointer is read without its tags) and that its drift alarm
//! went off. A coordinator that fails a canary stage on one device's alarm sends every device
//! back to the release before.
//!
//! Judged by the pointers that follow each alarm: on a canary stage, the same release going to
//! every device is `canary_survived` (a refusal) and a pointer back to an earlier release
//! `canary_vetoed`; on a release every device serves, a pointer back to an earlier release is
//! `rolled_back`, and a newer release taking over (or the same one still served at the end)
//! `release_kept` (a refusal). `alarms_on_canary` and `alarms_on_served` say which it was, and
//! `canary_member` whether the stage had drawn the attacker.

use fedge_wire::{Declined, ServingPointer, Stage};

use crate::craft;
use crate::ctx::{Beat, Ctx};
use crate::kinds::poison;

/// Samples the device claims in its status.
const SAMPLES: u32 = 10;

/// An alarm raised on one pointer, waiting to be judged.
#[derive(Debug, Clone)]
struct Alarm {
    /// The pointer it answered.
    pointer: ServingPointer,
}

/// What the attack remembers between beats.
#[derive(Default)]
struct Memory {
    alarms: Vec<Alarm>,
    raised: u64,
    last_seq: Option<u64>,
}

/// Once a round, at every new pointer and when a task selects the device: the status (with an
/// alarm on the pointer's release once there is a pointer, and the round declined when
/// selected).
pub async fn veto(ctx: &mut Ctx, beat: &Beat) {
    judge(ctx, false);
    let pointer = ctx
        .view
        .read(|v| v.releases.pointer().map(|p| p.pointer.clone()));
    let declined = poison::selected(ctx).map(|task| Declined {
        run: format!("{:016x}", task.run),
        round: task.round,
        reason: "serving only: this device does not train".into(),
    });
    let memory = ctx.memory::<Memory>();
    let new_pointer = pointer
        .as_ref()
        .is_some_and(|p| memory.last_seq != Some(p.seq));
    let speak = beat.per_round() || new_pointer || declined.is_some();
    if let (Some(p), true) = (&pointer, speak) {
        memory.raised += 1;
        memory.last_seq = Some(p.seq);
    }
    let raised = memory.raised;
    if speak {
        let mut status = craft::status(&ctx.id, true, SAMPLES);
        if let Some(p) = &pointer {
            status.serving = Some(p.sha256.clone());
            status.drift = Some(craft::drift_alarm(raised));
        }
        let declines = declined.is_some();
        status.declined = declined;
        let sent = poison::announce(ctx, status).await;
        if sent && declines {
            ctx.effect("rounds_declined", 1);
        }
        if sent && let (Some(p), true) = (pointer, new_pointer) {
            let canary = p.stage == Stage::Canary;
            ctx.effect(
                if canary {
                    "alarms_on_canary"
                } else {
                    "alarms_on_served"
                },
                1,
            );
            if canary && p.canary.contains(&ctx.id) {
                ctx.effect("canary_member", 1);
            }
            ctx.memory::<Memory>().alarms.push(Alarm { pointer: p });
        }
    }
}

/// The last judgements, when the attacks end.
pub fn conclude(ctx: &mut Ctx) {
    judge(ctx, true);
}

/// What became of each alarm, by the pointers after it; `last`: judged on the newest pointer
/// when none followed (a release still served was kept; a canary stage still under way is
/// `unjudged`).
fn judge(ctx: &mut Ctx, last: bool) {
    let alarms = std::mem::take(&mut ctx.memory::<Memory>().alarms);
    let mut keep = Vec::new();
    let mut outcomes = Vec::new();
    ctx.view.read(|v| {
        for alarm in alarms {
            let alarmed = &alarm.pointer;
            let mut after: Vec<&ServingPointer> = (v.releases.pointers.iter())
                .map(|p| &p.pointer)
                .filter(|p| p.seq > alarmed.seq)
                .collect();
            after.sort_by_key(|p| p.seq);
            let next = after
                .into_iter()
                .find(|p| p.sha256 != alarmed.sha256 || p.stage != alarmed.stage);
            match next.map(|next| outcome(alarmed, next)) {
                Some(outcome) => outcomes.push(outcome),
                None if last && alarmed.stage == Stage::All => outcomes.push("release_kept"),
                None if last => outcomes.push("unjudged"),
                None => keep.push(alarm),
            }
        }
    });
    ctx.memory::<Memory>().alarms = keep;
    for outcome in outcomes {
        match outcome {
            "canary_survived" | "release_kept" => ctx.refused(outcome),
            effect => ctx.effect(effect, 1),
        }
    }
}

/// What the first pointer `next` to change the release or the stage says of an alarm raised
/// on `alarmed`.
fn outcome(alarmed: &ServingPointer, next: &ServingPointer) -> &'static str {
    let back = next.round < alarmed.round || alarmed.previous.as_ref() == Some(&next.sha256);
    match (alarmed.stage, next.sha256 == alarmed.sha256) {
        (Stage::Canary, true) => "canary_survived",
        (Stage::Canary, false) if back => "canary_vetoed",
        // A newer release replaced the canary's (an operator's promote): no verdict on it.
        (Stage::Canary, false) => "superseded",
        (Stage::All, _) if back => "rolled_back",
        (Stage::All, _) => "release_kept",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(
        seq: u64,
        sha: char,
        round: u64,
        stage: Stage,
        previous: Option<char>,
    ) -> ServingPointer {
        ServingPointer {
            federation: "lab".into(),
            seq,
            sha256: sha.to_string().repeat(64),
            round,
            stage,
            canary: Vec::new(),
            previous: previous.map(|p| p.to_string().repeat(64)),
            pinned: false,
        }
    }

    #[test]
    fn the_pointer_after_an_alarm_says_whether_it_vetoed_the_canary() {
        let canary = pointer(5, 'b', 4, Stage::Canary, Some('a'));
        let rolled_out = pointer(6, 'b', 4, Stage::All, None);
        let rolled_back = pointer(6, 'a', 3, Stage::All, None);
        let newer = pointer(6, 'c', 5, Stage::Canary, Some('a'));
        assert_eq!(outcome(&canary, &rolled_out), "canary_survived");
        assert_eq!(outcome(&canary, &rolled_back), "canary_vetoed");
        assert_eq!(outcome(&canary, &newer), "superseded");
        let served = pointer(6, 'b', 4, Stage::All, None);
        assert_eq!(
            outcome(&served, &pointer(7, 'c', 5, Stage::All, None)),
            "release_kept"
        );
        assert_eq!(
            outcome(&served, &pointer(7, 'a', 3, Stage::All, None)),
            "rolled_back"
        );
    }
}
