//! Tests of central DP-FedAvg (docs/algorithms.md §8): the clip bound on one device's
//! influence, the noise's scale, the division by the expected (not the observed) count, the
//! weights, the momentum wrapper and the refused combinations.

use fedge_privacy::GaussianNoise;

use super::*;
use crate::strategy::dp::AdaptiveClip;

fn settings(clip_norm: f64, noise_multiplier: f64) -> CentralDp {
    CentralDp {
        clip_norm,
        noise_multiplier,
        delta: 1e-5,
        target_epsilon: None,
        sampling: SamplingKind::Poisson,
        adaptive: None,
    }
}

/// One aggregation of `updates` from `global` with a fresh seeded strategy expecting `expected`
/// participants.
fn aggregate(
    dp: CentralDp,
    seed: u64,
    expected: f64,
    global: &[f32],
    updates: &[(&str, u32, Vec<f32>)],
) -> Aggregated {
    let mut s = DpFedAvg::new(dp, GaussianNoise::from_seed(seed));
    s.expect_participants(expected);
    let held = RoundUpdates::from_updates(
        global.len(),
        false,
        updates.iter().map(|(c, n, d)| (*c, *n, d.as_slice())),
    );
    s.aggregate(global, &held, &[])
}

fn distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// A deterministic delta of `len` values and L2 norm `norm`.
fn delta(len: usize, norm: f64, phase: f64) -> Vec<f32> {
    let raw: Vec<f64> = (0..len)
        .map(|j| (j as f64 * 0.37 + phase).sin() + 0.2)
        .collect();
    let n = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
    raw.iter().map(|v| (v * norm / n) as f32).collect()
}

#[test]
fn a_huge_delta_moves_the_model_by_at_most_the_clip_norm_over_the_expected_count() {
    let d = 2_000;
    let global = delta(d, 3.0, 0.5);
    let honest = vec![("a", 10, delta(d, 0.4, 1.0)), ("b", 10, delta(d, 2.5, 2.0))];
    for (clip, sigma, expected, seed) in [
        (1.0, 0.7, 4.0, 1u64),
        (0.25, 1.3, 2.5, 2),
        (3.0, 0.5, 10.0, 3),
    ] {
        let dp = settings(clip, sigma);
        let without = aggregate(dp, seed, expected, &global, &honest);
        for norm in [1e3, 1e8] {
            let mut with = honest.clone();
            with.push(("m", u32::MAX, delta(d, norm, 3.0)));
            let attacked = aggregate(dp, seed, expected, &global, &with);
            // Same seed, same noise: the difference is the attacker's clipped delta over E.
            let moved = distance(&attacked.params, &without.params);
            let bound = clip / expected;
            // f32 rounding of parameters of magnitude ~0.1 moves each by < 1e-8.
            assert!(moved <= bound * (1.0 + 1e-4) + 1e-6, "{moved} > {bound}");
            assert!(
                moved >= bound * 0.99,
                "{moved} ≪ {bound}: the delta was not applied"
            );
            let long = [0.4, 2.5].iter().filter(|n| **n > clip).count();
            assert_eq!(attacked.report.dp_clipped, Some(long + 1));
        }
        // Noise of the chosen scale is there: the step is far longer than the clipped sum's.
        let step = distance(&without.params, &global);
        let noise_norm = sigma * clip * (d as f64).sqrt() / expected;
        assert!(
            (step - noise_norm).abs() < 0.2 * noise_norm + 2.0 * clip / expected,
            "{step} vs {noise_norm}"
        );
    }
}

#[test]
fn the_noise_has_std_noise_multiplier_times_clip_over_the_expected_count() {
    const N: usize = 200_000;
    let global = vec![0.0f32; N];
    let zeros = vec![("a", 1, vec![0.0f32; N]), ("b", 1, vec![0.0f32; N])];
    for (clip, sigma, expected, seed) in [
        (1.0, 1.0, 2.0, 11u64),
        (0.5, 2.2, 7.5, 12),
        (4.0, 0.3, 1.0, 13),
    ] {
        let next = aggregate(settings(clip, sigma), seed, expected, &global, &zeros).params;
        let n = N as f64;
        let mean = next.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
        let var = next
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        let want = sigma * clip / expected;
        // Five standard errors: the mean's σ/√n, the sample std's ≈ σ/√(2n).
        assert!(mean.abs() < 5.0 * want / n.sqrt(), "mean {mean}");
        assert!(
            (var.sqrt() - want).abs() < 5.0 * want / (2.0 * n).sqrt(),
            "std {} vs {want}",
            var.sqrt()
        );
    }
}

