//! `fedge bench gate`: how often the release gate holds a candidate, at one evaluation site of
//! `n` images, for a candidate as good as the release served, 5 points worse and 5 points
//! better. The paired rule the coordinator runs (`fedge_coordinator::release::gate`, exact
//! McNemar at level 0.05) exactly and by simulation through its own `judge`; the rule before
//! it (mean accuracy at most 0.5 points lower and no class more than 2 points lower, 10
//! classes of equal size) by simulation. Images are independent; the served release is right
//! on 80 % of them.

use fedge_coordinator::release::gate::{self, GateRules, SiteScore};
use fedge_wire::{PairedScore, SiteEvaluation};
use rand::{Rng, SeedableRng};

/// The served release's accuracy in every case.
pub const SERVED: f64 = 0.80;

/// One case: images, and the chance an image is right for the candidate alone (`gain`) and
/// for the served release alone (`lose`).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Case {
    /// Images at the site.
    pub images: u32,
    /// P(candidate alone right).
    pub gain: f64,
    /// P(served alone right).
    pub lose: f64,
}

impl Case {
    /// The candidate's accuracy minus the served one's, in points.
    pub fn difference_points(&self) -> f64 {
        100.0 * (self.gain - self.lose)
    }
}

/// How often each rule holds the candidate of a case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Rates {
    /// The case.
    pub case: Case,
    /// The paired rule, exactly.
    pub paired_exact: f64,
    /// The paired rule, simulated through `gate::judge`.
    pub paired_simulated: f64,
    /// The rule before it, simulated.
    pub before_simulated: f64,
}

/// The cases of the table: 100, 300 and 1,000 images; equal, 5 points worse, 5 points better;
/// 10 % and 20 % of the images judged differently by the two releases.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for images in [100, 300, 1000] {
        for disagree in [0.10, 0.20] {
            for shift in [0.0, -0.05, 0.05] {
                cases.push(Case {
                    images,
                    gain: (disagree + shift) / 2.0,
                    lose: (disagree - shift) / 2.0,
                });
            }
        }
    }
    cases
}

/// The rates of `case` over `trials` simulated sites drawn from `seed`.
pub fn rates(case: Case, trials: u32, seed: u64) -> Rates {
    let rules = GateRules {
        significance: 0.05,
        min_sites: 1,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut paired_holds, mut before_holds) = (0u32, 0u32);
    let classes = 10usize;
    for _ in 0..trials {
        let (mut gained, mut lost) = (0u32, 0u32);
        let (mut right_c, mut right_s, mut seen) = (
            vec![0u32; classes],
            vec![0u32; classes],
            vec![0u32; classes],
        );
        for i in 0..case.images {
            let k = i as usize % classes;
            seen[k] += 1;
            // Both right with SERVED − lose, served alone lose, candidate alone gain.
            let u: f64 = rng.random();
            let (c, s) = if u < case.lose {
                (false, true)
            } else if u < case.lose + case.gain {
                (true, false)
            } else if u < SERVED + case.gain {
                (true, true)
            } else {
                (false, false)
            };
            gained += u32::from(c && !s);
            lost += u32::from(s && !c);
            right_c[k] += u32::from(c);
            right_s[k] += u32::from(s);
        }
        let n = case.images;
        let candidate = SiteEvaluation {
            model_round: 2,
            accuracy: right_c.iter().sum::<u32>() as f32 / n as f32,
            class_accuracy: Vec::new(),
            samples: n,
        };
        let paired = PairedScore {
            against: String::new(),
            samples: n,
            gained,
            lost,
        };
        let site = SiteScore {
            site: "site",
            candidate: &candidate,
            paired: &paired,
        };
        let verdict = gate::judge(&[site], &rules).expect("one site is enough");
        paired_holds += u32::from(!verdict.pass);
        // The rule before: means within 0.5 points, no class down more than 2 points.
        let mean_drop = 100.0
            * (f64::from(right_s.iter().sum::<u32>()) - f64::from(right_c.iter().sum::<u32>()))
            / f64::from(n);
        let class_drop = (0..classes)
            .map(|k| {
                100.0 * (f64::from(right_s[k]) - f64::from(right_c[k])) / f64::from(seen[k].max(1))
            })
            .fold(f64::NEG_INFINITY, f64::max);
        before_holds += u32::from(mean_drop > 0.5 || class_drop > 2.0);
    }
    Rates {
        case,
        paired_exact: gate::hold_probability(case.images, case.gain, case.lose, 0.05),
        paired_simulated: f64::from(paired_holds) / f64::from(trials),
        before_simulated: f64::from(before_holds) / f64::from(trials),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulation_agrees_with_the_exact_rate_and_the_old_rule_held_good_candidates() {
        let equal = Case {
            images: 300,
            gain: 0.05,
            lose: 0.05,
        };
        let r = rates(equal, 4000, 1);
        // 4,000 trials: a binomial standard error of at most 0.008.
        assert!((r.paired_exact - r.paired_simulated).abs() < 0.03, "{r:?}");
        assert!(r.paired_exact <= 0.05, "{r:?}");
        assert!(r.before_simulated > 0.5, "{r:?}");
    }
}
