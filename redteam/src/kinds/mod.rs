//! The attacks, one file each (two for the pairs that share their payloads): every attack is a
//! function of its working set and the beat, called at every beat by the runner. The attacks
//! judged by what the coordinator did with what they said also judge once more when the run
//! ends ([`conclude`]).

pub mod canary_veto;
pub mod chunks;
pub mod control;
pub mod inference;
pub mod junk;
pub mod lying_score;
pub mod oversized;
pub mod poison;
pub mod poison_summary;
pub mod replay;
pub mod stale;
pub mod stale_status;
pub mod status;
pub mod takeover;

use super::craft::Poison;
use super::ctx::{Beat, Ctx};
use super::kind::AttackKind;

pub use crate::ctx::SETTLE_MS;

/// Runs `ctx`'s attack for one beat.
pub async fn act(ctx: &mut Ctx, beat: &Beat) {
    match ctx.kind {
        AttackKind::OversizedStatus => oversized::status(ctx, beat).await,
        AttackKind::OversizedUpdate => oversized::update(ctx, beat).await,
        AttackKind::PoisonWeight => poison::answer(ctx, beat, Poison::Huge).await,
        AttackKind::Nan => poison::answer(ctx, beat, Poison::NonFinite).await,
        AttackKind::PoisonSummary => poison_summary::answer(ctx, beat).await,
        AttackKind::ChunkFlood => chunks::flood(ctx, beat).await,
        AttackKind::ChunkHijack => chunks::hijack(ctx, beat).await,
        AttackKind::Replay => replay::replay(ctx, beat).await,
        AttackKind::ForgedStatus => status::forge(ctx, beat).await,
        AttackKind::LyingScore => lying_score::lie(ctx, beat).await,
        AttackKind::CanaryVeto => canary_veto::veto(ctx, beat).await,
        AttackKind::StaleStatus => stale_status::leave(ctx, beat).await,
        AttackKind::StaleTask => stale::republish(ctx, beat).await,
        AttackKind::Junk => junk::junk(ctx, beat).await,
        AttackKind::IdTakeover => takeover::take_over(ctx, beat).await,
        AttackKind::ControlReplay => control::replay(ctx, beat).await,
        AttackKind::InferenceFlood => inference::flood(ctx, beat).await,
        AttackKind::ImageBomb => inference::bomb(ctx, beat).await,
    }
}

/// When the attacks end: the last judgements of the attacks judged by what the coordinator
/// did (what is still pending then is counted `unjudged`).
pub fn conclude(ctx: &mut Ctx) {
    match ctx.kind {
        AttackKind::PoisonSummary => poison_summary::conclude(ctx),
        AttackKind::LyingScore => lying_score::conclude(ctx),
        AttackKind::CanaryVeto => canary_veto::conclude(ctx),
        AttackKind::StaleStatus => stale_status::conclude(ctx),
        _ => {}
    }
}