#[test]
fn the_sum_is_divided_by_the_expected_count_not_the_observed_one() {
    let d = 64;
    let global = vec![1.0f32; d];
    let one = delta(d, 0.5, 0.1); // shorter than the clip norm: unchanged by clipping
    let updates =
        |k: usize| -> Vec<(&str, u32, Vec<f32>)> { (0..k).map(|_| ("", 1, one.clone())).collect() };
    let names = ["a", "b", "c"];
    let named = |k: usize| -> Vec<(&str, u32, Vec<f32>)> {
        updates(k)
            .into_iter()
            .zip(names)
            .map(|((_, n, d), c)| (c, n, d))
            .collect()
    };
    let dp = settings(1.0, 0.8);
    let expected = 5.0;
    let noise_only = aggregate(dp, 21, expected, &global, &[]).params;
    for k in 1..=3 {
        let next = aggregate(dp, 21, expected, &global, &named(k)).params;
        // Same noise: the difference is k·Δ / E, whatever the k that arrived.
        for j in 0..d {
            let got = f64::from(next[j]) - f64::from(noise_only[j]);
            let want = k as f64 * f64::from(one[j]) / expected;
            assert!(
                (got - want).abs() < 1e-6,
                "k {k}, value {j}: {got} vs {want}"
            );
        }
    }
    // Dropping a device lowers the step by one delta over E (the observed count would rescale).
    let three = aggregate(dp, 21, expected, &global, &named(3)).params;
    let two = aggregate(dp, 21, expected, &global, &named(2)).params;
    let moved = distance(&three, &two);
    assert!((moved - 0.5 / expected).abs() < 1e-5, "{moved}");
    // Without an expected count the observed one is used, and reported.
    let mut s = DpFedAvg::new(dp, GaussianNoise::from_seed(21));
    let held = RoundUpdates::from_updates(d, false, [("a", 1, one.as_slice())]);
    assert_eq!(
        s.aggregate(&global, &held, &[]).report.dp_expected,
        Some(1.0)
    );
}

#[test]
fn every_device_weighs_one_whatever_count_it_claims() {
    let global = vec![0.0f32; 8];
    let a = delta(8, 0.3, 0.0);
    let b = delta(8, 0.6, 1.0);
    let dp = settings(1.0, 0.5);
    let equal = aggregate(
        dp,
        5,
        2.0,
        &global,
        &[("a", 1, a.clone()), ("b", 1, b.clone())],
    );
    let claimed = aggregate(dp, 5, 2.0, &global, &[("a", 1, a), ("b", 1_000_000, b)]);
    assert_eq!(equal.params, claimed.params);
}

#[test]
fn momentum_wraps_dp_fedavg_and_forwards_the_expected_count() {
    let global = vec![0.0f32; 16];
    let updates = [("a", 1, delta(16, 5.0, 0.0))];
    let dp = settings(1.0, 0.5);
    let plain = aggregate(dp, 9, 4.0, &global, &updates);
    let config = StrategyConfig {
        strategy: StrategyKind::Fedavgm,
        server_momentum: 0.5,
        ..StrategyConfig::default()
    };
    let mut wrapped = config
        .build_with(Some((dp, GaussianNoise::from_seed(9))))
        .unwrap();
    assert_eq!(wrapped.name(), "dp-fedavg+momentum");
    wrapped.expect_participants(4.0);
    let held = RoundUpdates::from_updates(
        16,
        false,
        updates.iter().map(|(c, n, d)| (*c, *n, d.as_slice())),
    );
    let first = wrapped.aggregate(&global, &held, &[]);
    // v = direction, θ = θ + v: the first step is DP-FedAvg's.
    assert_eq!(first.params, plain.params);
    assert_eq!(first.report.dp_expected, Some(4.0));
    assert!(first.report.momentum_norm.is_some());
    let fedavg = StrategyConfig::default().build_with(Some((dp, GaussianNoise::from_seed(9))));
    assert_eq!(fedavg.unwrap().name(), "dp-fedavg");
}

#[test]
fn central_dp_with_fedomg_or_a_robust_rule_is_refused_with_the_reason() {
    let dp = settings(1.0, 1.0);
    let fedomg = StrategyConfig {
        strategy: StrategyKind::Fedomg,
        ..StrategyConfig::default()
    };
    let err = fedomg
        .build_with(Some((dp, GaussianNoise::from_seed(0))))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("fedomg") && err.contains("direction"), "{err}");
    assert!(fedomg.build().is_ok());
    for robust in [
        RobustKind::Clip,
        RobustKind::TrimmedMean,
        RobustKind::Median,
    ] {
        let config = StrategyConfig {
            robust,
            ..StrategyConfig::default()
        };
        let err = config
            .build_with(Some((dp, GaussianNoise::from_seed(0))))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(robust.name()) && err.contains("robust = \"none\""),
            "{err}"
        );
        assert!(config.build().is_ok());
    }
}

