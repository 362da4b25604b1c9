//! The evaluation gate's rule (docs/algorithms.md §11): a candidate is promoted only if, on
//! the evaluation-only sites that scored both it and the release served now, its mean accuracy
//! is at least the served release's minus a margin, and no class loses more than a set amount.

use fedge_wire::SiteEvaluation;
use serde::{Deserialize, Serialize};

/// The gate's thresholds, in accuracy points (0–100).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateRules {
    /// Largest drop of the mean accuracy over the sites.
    pub margin_points: f64,
    /// Largest drop of any class's accuracy (mean over the sites that have the class).
    pub class_drop_points: f64,
    /// Sites that must have scored both releases before the gate judges.
    pub min_sites: usize,
}

/// What the gate found, with its numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Whether the candidate may be promoted.
    pub pass: bool,
    /// Sites that scored both releases.
    pub sites: usize,
    /// The candidate's mean accuracy over those sites, in points.
    pub candidate_points: f64,
    /// The served release's mean accuracy over the same sites, in points.
    pub serving_points: f64,
    /// The class that lost the most, if any class was scored by both.
    pub worst_class: Option<String>,
    /// How many points it lost (negative: it gained).
    pub worst_class_drop: f64,
    /// Why, in words, for the log and the status.
    pub reason: String,
}

/// Judges a candidate on `pairs`: for each site, its score of the candidate and of the
/// release served now. `None` while fewer than `rules.min_sites` sites scored both.
pub fn judge(
    pairs: &[(&SiteEvaluation, &SiteEvaluation)],
    classes: &[String],
    rules: &GateRules,
) -> Option<Judgement> {
    if pairs.is_empty() || pairs.len() < rules.min_sites {
        return None;
    }
    let n = pairs.len() as f64;
    let candidate_points = 100.0 * pairs.iter().map(|(c, _)| c.accuracy as f64).sum::<f64>() / n;
    let serving_points = 100.0 * pairs.iter().map(|(_, s)| s.accuracy as f64).sum::<f64>() / n;
    let mut worst: Option<(usize, f64)> = None;
    for class in 0..classes.len() {
        let (mut drop, mut count) = (0.0, 0);
        for (c, s) in pairs {
            let at = |e: &SiteEvaluation| e.class_accuracy.get(class).copied().flatten();
            if let (Some(c), Some(s)) = (at(c), at(s)) {
                drop += 100.0 * (s as f64 - c as f64);
                count += 1;
            }
        }
        if count > 0 {
            let drop = drop / count as f64;
            if worst.is_none_or(|(_, w)| drop > w) {
                worst = Some((class, drop));
            }
        }
    }
    let worst_class_drop = worst.map_or(0.0, |(_, d)| d);
    let worst_class = worst.map(|(k, _)| classes[k].clone());
    let mean_ok = candidate_points >= serving_points - rules.margin_points;
    let class_ok = worst_class_drop <= rules.class_drop_points;
    let reason = match (mean_ok, class_ok) {
        (true, true) => format!(
            "{candidate_points:.1} % against {serving_points:.1} % on {} site(s), no class down \
             more than {:.1} points",
            pairs.len(),
            rules.class_drop_points
        ),
        (false, _) => format!(
            "mean accuracy {candidate_points:.1} % against {serving_points:.1} % on {} site(s): \
             more than {:.1} points lower",
            pairs.len(),
            rules.margin_points
        ),
        (true, false) => format!(
            "class {:?} down {worst_class_drop:.1} points (more than {:.1})",
            worst_class.as_deref().unwrap_or_default(),
            rules.class_drop_points
        ),
    };
    Some(Judgement {
        pass: mean_ok && class_ok,
        sites: pairs.len(),
        candidate_points,
        serving_points,
        worst_class,
        worst_class_drop,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(accuracy: f32, classes: &[Option<f32>]) -> SiteEvaluation {
        SiteEvaluation {
            model_round: 1,
            accuracy,
            class_accuracy: classes.to_vec(),
            samples: 100,
        }
    }

    const RULES: GateRules = GateRules {
        margin_points: 0.5,
        class_drop_points: 2.0,
        min_sites: 1,
    };

    fn names() -> Vec<String> {
        vec!["ok".into(), "scratch".into()]
    }

    #[test]
    fn a_candidate_within_the_margin_passes_and_one_below_it_is_held() {
        let served = eval(0.800, &[Some(0.8), Some(0.8)]);
        let close = eval(0.797, &[Some(0.797), Some(0.797)]);
        let verdict = judge(&[(&close, &served)], &names(), &RULES).unwrap();
        assert!(verdict.pass, "{verdict:?}");
        assert!((verdict.candidate_points - 79.7).abs() < 1e-4);
        let worse = eval(0.79, &[Some(0.79), Some(0.79)]);
        let verdict = judge(&[(&worse, &served)], &names(), &RULES).unwrap();
        assert!(!verdict.pass);
        assert!(
            verdict.reason.contains("mean accuracy"),
            "{}",
            verdict.reason
        );
    }

    #[test]
    fn a_class_that_drops_holds_a_candidate_whose_mean_rose() {
        let served = eval(0.80, &[Some(0.90), Some(0.70)]);
        let skewed = eval(0.85, &[Some(1.00), Some(0.65)]);
        let verdict = judge(&[(&skewed, &served)], &names(), &RULES).unwrap();
        assert!(!verdict.pass);
        assert_eq!(verdict.worst_class.as_deref(), Some("scratch"));
        assert!((verdict.worst_class_drop - 5.0).abs() < 1e-3);
        // A class a site has no sample of does not count at that site.
        let blind = eval(0.85, &[Some(1.00), None]);
        assert!(judge(&[(&blind, &served)], &names(), &RULES).unwrap().pass);
    }

    #[test]
    fn the_gate_waits_for_enough_sites() {
        let served = eval(0.8, &[]);
        let rules = GateRules {
            min_sites: 2,
            ..RULES
        };
        assert_eq!(judge(&[(&served, &served)], &names(), &rules), None);
        assert_eq!(judge(&[], &names(), &RULES), None);
        assert!(judge(&[(&served, &served); 2], &names(), &rules).is_some());
    }
}
