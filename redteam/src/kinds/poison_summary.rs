//! A poisoned pooled feature summary: a device that plays by the rules, answering every task
//! that selects it with a valid delta of small norm, adds to its answer, once it knows the
//! shape of the federation's summaries (from the pooled summary a task carries, or from a
//! genuine device's update, which anyone on the broker can read: a seal is a tag, not a
//! cipher), a summary of 10 samples whose every class mean and variance is 1e9 (as large as an
//! update's values may be), once, and then in every later round one of a single sample at 1e4.
//! Merged as it is, either moves the federation's pooled means and variances by orders of
//! magnitude, and every site then standardises its features with them.
//!
//! Judged by what the coordinator sent out: the pooled summary in force after each poisoned
//! round (the next task's, or the round's release) against the honest values the attacker saw
//! before its first poison (the pool then, and the genuine devices' own summaries). A value
//! beyond [`POISONED_FACTOR`] times their largest magnitude is `pooled_poisoned` (no merge of
//! honest summaries, weighted, trimmed or clipped, comes near it); else, with the update
//! counted in an aggregated round, `pooled_unmoved` (a refusal). An update the coordinator
//! rejected is counted by its reason.

use fedge_wire::FeatureSummary;

use crate::craft;
use crate::ctx::{Beat, Ctx};
use crate::kinds::poison;

/// The first summary's value and samples.
const HUGE: (f32, u32) = (1e9, 10);
/// Every later summary's value and samples.
const LARGE: (f32, u32) = (1e4, 1);
/// Samples an answer without a summary claims (the least weight in the aggregate).
const PLAIN_SAMPLES: u32 = 1;
/// Largest value of the small deltas.
const DELTA_SCALE: f32 = 1e-4;

/// How many times the honest values' largest magnitude a pooled value must reach to count as
/// poisoned. Any merge of honest summaries keeps its class means within theirs, and its
/// variances within theirs plus the spread of their means; a poisoned one is off by orders of
/// magnitude.
pub const POISONED_FACTOR: f64 = 10.0;

/// What the attack remembers between beats.
#[derive(Default)]
struct Memory {
    /// The largest magnitude of the honest values seen before the first poison.
    reference: Option<f64>,
    /// Rounds answered with a poisoned summary, not judged yet.
    pending: Vec<u64>,
    /// Whether the 1e9 summary went out.
    huge_sent: bool,
}

/// Announces the device once a round, judges what it can, answers every task that selects
/// it, once.
pub async fn answer(ctx: &mut Ctx, beat: &Beat) {
    if beat.per_round() {
        poison::announce(ctx, craft::status(&ctx.id, true, PLAIN_SAMPLES)).await;
    }
    judge(ctx, false);
    let Some(task) = poison::selected(ctx) else {
        return;
    };
    ctx.seq += 1;
    // The honest summaries in sight: the pool the task carries, the genuine devices' own.
    let honest: Vec<FeatureSummary> = ctx.view.read(|v| {
        let own = v
            .updates
            .values()
            .filter_map(|u| u.update.as_ref()?.features.clone());
        task.pooled.clone().into_iter().chain(own).collect()
    });
    let memory = ctx.memory::<Memory>();
    let (effect, samples, summary) = match honest.first() {
        Some(shape) => {
            let ((value, samples), effect) = match memory.huge_sent {
                false => (HUGE, "summaries_1e9"),
                true => (LARGE, "summaries_1e4"),
            };
            memory.huge_sent = true;
            memory
                .reference
                .get_or_insert_with(|| honest.iter().map(magnitude).fold(0.0, f64::max));
            memory.pending.push(task.round);
            let (classes, features) = (shape.classes(), shape.features());
            let summary = craft::flat_summary(classes, features, value, samples);
            (effect, samples, Some(summary))
        }
        // No summary in sight (or the federation does not pool): an answer like any other.
        None => ("plain_updates", PLAIN_SAMPLES, None),
    };
    let mut update =
        craft::plain_update(&task, &ctx.id, ctx.seq, samples, DELTA_SCALE, &mut ctx.rng);
    update.features = summary;
    if poison::send_update(ctx, update).await {
        ctx.effect(effect, 1);
    }
}

/// The last judgements, when the attacks end.
pub fn conclude(ctx: &mut Ctx) {
    judge(ctx, true);
}

/// Judges every poisoned round whose outcome the view shows: the round's metrics, and the
/// pooled summary in force after it. `last`: what cannot be judged now never will be
/// (`unjudged`).
fn judge(ctx: &mut Ctx, last: bool) {
    let memory = ctx.memory::<Memory>();
    let (Some(reference), false) = (memory.reference, memory.pending.is_empty()) else {
        return;
    };
    let pending = std::mem::take(&mut memory.pending);
    let id = ctx.id.clone();
    let mut keep = Vec::new();
    let mut verdicts = Vec::new();
    ctx.view.read(|v| {
        for round in pending {
            let metrics = v.metrics.iter().find(|m| m.round == round);
            let after = v.releases.pooled_after.get(&round);
            match (metrics, after) {
                // Rejected (counted by its reason) or abandoned: nothing of it was folded.
                (Some(m), _) if m.failures.contains_key(&id) || !m.aggregated => {}
                (Some(_), Some(after)) => {
                    verdicts.push(match poisoned(reference, after) {
                        true => "pooled_poisoned",
                        false => "pooled_unmoved",
                    });
                }
                _ if last => verdicts.push("unjudged"),
                _ => keep.push(round),
            }
        }
    });
    ctx.memory::<Memory>().pending = keep;
    for verdict in verdicts {
        match verdict {
            "pooled_unmoved" => ctx.refused(verdict),
            effect => ctx.effect(effect, 1),
        }
    }
}

/// The largest magnitude among a summary's class means, their squares (the spread of means
/// that merging adds to the variances) and its variances; infinite with a value that is not
/// finite.
pub fn magnitude(summary: &FeatureSummary) -> f64 {
    let largest = |values: Vec<f32>| {
        values
            .iter()
            .map(|v| match v.is_finite() {
                true => f64::from(v.abs()),
                false => f64::INFINITY,
            })
            .fold(0.0, f64::max)
    };
    let means = largest(summary.means.to_vec());
    means
        .max(means * means)
        .max(largest(summary.within.to_vec()))
}

/// Whether `after` holds a value beyond [`POISONED_FACTOR`] times `reference`, the largest
/// magnitude of the honest values ([`magnitude`]).
pub fn poisoned(reference: f64, after: &FeatureSummary) -> bool {
    magnitude(after) > POISONED_FACTOR * reference.max(1e-6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_poison_is_beyond_every_honest_merge() {
        let (a, b) = (
            craft::flat_summary(3, 4, 2.0, 300),
            craft::flat_summary(3, 4, 0.5, 200),
        );
        let reference = magnitude(&a).max(magnitude(&b));
        assert_eq!(reference, 4.0, "2.0 squared");
        let honest = FeatureSummary::merge([a.scaled(0.8), b.clone()].iter()).unwrap();
        assert!(!poisoned(reference, &honest));
        for (value, samples) in [HUGE, LARGE] {
            let poison = craft::flat_summary(3, 4, value, samples);
            assert!(poison.check(3, 4).is_ok(), "the poison is a valid summary");
            let merged = FeatureSummary::merge([a.clone(), b.clone(), poison].iter()).unwrap();
            assert!(poisoned(reference, &merged), "{value} × {samples}");
        }
        let mut broken = a.clone();
        broken.within = fedge_wire::TensorF32::from_slice(&[f32::NAN; 4]);
        assert!(poisoned(reference, &broken));
    }
}
