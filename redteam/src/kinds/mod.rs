//! The attacks, one file each (two for the pairs that share their payloads): every attack is a
//! function of its working set and the beat, called at every beat by the runner.

pub mod chunks;
pub mod control;
pub mod inference;
pub mod junk;
pub mod oversized;
pub mod poison;
pub mod replay;
pub mod stale;
pub mod status;
pub mod takeover;

use super::craft::Poison;
use super::ctx::{Beat, Ctx};
use super::kind::AttackKind;

/// Runs `ctx`'s attack for one beat.
pub async fn act(ctx: &mut Ctx, beat: &Beat) {
    match ctx.kind {
        AttackKind::OversizedStatus => oversized::status(ctx, beat).await,
        AttackKind::OversizedUpdate => oversized::update(ctx, beat).await,
        AttackKind::PoisonWeight => poison::answer(ctx, beat, Poison::Huge).await,
        AttackKind::Nan => poison::answer(ctx, beat, Poison::NonFinite).await,
        AttackKind::ChunkFlood => chunks::flood(ctx, beat).await,
        AttackKind::ChunkHijack => chunks::hijack(ctx, beat).await,
        AttackKind::Replay => replay::replay(ctx, beat).await,
        AttackKind::ForgedStatus => status::forge(ctx, beat).await,
        AttackKind::StaleTask => stale::republish(ctx, beat).await,
        AttackKind::Junk => junk::junk(ctx, beat).await,
        AttackKind::IdTakeover => takeover::take_over(ctx, beat).await,
        AttackKind::ControlReplay => control::replay(ctx, beat).await,
        AttackKind::InferenceFlood => inference::flood(ctx, beat).await,
        AttackKind::ImageBomb => inference::bomb(ctx, beat).await,
    }
}
