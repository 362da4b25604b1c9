//! A lying evaluation-only site: statuses that score the release waiting for the gate (the
//! candidate the coordinator's status names; the release served when none waits), each after
//! a status scoring the release served, so that a gate pairing a site's two scores finds both.
//! The lies go round: accuracy 1e30, −1e30, then in range with the paired counts all for the
//! candidate (every image gained), then all against it (every image lost), the score of the
//! release served the opposite each time. With an insider key (a compromised site) they carry
//! valid tags: only what the coordinator makes of a site's word can stop them.
//!
//! Judged by what the coordinator published after each lie (by [`SETTLE_MS`] at least): its
//! `site_accuracy` showing under the attacker's id an accuracy outside [0, 1] the lie claimed
//! is `score_believed`, one in range `score_listed` (a site's word under its own name, which
//! nobody can check: no breach by itself), none of the lie's values `score_ignored`; a gate
//! verdict on a lied-about candidate, first seen after the lie, with a mean accuracy outside
//! 0–100 points or more sites than the honest evaluation-only sites the attacker saw is
//! `gate_swayed` (else `gate_unswayed`). A verdict given before the lie arrived is
//! `too_late`.

use std::time::Duration;

use crate::craft;
use crate::ctx::{Beat, Ctx, SETTLE_MS};
use crate::kinds::poison;

/// Images every lie claims to have scored.
const SAMPLES: u32 = 600;

/// One of the lies, in the order told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lie {
    /// The candidate at 1e30.
    Huge,
    /// The candidate at −1e30.
    Negative,
    /// The candidate perfect, the release served wrong everywhere, every image gained.
    For,
    /// The candidate wrong everywhere, the release served perfect, every image lost.
    Against,
}

impl Lie {
    const ROUND: [Lie; 4] = [Lie::Huge, Lie::Negative, Lie::For, Lie::Against];

    /// The candidate's accuracy and the served release's.
    fn accuracies(self) -> (f32, f32) {
        match self {
            Lie::Huge => (1e30, 0.0),
            Lie::Negative => (-1e30, 1.0),
            Lie::For => (1.0, 0.0),
            Lie::Against => (0.0, 1.0),
        }
    }

    fn favours(self) -> bool {
        matches!(self, Lie::Huge | Lie::For)
    }

    fn effect(self) -> &'static str {
        match self {
            Lie::Huge => "lies_1e30",
            Lie::Negative => "lies_minus_1e30",
            Lie::For => "lies_for_candidate",
            Lie::Against => "lies_against_candidate",
        }
    }
}

/// A lie told, waiting to be judged.
#[derive(Debug, Clone)]
struct Told {
    /// The release it scored.
    target: String,
    /// Every accuracy its statuses claimed.
    claims: Vec<f32>,
    /// When it was told.
    ms: u64,
    /// Whether the site list was judged.
    listed: bool,
    /// Whether the gate was judged (or there was no gate to judge).
    gated: bool,
}

/// What the attack remembers between beats.
#[derive(Default)]
struct Memory {
    told: Vec<Told>,
    next: usize,
    last_target: Option<String>,
}

