//! Hyper-parameters chosen on source validation only, never on the target (docs/algorithms.md §6).
//!
//! `fedge eval --tune` runs every algorithm over a small grid of its own knobs (FedProx's `μ`,
//! FedDIM's `λ`, FedDDL's `λ` (`cr`), Stable-FedADG's `λ0` with `λ1 = 1 − λ0`, server
//! momentum's `β`, FedOMG's `κ`; the product for combinations) and keeps,
//! per algorithm, the setting whose runs have the highest mean best source-validation accuracy
//! over all targets and seeds. Only then is the target accuracy of that setting reported. Plain
//! FedAvg has no knob of its own; the shared ones (learning rate, epochs, batch) stay fixed for
//! every algorithm so that the comparison is about the methods.

use super::{Algorithm, RunResult};
use fedge_coordinator::strategy::StrategyKind;
use fedge_wire::Objective;

/// The settings `--tune` tries for `algorithm`, each named `name[knob=value,...]`; just the
/// algorithm itself when it has no knob.
pub fn grid(algorithm: &Algorithm) -> Vec<Algorithm> {
    // Each side's settings; `None` where the side has no knob of its own.
    let knob = |name: &'static str, values: [f32; 3]| values.map(|v| Some((name, v))).to_vec();
    let objective = match algorithm.objective {
        Objective::FedProx => knob("mu", [0.001, 0.01, 0.1]),
        Objective::FedDim => knob("lambda", [0.001, 0.01, 0.1]),
        Objective::FedDdl => knob("cr", [0.1, 0.3, 1.0]),
        Objective::StableFedAdg => knob("lambda0", [0.5, 0.7, 0.85]),
        Objective::CrossEntropy => vec![None],
    };
    let strategy = match algorithm.strategy.strategy {
        StrategyKind::Fedavgm => knob("beta", [0.5, 0.7, 0.9]),
        StrategyKind::Fedomg => knob("kappa", [0.25, 0.5, 1.0]),
        StrategyKind::Fedavg => vec![None],
    };
    let mut out = Vec::new();
    for o in &objective {
        for s in &strategy {
            let knobs: Vec<(&str, f32)> = [*o, *s].into_iter().flatten().collect();
            if knobs.is_empty() {
                return vec![algorithm.clone()];
            }
            let mut variant = algorithm.clone();
            for &(knob, value) in &knobs {
                match knob {
                    "mu" => variant.prox_mu = value,
                    "lambda" => variant.insight_lambda = value,
                    "cr" => variant.contrastive_weight = value,
                    "lambda0" => variant.adversarial_weight = value,
                    "beta" => variant.strategy.server_momentum = value,
                    _ => variant.strategy.kappa = f64::from(value),
                }
            }
            let settings: Vec<String> = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            variant.name = format!("{}[{}]", algorithm.name, settings.join(","));
            out.push(variant);
        }
    }
    out
}

/// The setting kept for one algorithm, with the evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The algorithm as asked for.
    pub algorithm: String,
    /// The setting kept.
    pub chosen: String,
    /// Every setting tried with its mean best source-validation accuracy.
    pub source_val: Vec<(String, f32)>,
}

/// Keeps, for each `(algorithm, its grid)`, the setting with the highest mean best
/// source-validation accuracy over its runs (the first on a tie); returns the kept runs, in
/// their original order, and the choices.
pub fn choose(
    grids: &[(Algorithm, Vec<Algorithm>)],
    results: &[RunResult],
) -> (Vec<RunResult>, Vec<Choice>) {
    let mut choices = Vec::new();
    for (algorithm, variants) in grids {
        let source_val: Vec<(String, f32)> = variants
            .iter()
            .map(|v| {
                let vals: Vec<f32> = results
                    .iter()
                    .filter(|r| r.algorithm == v.name)
                    .map(|r| r.best_source_val)
                    .collect();
                (
                    v.name.clone(),
                    vals.iter().sum::<f32>() / vals.len().max(1) as f32,
                )
            })
            .collect();
        let mut best = 0;
        for (i, (_, val)) in source_val.iter().enumerate() {
            if *val > source_val[best].1 {
                best = i;
            }
        }
        choices.push(Choice {
            algorithm: algorithm.name.clone(),
            chosen: source_val[best].0.clone(),
            source_val,
        });
    }
    let kept = results
        .iter()
        .filter(|r| choices.iter().any(|c| c.chosen == r.algorithm))
        .cloned()
        .collect();
    (kept, choices)
}

#[cfg(test)]
mod tests {
    use super::super::parse_algorithm;
    use super::*;

    #[test]
    fn grids_cover_each_knob_and_their_product() {
        assert_eq!(grid(&parse_algorithm("fedavg").unwrap()).len(), 1);
        let prox = grid(&parse_algorithm("fedprox").unwrap());
        let mus: Vec<f32> = prox.iter().map(|a| a.prox_mu).collect();
        assert_eq!(mus, [0.001, 0.01, 0.1]);
        assert_eq!(prox[1].name, "fedprox[mu=0.01]");
        let both = grid(&parse_algorithm("feddim+fedomg").unwrap());
        assert_eq!(both.len(), 9);
        assert_eq!(both[5].name, "feddim+fedomg[lambda=0.01,kappa=1]");
        assert_eq!(
            (both[5].insight_lambda, both[5].strategy.kappa),
            (0.01, 1.0)
        );
        let m = grid(&parse_algorithm("fedavgm").unwrap());
        assert_eq!(m[0].strategy.server_momentum, 0.5);
    }

    #[test]
    fn the_setting_with_the_best_source_validation_wins_whatever_the_target_says() {
        let algorithm = parse_algorithm("fedprox").unwrap();
        let variants = grid(&algorithm);
        let run = |name: &str, val: f32, target: f32| RunResult {
            algorithm: name.into(),
            target: "t".into(),
            seed: 0,
            best_round: 1,
            best_source_val: val,
            target_accuracy: target,
            final_target_accuracy: target,
            curve: vec![],
            train_seconds_per_round: 0.1,
            final_params: vec![],
            epsilon: None,
            rejected: Default::default(),
        };
        let results = vec![
            run(&variants[0].name, 0.80, 0.95),
            run(&variants[1].name, 0.90, 0.10),
            run(&variants[1].name, 0.70, 0.10),
            run(&variants[2].name, 0.81, 0.50),
        ];
        let (kept, choices) = choose(&[(algorithm, variants.clone())], &results);
        assert_eq!(choices[0].chosen, variants[2].name, "{choices:?}");
        assert_eq!(kept, vec![results[3].clone()]);
    }
}
