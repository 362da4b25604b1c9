//! A stale retained status: what an evaluation-only site left on the broker in an earlier run
//! (dated a day ago, signed with the site's key when the attacker has an insider key), scoring
//! at accuracy 0.99 a release whose SHA-256 this run never published. Retained, it reaches a
//! coordinator when it subscribes as much as when it is written; a coordinator that takes a
//! score without asking which release it is of reports it as this run's.
//!
//! Judged at every round, once a status of the coordinator came after the stale one (by
//! [`SETTLE_MS`] at least): its `site_accuracy` listing the attacker's id is
//! `stale_score_believed`, else `stale_score_ignored` (a refusal).

use std::time::{Duration, SystemTime};

use rand::Rng;

use crate::craft;
use crate::ctx::{Beat, Ctx, SETTLE_MS};

/// The stale score.
const ACCURACY: f32 = 0.99;
/// Images it claims to have scored.
const SAMPLES: u32 = 600;
/// How old the stale status says it is.
const AGE: Duration = Duration::from_secs(24 * 3600);

/// What the attack remembers between beats.
#[derive(Default)]
struct Memory {
    /// The status as published (the same bytes every time).
    payload: Option<Vec<u8>>,
    /// When it was first published.
    published_ms: Option<u64>,
    /// The coordinator status last judged by its time.
    judged_ms: u64,
}

/// Once a round: the stale status (retained), and a judgement of what the coordinator did
/// with it.
pub async fn leave(ctx: &mut Ctx, beat: &Beat) {
    if !beat.per_round() {
        return;
    }
    judge(ctx);
    let payload = match ctx.memory::<Memory>().payload.clone() {
        Some(payload) => payload,
        None => {
            let payload = stale_status(ctx);
            ctx.memory::<Memory>().payload = Some(payload.clone());
            payload
        }
    };
    let topic = ctx.topics.edge_status(&ctx.id);
    if ctx.send(&topic, payload, true).await {
        let now = ctx.view.now_ms();
        let memory = ctx.memory::<Memory>();
        if memory.published_ms.is_none() {
            memory.published_ms = Some(now);
            ctx.effect("stale_statuses", 1);
        }
    }
}

/// The last judgement, when the attacks end.
pub fn conclude(ctx: &mut Ctx) {
    judge(ctx);
}

/// The status of an earlier run: a release digest drawn at random (none this run published),
/// its round the newest this run released, dated [`AGE`] ago.
fn stale_status(ctx: &mut Ctx) -> Vec<u8> {
    let (round, classes, published) = ctx.view.read(|v| {
        let round = v.releases.newest_round().unwrap_or(1);
        let classes = v.task.as_ref().map_or(2, |t| t.classes);
        (
            round,
            classes,
            v.releases.releases.keys().cloned().collect::<Vec<_>>(),
        )
    });
    let sha = loop {
        let digest: [u8; 32] = ctx.rng.random();
        let sha = fedge_wire::hex::encode(&digest);
        if !published.contains(&sha) {
            break sha;
        }
    };
    let mut status = craft::evaluation_status(&ctx.id, classes, &sha, round, ACCURACY, SAMPLES);
    status.serving = Some(sha);
    let then = SystemTime::now()
        .checked_sub(AGE)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    status.updated_at = craft::rfc3339(then);
    if let Some(key) = &ctx.key {
        status.sign(ctx.topics.federation(), key);
    }
    craft::status_json(&status)
}

/// Judges the coordinator's newest status, when it came after the stale status and after the
/// last one judged.
fn judge(ctx: &mut Ctx) {
    let memory = ctx.memory::<Memory>();
    let Some(published) = memory.published_ms else {
        return;
    };
    let since = memory.judged_ms.max(published + SETTLE_MS);
    let id = ctx.id.clone();
    let seen = ctx.view.read(|v| {
        let r = &v.releases;
        r.status_ms
            .filter(|ms| *ms > since)
            .map(|ms| (ms, r.site_accuracy.contains_key(&id)))
    });
    let Some((ms, listed)) = seen else {
        return;
    };
    ctx.memory::<Memory>().judged_ms = ms;
    match listed {
        true => ctx.effect("stale_score_believed", 1),
        false => ctx.refused("stale_score_ignored"),
    }
}