/// At each round, and whenever the release to score changes: the next lie.
pub async fn lie(ctx: &mut Ctx, beat: &Beat) {
    judge(ctx, false);
    let (candidate, served) = ctx.view.read(|v| {
        let r = &v.releases;
        let newest = || {
            (r.releases.iter())
                .filter(|(_, s)| !s.candidate)
                .max_by_key(|(_, s)| s.round)
                .map(|(sha, s)| (sha.clone(), s.round))
        };
        (r.candidate.clone(), r.serving.clone().or_else(newest))
    });
    let Some(target) = candidate.clone().or_else(|| served.clone()) else {
        return;
    };
    let memory = ctx.memory::<Memory>();
    if !beat.per_round() && memory.last_target.as_ref() == Some(&target.0) {
        return;
    }
    memory.last_target = Some(target.0.clone());
    let lie = Lie::ROUND[memory.next % Lie::ROUND.len()];
    memory.next += 1;
    let (lied, served_lie) = lie.accuracies();
    let classes = ctx.view.read(|v| v.task.as_ref().map_or(2, |t| t.classes));
    let mut claims = Vec::new();
    // The served release's score first, so that the site holds both when the candidate's
    // arrives.
    let pair = served.as_ref().filter(|s| s.0 != target.0);
    if let Some((sha, round)) = pair {
        let mut status =
            craft::evaluation_status(&ctx.id, classes, sha, *round, served_lie, SAMPLES);
        status.serving = Some(sha.clone());
        if !poison::announce(ctx, status).await {
            return;
        }
        claims.push(served_lie);
        // A later time stamp: with keys, a status no newer than the last is not news.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let against = match pair {
        Some((sha, _)) => Some(sha.clone()),
        None => ctx.view.read(|v| v.releases.before(&target.0)),
    };
    let mut status = craft::evaluation_status(&ctx.id, classes, &target.0, target.1, lied, SAMPLES);
    status.paired = against
        .as_deref()
        .map(|a| craft::paired(a, SAMPLES, lie.favours()));
    status.serving = served.as_ref().map(|s| s.0.clone());
    if !poison::announce(ctx, status).await {
        return;
    }
    claims.push(lied);
    ctx.effect(lie.effect(), 1);
    let is_candidate = candidate.is_some_and(|c| c.0 == target.0);
    let ms = ctx.view.now_ms();
    ctx.memory::<Memory>().told.push(Told {
        target: target.0,
        claims,
        ms,
        listed: false,
        gated: !is_candidate,
    });
}

/// The last judgements, when the attacks end.
pub fn conclude(ctx: &mut Ctx) {
    judge(ctx, true);
}

/// Judges every lie whose outcome the coordinator's status shows; `last`: what cannot be
/// judged now never will be (`unjudged`).
fn judge(ctx: &mut Ctx, last: bool) {
    let mut told = std::mem::take(&mut ctx.memory::<Memory>().told);
    let id = ctx.id.clone();
    let mut outcomes = Vec::new();
    ctx.view.read(|v| {
        let r = &v.releases;
        let honest = v.evaluators.len();
        for lie in &mut told {
            if !lie.listed && r.status_ms.is_some_and(|ms| ms > lie.ms + SETTLE_MS) {
                lie.listed = true;
                let shown = r.site_accuracy.get(&id).copied();
                outcomes.push(listing(shown, &lie.claims));
            }
            if !lie.gated {
                let verdict =
                    (r.gates.iter()).find(|g| g.candidate == lie.target && g.outcome != "waiting");
                if let Some(verdict) = verdict {
                    lie.gated = true;
                    outcomes.push(match (verdict.first_ms <= lie.ms, verdict.swayed(honest)) {
                        (true, _) => "too_late",
                        (false, true) => "gate_swayed",
                        (false, false) => "gate_unswayed",
                    });
                }
            }
            if last && !(lie.listed && lie.gated) {
                outcomes.push("unjudged");
            }
        }
    });
    told.retain(|lie| !(last || lie.listed && lie.gated));
    ctx.memory::<Memory>().told = told;
    for outcome in outcomes {
        match outcome {
            "score_ignored" | "gate_unswayed" => ctx.refused(outcome),
            effect => ctx.effect(effect, 1),
        }
    }
}

/// What the coordinator's site list says of a lie whose statuses claimed `claims`, when it
/// shows `shown` under the attacker's id.
fn listing(shown: Option<f64>, claims: &[f32]) -> &'static str {
    let close = |c: f32| {
        shown.is_some_and(|s| (s - f64::from(c)).abs() <= 1e-3 * f64::from(c.abs()).max(1.0))
    };
    match claims.iter().copied().find(|&c| close(c)) {
        // No site can score outside [0, 1]: showing it believes the impossible.
        Some(claim) if !(0.0..=1.0).contains(&claim) => "score_believed",
        // A score a site could have given, under the attacker's own id: its word, which nobody
        // can check, and no judgement of the release.
        Some(_) => "score_listed",
        None => "score_ignored",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_impossible_score_shown_is_believed() {
        assert_eq!(listing(Some(1e30), &[0.0, 1e30]), "score_believed");
        assert_eq!(listing(Some(-1e30), &[1.0, -1e30]), "score_believed");
        assert_eq!(listing(Some(1.0), &[0.0, 1.0]), "score_listed");
        assert_eq!(listing(Some(0.66), &[0.0, 1.0]), "score_ignored");
        assert_eq!(listing(None, &[0.0, 1e30]), "score_ignored");
    }
}
