//! The evaluation gate's rule (docs/algorithms.md §11): a candidate is held when a strict
//! majority of the evaluation sites that compared it with the release served, on the same
//! images, find it worse by a one-sided exact McNemar test at level `significance`; else it is
//! promoted.
//!
//! Each site reports only its discordant counts ([`PairedScore`]: images the candidate alone
//! got right, `gained`, and images the served release alone got right, `lost`). Under "the
//! candidate is no worse", `lost` given `gained + lost = d` is at most Binomial(d, ½), so the
//! site's p-value is `P(X ≥ lost)` for `X ~ Binomial(d, ½)`; the test's false-hold rate is at
//! most `significance` whatever the accuracies and however many images disagree. A majority
//! of sites, not their pooled counts, decides, so that one lying site moves no verdict unless
//! the honest sites split evenly; with a single site, that site decides alone.

use fedge_wire::{PairedScore, SiteEvaluation};
use serde::{Deserialize, Serialize};

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateRules {
    /// One-sided level of each site's test, in (0, 0.5].
    pub significance: f64,
    /// Sites that must have compared the candidate with the release served before the gate
    /// judges (it waits for every named site until the timeout, then judges on at least
    /// these).
    pub min_sites: usize,
}

/// What one site said of the candidate: its own score of it and the paired counts against
/// the release it serves.
#[derive(Debug, Clone, Copy)]
pub struct SiteScore<'a> {
    /// The site's client id.
    pub site: &'a str,
    /// Its score of the candidate.
    pub candidate: &'a SiteEvaluation,
    /// Its paired counts against the release served.
    pub paired: &'a PairedScore,
}

/// What the gate found, with its numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Whether the candidate may be promoted.
    pub pass: bool,
    /// Sites that compared the two releases.
    pub sites: usize,
    /// Sites whose test found the candidate worse.
    pub regressed: usize,
    /// The candidate's mean accuracy over those sites, in points.
    pub candidate_points: f64,
    /// The served release's mean accuracy over the same sites and images, in points (from
    /// the candidate's and the discordant counts).
    pub serving_points: f64,
    /// Why, in words, for the log and the status.
    pub reason: String,
}

/// The exact one-sided McNemar p-value of "the candidate is worse" (`fedge_wire::paired`,
/// which devices choosing their own correction use too).
pub use fedge_wire::paired::regression_p;

/// Whether one site's paired counts find the candidate worse at `significance`.
pub fn site_regressed(paired: &PairedScore, significance: f64) -> bool {
    regression_p(paired.gained, paired.lost) < significance
}

/// Judges a candidate on the sites' paired scores. `None` while fewer than
/// `rules.min_sites` sites compared it with the release served.
pub fn judge(sites: &[SiteScore<'_>], rules: &GateRules) -> Option<Judgement> {
    if sites.is_empty() || sites.len() < rules.min_sites {
        return None;
    }
    let n = sites.len() as f64;
    let candidate_points = 100.0
        * sites
            .iter()
            .map(|s| f64::from(s.candidate.accuracy))
            .sum::<f64>()
        / n;
    let served = |s: &SiteScore<'_>| {
        let p = s.paired;
        f64::from(s.candidate.accuracy)
            - (f64::from(p.gained) - f64::from(p.lost)) / f64::from(p.samples.max(1))
    };
    let serving_points = 100.0 * sites.iter().map(served).sum::<f64>() / n;
    let worse: Vec<&str> = (sites.iter())
        .filter(|s| site_regressed(s.paired, rules.significance))
        .map(|s| s.site)
        .collect();
    let held = 2 * worse.len() > sites.len();
    let reason = if held {
        format!(
            "worse at {} of {} site(s) by an exact paired test at level {} ({}): {candidate_points:.1} % against {serving_points:.1} %",
            worse.len(),
            sites.len(),
            rules.significance,
            worse.join(", ")
        )
    } else {
        format!(
            "{candidate_points:.1} % against {serving_points:.1} % on {} site(s); worse beyond \
             chance at {} of them, not a majority",
            sites.len(),
            worse.len()
        )
    };
    Some(Judgement {
        pass: !held,
        sites: sites.len(),
        regressed: worse.len(),
        candidate_points,
        serving_points,
        reason,
    })
}

/// The exact probability that one site of `n` images holds a candidate, when each image is
/// right for the candidate alone with probability `p_gain` and for the served release alone
/// with `p_lose` (independently across images): `Σ_d P(D = d) · P(L ≥ c*(d) | d)` with
/// `D ~ Binomial(n, p_gain + p_lose)`, `L | d ~ Binomial(d, p_lose / (p_gain + p_lose))` and
/// `c*(d)` the fewest losses the test holds on. For the benchmark and the tests.
pub fn hold_probability(n: u32, p_gain: f64, p_lose: f64, significance: f64) -> f64 {
    let p_disc = p_gain + p_lose;
    if p_disc <= 0.0 {
        return 0.0;
    }
    let q = p_lose / p_disc;
    let n = u64::from(n);
    let ln_fact = LnFactorials::up_to(n);
    let mut total = 0.0;
    for d in 1..=n {
        let weight = ln_fact.pmf(n, d, p_disc);
        if weight < 1e-300 {
            continue;
        }
        let Some(critical) = ln_fact.critical_losses(d, significance) else {
            continue;
        };
        let tail: f64 = (critical..=d).map(|l| ln_fact.pmf(d, l, q)).sum();
        total += weight * tail;
    }
    total.min(1.0)
}

