//! Tests of the strategy trait's shared arithmetic, FedAvg, server momentum and the build.

use super::momentum::MOMENTUM_KEY;
use super::*;

fn held(updates: &[(&str, u32, &[f32])]) -> RoundUpdates {
    RoundUpdates::from_updates(updates[0].2.len(), true, updates.iter().copied())
}

fn step(s: &mut impl Strategy, global: &[f32], updates: &[(&str, u32, &[f32])]) -> Vec<f32> {
    s.aggregate(global, &held(updates), &[]).params
}

#[test]
fn fedavg_weights_deltas_by_sample_count() {
    let next = step(
        &mut FedAvg,
        &[10.0, 20.0],
        &[("a", 1, &[1.0, 0.0]), ("b", 3, &[0.0, 4.0])],
    );
    assert_eq!(next, vec![10.25, 23.0]);
}

#[test]
fn fedavg_of_one_update_applies_it_exactly() {
    let next = step(
        &mut FedAvg,
        &[1.0, -1.0, 0.5],
        &[("a", 7, &[0.5, 0.25, -0.5])],
    );
    assert_eq!(next, vec![1.5, -0.75, 0.0]);
}

#[test]
fn zero_total_weight_leaves_model_unchanged() {
    let next = step(&mut FedAvg, &[1.0, 2.0], &[("a", 0, &[5.0, 5.0])]);
    assert_eq!(next, vec![1.0, 2.0]);
}

#[test]
fn server_momentum_with_zero_beta_and_unit_rate_is_the_inner_strategy() {
    let updates: [(&str, u32, &[f32]); 2] = [("a", 1, &[1.0, 0.0]), ("b", 3, &[0.0, 4.0])];
    let mut m = ServerMomentum::new(FedAvg, 0.0, 1.0).unwrap();
    assert_eq!(
        step(&mut m, &[10.0, 20.0], &updates),
        step(&mut FedAvg, &[10.0, 20.0], &updates)
    );
}

#[test]
fn server_momentum_accumulates_directions() {
    let mut m = ServerMomentum::new(FedAvg, 0.5, 2.0).unwrap();
    let update: [(&str, u32, &[f32]); 1] = [("a", 1, &[1.0])];
    // v = 1, θ = 0 + 2·1 = 2; then v = 0.5 + 1 = 1.5, θ = 2 + 3 = 5.
    let once = step(&mut m, &[0.0], &update);
    assert_eq!(once, vec![2.0]);
    let twice = m.aggregate(&once, &held(&update), &[]);
    assert_eq!(twice.params, vec![5.0]);
    assert_eq!(twice.report.momentum_norm, Some(1.5));
    assert_eq!(m.velocity(), &[1.5]);
    assert!(ServerMomentum::new(FedAvg, 1.0, 1.0).is_err());
    assert!(ServerMomentum::new(FedAvg, 0.5, 0.0).is_err());
}

#[test]
fn momentum_buffer_survives_a_save_and_restore() {
    let update: [(&str, u32, &[f32]); 1] = [("a", 1, &[1.0, -2.0])];
    let mut a = ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap();
    let theta = step(&mut a, &[0.0, 0.0], &update);
    let saved = a.state();
    assert_eq!(saved.get(MOMENTUM_KEY), Some(&vec![1.0, -2.0]));
    let mut b = ServerMomentum::new(FedAvg, 0.5, 1.0).unwrap();
    b.restore(&saved).unwrap();
    assert_eq!(step(&mut a, &theta, &update), step(&mut b, &theta, &update));
    let mut bad = saved.clone();
    bad.insert(MOMENTUM_KEY.into(), vec![f32::NAN, 0.0]);
    assert!(b.restore(&bad).is_err());
    assert!(FedAvg.restore(&saved).is_err());
}

#[test]
fn momentum_can_wrap_fedomg_and_bad_parameters_are_rejected() {
    let config = StrategyConfig {
        strategy: StrategyKind::Fedomg,
        server_momentum: 0.5,
        ..StrategyConfig::default()
    };
    let built = config.build().unwrap();
    assert_eq!(built.name(), "fedomg+momentum");
    assert!(built.needs_dots());
    let bad = StrategyConfig {
        strategy: StrategyKind::Fedomg,
        kappa: -1.0,
        ..StrategyConfig::default()
    };
    assert!(bad.build().err().unwrap().to_string().contains("kappa"));
}

#[test]
fn unknown_names_fail_at_load_listing_the_valid_ones() {
    for (text, valid) in [
        ("strategy = \"fedfoo\"", "`fedavg`, `fedavgm`, `fedomg`"),
        ("solver = \"newton\"", "`reference` or `converged`"),
        (
            "robust = \"krum\"",
            "`none`, `clip`, `trimmed-mean`, `median`",
        ),
    ] {
        let err = toml::from_str::<StrategyConfig>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(valid), "{err}");
    }
    for kind in [
        StrategyKind::Fedavg,
        StrategyKind::Fedavgm,
        StrategyKind::Fedomg,
    ] {
        let text = format!("strategy = \"{}\"", kind.name());
        let config: StrategyConfig = toml::from_str(&text).unwrap();
        assert_eq!(config.build().unwrap().name(), kind.name());
        assert_eq!(kind.name().parse::<StrategyKind>(), Ok(kind));
    }
    let err = "fedfoo".parse::<StrategyKind>().unwrap_err().to_string();
    assert!(err.contains("fedavg, fedavgm, fedomg"), "{err}");
}

#[test]
fn every_closed_set_is_spelled_the_same_in_toml_json_and_on_the_command_line() {
    use clap::ValueEnum;
    fn check<T>(all: &[T], name: fn(T) -> &'static str)
    where
        T: Copy + PartialEq + std::fmt::Debug + serde::Serialize + ValueEnum,
        T: std::str::FromStr + serde::de::DeserializeOwned,
        <T as std::str::FromStr>::Err: std::fmt::Debug,
    {
        for &kind in all {
            let text = name(kind);
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{text}\""));
            let back: T = serde_json::from_str(&format!("\"{text}\"")).unwrap();
            assert_eq!(back, kind);
            let value = kind.to_possible_value().unwrap();
            assert_eq!(value.get_name(), text);
            assert_eq!(text.parse::<T>().unwrap(), kind);
        }
    }
    check(StrategyKind::ALL, StrategyKind::name);
    check(SolverKind::ALL, SolverKind::name);
    check(RobustKind::ALL, RobustKind::name);
    check(PrivacyMode::ALL, PrivacyMode::name);
    check(SamplingKind::ALL, SamplingKind::name);
}