#[test]
fn fixed_size_sampling_accounts_half_the_noise_multiplier() {
    let mut dp = settings(2.0, 1.2);
    assert_eq!(dp.accounted_noise_multiplier(), 1.2);
    assert!((dp.noise_std() - 2.4).abs() < 1e-12);
    dp.sampling = SamplingKind::Fixed;
    assert_eq!(dp.accounted_noise_multiplier(), 0.6);
}

#[test]
fn adaptive_clipping_follows_the_quantile_of_the_norms_and_survives_a_checkpoint() {
    let d = 50;
    let global = vec![0.0f32; d];
    // Twenty devices whose delta norms are 1, 2, …, 20: the median is about 10.
    let norms: Vec<f64> = (1..=20).map(f64::from).collect();
    let names: Vec<String> = (0..20).map(|i| format!("d{i:02}")).collect();
    let updates: Vec<(&str, u32, Vec<f32>)> = (names.iter().zip(&norms))
        .map(|(n, &norm)| (n.as_str(), 1, delta(d, norm, norm)))
        .collect();
    let adaptive = AdaptiveClip {
        quantile: 0.5,
        learning_rate: 0.2,
        count_noise: 1.0,
    };
    let dp = CentralDp {
        adaptive: Some(adaptive),
        ..settings(0.1, 1.0)
    };
    // The sum's noise pays for the count's: σ_Δ = (1 − 1/4)^(−½).
    assert!((dp.delta_noise_multiplier() - (0.75f64).powf(-0.5)).abs() < 1e-12);
    let mut s = DpFedAvg::new(dp, GaussianNoise::from_seed(9));
    let held = RoundUpdates::from_updates(
        d,
        false,
        updates.iter().map(|(c, n, v)| (*c, *n, v.as_slice())),
    );
    let mut used = Vec::new();
    for _ in 0..80 {
        s.expect_participants(20.0);
        used.push(
            s.aggregate(&global, &held, &[])
                .report
                .dp_clip_norm
                .unwrap(),
        );
    }
    // From 0.1 it rises geometrically, then stays around the median norm.
    assert!(used[1] > used[0] && used[30] > 1.5, "{used:?}");
    let late = &used[60..];
    let mean = late.iter().sum::<f64>() / late.len() as f64;
    assert!(
        (7.0..13.0).contains(&mean),
        "settles at {mean}, not near the median 10: {late:?}"
    );
    // A fixed clip norm never moves.
    let mut fixed = DpFedAvg::new(settings(0.1, 1.0), GaussianNoise::from_seed(9));
    for _ in 0..3 {
        fixed.expect_participants(20.0);
        let used = fixed.aggregate(&global, &held, &[]).report.dp_clip_norm;
        assert_eq!(used, Some(0.1));
    }
    assert!(fixed.state().is_empty());
    // The clip norm is the strategy's state: a restart goes on from it.
    let state = s.state();
    let mut restarted = DpFedAvg::new(dp, GaussianNoise::from_seed(10));
    restarted.restore(&state).unwrap();
    restarted.expect_participants(20.0);
    let next = restarted
        .aggregate(&global, &held, &[])
        .report
        .dp_clip_norm
        .unwrap();
    assert!((next - f64::from(state["dp_clip_norm"][0])).abs() < 1e-6);
    assert!(
        fixed.restore(&state).is_err(),
        "a fixed clip keeps no state"
    );
}

/// A clip norm whose noise scale is not finite (an adaptive clip grown to the largest f64,
/// times σ) must not let the un-noised sum out: the model stays where it was.
#[test]
fn a_noise_scale_that_cannot_be_drawn_withholds_the_aggregate() {
    let global = vec![0.5f32; 8];
    let updates = vec![("a", 1, delta(8, 3.0, 0.1)), ("b", 1, delta(8, 2.0, 0.7))];
    let out = aggregate(settings(f64::MAX, 2.0), 1, 2.0, &global, &updates);
    assert_eq!(out.params, global);
    // A finite scale still moves it.
    let out = aggregate(settings(1.0, 2.0), 1, 2.0, &global, &updates);
    assert_ne!(out.params, global);
}