/// `ln k!` for `k ≤ n`, for binomial probabilities in constant time each.
struct LnFactorials(Vec<f64>);

impl LnFactorials {
    fn up_to(n: u64) -> Self {
        let mut table = Vec::with_capacity(n as usize + 1);
        let mut sum = 0.0;
        table.push(0.0);
        for k in 1..=n {
            sum += (k as f64).ln();
            table.push(sum);
        }
        Self(table)
    }

    /// `P(X = k)` for `X ~ Binomial(n, p)`.
    fn pmf(&self, n: u64, k: u64, p: f64) -> f64 {
        if p <= 0.0 {
            return f64::from(u8::from(k == 0));
        }
        if p >= 1.0 {
            return f64::from(u8::from(k == n));
        }
        let ln_c = self.0[n as usize] - self.0[k as usize] - self.0[(n - k) as usize];
        (ln_c + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()).exp()
    }

    /// The fewest losses of `d` disagreeing images the test holds on, `None` when even `d`
    /// do not: the tail `P(X ≥ l)` of Binomial(d, ½) summed from the top until it reaches
    /// the level.
    fn critical_losses(&self, d: u64, significance: f64) -> Option<u64> {
        let mut tail = 0.0;
        for l in (0..=d).rev() {
            let next = tail + self.pmf(d, l, 0.5);
            if next >= significance {
                return (l < d).then_some(l + 1);
            }
            tail = next;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(accuracy: f32, samples: u32) -> SiteEvaluation {
        SiteEvaluation {
            model_round: 2,
            accuracy,
            class_accuracy: Vec::new(),
            samples,
        }
    }

    fn paired(samples: u32, gained: u32, lost: u32) -> PairedScore {
        PairedScore {
            against: "ab".repeat(32),
            samples,
            gained,
            lost,
        }
    }

    const RULES: GateRules = GateRules {
        significance: 0.05,
        min_sites: 1,
    };

    #[test]
    fn a_site_that_loses_many_more_images_than_it_gains_holds_and_a_tie_does_not() {
        let candidate = eval(0.70, 300);
        let worse = paired(300, 10, 40);
        let sites = [SiteScore {
            site: "eval-1",
            candidate: &candidate,
            paired: &worse,
        }];
        let verdict = judge(&sites, &RULES).unwrap();
        assert!(!verdict.pass, "{verdict:?}");
        assert!((verdict.serving_points - 80.0).abs() < 1e-3, "{verdict:?}");
        let even = paired(300, 25, 25);
        let sites = [SiteScore {
            site: "eval-1",
            candidate: &candidate,
            paired: &even,
        }];
        assert!(judge(&sites, &RULES).unwrap().pass);
    }

    #[test]
    fn one_lying_site_among_three_neither_holds_nor_promotes_alone() {
        let candidate = eval(0.8, 300);
        let (honest_even, lie_worse) = (paired(300, 20, 20), paired(300, 0, 300));
        let sites = |lie: &'static str| {
            [
                ("eval-1", &honest_even),
                ("eval-2", &honest_even),
                (lie, &lie_worse),
            ]
            .map(|(site, paired)| SiteScore {
                site,
                candidate: &candidate,
                paired,
            })
        };
        assert!(judge(&sites("liar"), &RULES).unwrap().pass);
        // And a real regression two sites see is held whatever the third claims.
        let (bad, lie_good) = (paired(300, 5, 40), paired(300, 300, 0));
        let sites =
            [("eval-1", &bad), ("eval-2", &bad), ("liar", &lie_good)].map(|(site, paired)| {
                SiteScore {
                    site,
                    candidate: &candidate,
                    paired,
                }
            });
        assert!(!judge(&sites, &RULES).unwrap().pass);
    }

    #[test]
    fn the_gate_waits_for_enough_sites() {
        let candidate = eval(0.8, 100);
        let even = paired(100, 1, 1);
        let one = SiteScore {
            site: "a",
            candidate: &candidate,
            paired: &even,
        };
        let rules = GateRules {
            min_sites: 2,
            ..RULES
        };
        assert!(judge(&[one], &rules).is_none());
        assert!(judge(&[], &RULES).is_none());
        assert!(judge(&[one, one], &rules).is_some());
    }

    #[test]
    fn an_equally_good_candidate_is_held_at_most_at_the_level_and_a_regression_is_caught() {
        // Equal quality, whatever share of the images disagree: held ≤ 5 %.
        for n in [100, 300, 1000] {
            for disagree in [0.02, 0.1, 0.3] {
                let held = hold_probability(n, disagree / 2.0, disagree / 2.0, 0.05);
                assert!(held <= 0.05, "n {n}, {disagree}: {held}");
            }
        }
        // Five points worse on 1,000 images with 15 % of them disagreeing: caught ≥ 90 %.
        let caught = hold_probability(1000, 0.05, 0.10, 0.05);
        assert!(caught >= 0.9, "{caught}");
    }
}
