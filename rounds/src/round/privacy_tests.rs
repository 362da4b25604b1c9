//! Central DP in the round machine, with simulated time: the draw, the expected count the
//! strategy divides by, the accountant against direct composition (and across a checkpoint),
//! the stop at `target_epsilon`, and what central DP turns off.

use fedge_privacy::{Accountant, GaussianNoise, Sampling};

use super::tests::{M, drain, reports, tasks, update};
use super::*;
use crate::strategy::{CentralDp, DpFedAvg, SamplingKind};

fn dp(sampling: SamplingKind, target_epsilon: Option<f64>) -> CentralDp {
    CentralDp {
        clip_norm: 1.0,
        noise_multiplier: 1.1,
        delta: 1e-5,
        target_epsilon,
        sampling,
        adaptive: None,
    }
}

fn clients(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("d{i:02}")).collect()
}

fn private_machine(n: usize, fraction: f32, rounds: u64, settings: CentralDp) -> Rounds {
    with_min_clients(n, n, fraction, rounds, settings)
}

/// `n` devices come online one by one; rounds open once `min_clients` are.
fn with_min_clients(
    n: usize,
    min_clients: usize,
    fraction: f32,
    rounds: u64,
    settings: CentralDp,
) -> Rounds {
    let config = RoundConfig {
        rounds,
        fraction,
        min_clients,
        min_updates: 1,
        round_timeout_ms: 1_000,
        seed: 3,
        privacy: Some(settings),
        ..RoundConfig::default()
    };
    let strategy = DpFedAvg::new(settings, GaussianNoise::from_seed(17));
    let mut m = Rounds::new(config, Box::new(strategy), vec![0.0; M]);
    for c in clients(n) {
        m.handle_client_status(&c, true, 0);
    }
    m
}

/// Answers every open round with each selected device's update until the machine finishes or
/// `limit` rounds ran; returns the reports and the sizes of the draws.
fn run(m: &mut Rounds, limit: usize, delta: [f32; M]) -> (Vec<RoundReport>, Vec<usize>) {
    let (mut all, mut sizes) = (Vec::new(), Vec::new());
    let mut now = 10;
    let mut out = drain(m);
    for _ in 0..limit {
        let Some(task) = tasks(&out).pop() else {
            break;
        };
        sizes.push(task.selected.len());
        for c in &task.selected {
            m.handle_packet(c, &update(c, task.round, delta, 5), now);
            now += 1;
        }
        out = drain(m);
        all.extend(reports(&out));
    }
    (all, sizes)
}

#[test]
fn the_accountant_after_n_rounds_is_the_direct_composition_and_survives_a_checkpoint() {
    let settings = dp(SamplingKind::Poisson, None);
    let mut m = private_machine(20, 0.25, 0, settings);
    let (done, sizes) = run(&mut m, 6, [0.1, 0.0, -0.1, 0.2]);
    assert_eq!(done.len(), 6);
    assert!(done.iter().all(|r| r.aggregated));
    let mut direct = Accountant::default();
    for _ in 0..6 {
        direct
            .compose(Sampling::Poisson { rate: 0.25 }, 1.1, 1)
            .unwrap();
    }
    assert_eq!(m.accountant(), Some(&direct));
    let spent = m.privacy_spent().unwrap();
    assert_eq!(
        spent.amplified_epsilon,
        direct.epsilon(1e-5).unwrap().epsilon
    );
    // Reported: at least the most selected device's own, unamplified ε.
    let own = Accountant::default()
        .epsilon_after(
            Sampling::Poisson { rate: 1.0 },
            1.1,
            spent.most_selected,
            1e-5,
        )
        .unwrap()
        .epsilon;
    assert_eq!(spent.epsilon, own.max(spent.amplified_epsilon));
    assert_eq!(
        (spent.rounds, spent.delta, spent.exhausted),
        (6, 1e-5, false)
    );
    // Each round's report carries the ε spent after it, never falling (it stays when no
    // device's count of selections passes the highest), and the amplified one growing.
    let eps: Vec<f64> = done.iter().map(|r| r.privacy.unwrap().epsilon).collect();
    assert!(
        eps.windows(2).all(|w| w[0] <= w[1]) && eps[0] < eps[5],
        "{eps:?}"
    );
    let amplified: Vec<f64> = (done.iter())
        .map(|r| r.privacy.unwrap().amplified_epsilon)
        .collect();
    assert!(amplified.windows(2).all(|w| w[0] < w[1]), "{amplified:?}");
    assert_eq!(eps[5], spent.epsilon);
    // The strategy divided by q × online, not by the draw's size.
    for (report, size) in done.iter().zip(&sizes) {
        let aggregation = report.aggregation.as_ref().unwrap();
        assert_eq!(aggregation.dp_expected, Some(0.25 * 20.0));
        assert_eq!(report.reported.len(), *size);
    }

    // Through the checkpoint's binary body (postcard, as `store::checkpoint` writes it) and
    // back, ε continues where it was.
    let bytes = postcard::to_stdvec(&m.checkpoint()).unwrap();
    let saved: Checkpoint = postcard::from_bytes(&bytes).unwrap();
    let strategy = DpFedAvg::new(settings, GaussianNoise::from_seed(18));
    let config = m.config().clone();
    let mut resumed = Rounds::resume(config, Box::new(strategy), saved, M).unwrap();
    assert_eq!(resumed.accountant(), Some(&direct));
    for c in clients(20) {
        resumed.handle_client_status(&c, true, 0);
    }
    run(&mut resumed, 1, [0.1; M]);
    direct
        .compose(Sampling::Poisson { rate: 0.25 }, 1.1, 1)
        .unwrap();
    assert_eq!(resumed.accountant(), Some(&direct));

    // A checkpoint without central DP's accountant, or a federation without central DP.
    let plain = Rounds::new(
        RoundConfig::default(),
        Box::new(crate::strategy::FedAvg),
        vec![0.0; M],
    );
    let foreign = Rounds::resume(
        RoundConfig::default(),
        Box::new(DpFedAvg::new(settings, GaussianNoise::from_seed(1))),
        m.checkpoint(),
        M,
    );
    assert!(
        matches!(foreign, Err(ResumeError::Privacy(_))),
        "{:?}",
        foreign.err()
    );
    assert!(plain.checkpoint().privacy.is_none());
}

#[test]
fn poisson_draws_vary_in_size_around_q_times_online_and_reproduce_with_the_seed() {
    let settings = dp(SamplingKind::Poisson, None);
    let draw = || {
        let mut m = private_machine(40, 0.3, 0, settings);
        run(&mut m, 60, [0.0; M]).1
    };
    let sizes = draw();
    assert_eq!(sizes, draw());
    assert!(sizes.iter().any(|s| *s != sizes[0]), "{sizes:?}");
    let n = sizes.len() as f64;
    let mean = sizes.iter().sum::<usize>() as f64 / n;
    // Binomial(40, 0.3): mean 12, std √8.4 per draw; five standard errors of the mean.
    assert!((mean - 12.0).abs() < 5.0 * (8.4f64 / n).sqrt(), "{mean}");
}

#[test]
fn fixed_size_rounds_compose_the_fixed_size_bound_with_half_the_multiplier() {
    let settings = dp(SamplingKind::Fixed, None);
    // The first round opens when 3 devices are online, the next ones draw from all 10.
    let mut m = with_min_clients(10, 3, 0.3, 0, settings);
    let (done, sizes) = run(&mut m, 3, [0.1; M]);
    assert_eq!(sizes, vec![3, 3, 3]);
    let mut direct = Accountant::default();
    let of = |population| Sampling::FixedSize {
        sample: 3,
        population,
    };
    direct.compose(of(3), 0.55, 1).unwrap();
    direct.compose(of(10), 0.55, 2).unwrap();
    let got = m.accountant().unwrap();
    assert_eq!(got.history(), direct.history());
    for (a, b) in got.rdp().iter().zip(direct.rdp()) {
        assert!((a - b).abs() <= 1e-12 * b.abs(), "{a} vs {b}");
    }
    let expected = done[0].aggregation.as_ref().unwrap().dp_expected;
    assert_eq!(expected, Some(3.0));
}

#[test]
fn target_epsilon_finishes_the_federation_before_it_would_be_passed() {
    let sampling = Sampling::Poisson { rate: 0.5 };
    let empty = Accountant::default();
    // A target that allows exactly k rounds.
    let eps = |n: u64| empty.epsilon_after(sampling, 1.1, n, 1e-5).unwrap().epsilon;
    let k = 4;
    let target = (eps(k) + eps(k + 1)) / 2.0;
    assert_eq!(
        empty
            .rounds_within(sampling, 1.1, 1e-5, target, 100)
            .unwrap(),
        k
    );
    let mut m = private_machine(6, 0.5, 0, dp(SamplingKind::Poisson, Some(target)));
    let (done, _) = run(&mut m, 20, [0.1; M]);
    // The amplified ε allows k rounds; the most selected device's own ε (unamplified: the
    // tasks name who was drawn) may stop the federation earlier.
    assert!((1..=k as usize).contains(&done.len()), "{}", done.len());
    assert_eq!(m.phase(), Phase::Finished);
    let spent = m.privacy_spent().unwrap();
    assert!(spent.exhausted && spent.epsilon <= target, "{spent:?}");
    let once_more = Accountant::default()
        .epsilon_after(
            Sampling::Poisson { rate: 1.0 },
            1.1,
            spent.most_selected + 1,
            1e-5,
        )
        .unwrap()
        .epsilon;
    assert!(
        done.len() == k as usize || once_more > target,
        "stopped at {} rounds with {spent:?}",
        done.len()
    );
    assert!(done.last().unwrap().privacy.unwrap().exhausted);
    assert!(!done[0].privacy.unwrap().exhausted);
    assert!(eps(k + 1) > target);
    // Nothing more opens, whoever comes online.
    m.handle_client_status("late", true, 99_999);
    m.handle_timeout(99_999);
    assert!(tasks(&drain(&mut m)).is_empty());

    // A budget one round cannot fit: no round opens at all.
    let mut none = private_machine(6, 0.5, 0, dp(SamplingKind::Poisson, Some(eps(1) / 2.0)));
    let out = drain(&mut none);
    assert!(tasks(&out).is_empty());
    assert!(out.contains(&Output::Finished));
    assert_eq!(none.phase(), Phase::Finished);
}

#[test]
fn central_dp_clips_instead_of_dropping_and_withholds_the_devices_own_metrics() {
    let settings = dp(SamplingKind::Fixed, None);
    let mut m = private_machine(3, 1.0, 0, settings);
    let out = drain(&mut m);
    let task = tasks(&out).pop().unwrap();
    // One delta 10⁶ × the others': the norm-ratio guard would drop it; clipping bounds it.
    for (i, c) in task.selected.iter().enumerate() {
        let scale = if i == 0 { 1e6 } else { 0.01 };
        m.handle_packet(c, &update(c, 1, [scale; M], 5), 10);
    }
    let report = reports(&drain(&mut m)).pop().unwrap();
    assert!(report.aggregated, "{report:?}");
    assert_eq!(report.reported.len(), 3);
    assert!(report.rejected.is_empty());
    let aggregation = report.aggregation.unwrap();
    assert_eq!(aggregation.dp_clipped, Some(1));
    assert_eq!(
        (report.train_loss, report.source_val_accuracy),
        (None, None)
    );
    let norm: f64 = m
        .params()
        .iter()
        .map(|v| f64::from(*v).powi(2))
        .sum::<f64>()
        .sqrt();
    // (C + 2·0.02 + noise of std 1.1/3 per value over 4 values, far out) / E.
    assert!(norm < (1.0 + 0.04 + 1.1 * 10.0) / 3.0, "{norm}");
}

#[test]
fn a_journaled_round_is_drawn_afresh_under_central_dp() {
    let settings = dp(SamplingKind::Poisson, None);
    let mut m = private_machine(4, 1.0, 0, settings);
    let task = tasks(&drain(&mut m)).pop().unwrap();
    let log = OpenRoundLog {
        opened: Some(OpenedRound {
            round: task.round,
            selected: task.selected.clone(),
            base: params_fingerprint(m.params()),
            run: 0,
        }),
        accepted: Vec::new(),
    };
    let mut fresh = Rounds::new(
        m.config().clone(),
        Box::new(DpFedAvg::new(settings, GaussianNoise::from_seed(1))),
        vec![0.0; M],
    );
    assert_eq!(fresh.restore_round(log, 0), None);
}

#[test]
fn a_checkpoint_cannot_switch_the_sampling_it_spent_epsilon_under() {
    let poisson = dp(SamplingKind::Poisson, None);
    let mut m = private_machine(4, 0.5, 0, poisson);
    run(&mut m, 2, [0.1; M]);
    let fixed = dp(SamplingKind::Fixed, None);
    let config = RoundConfig {
        privacy: Some(fixed),
        ..m.config().clone()
    };
    let strategy = DpFedAvg::new(fixed, GaussianNoise::from_seed(1));
    let err = Rounds::resume(config, Box::new(strategy), m.checkpoint(), M).err();
    let err = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("sampling = \"fixed\" cannot continue it"),
        "{err}"
    );
}

/// The tasks name the selected devices, so amplification by subsampling does not hold against
/// a device or a dashboard: a device drawn `k` times has spent at least the Gaussian mechanism
/// composed `k` times, whatever q says.
#[test]
fn a_device_selected_k_times_has_spent_at_least_k_unamplified_gaussian_steps() {
    let mut m = private_machine(10, 0.1, 10, dp(SamplingKind::Poisson, None));
    let (done, _) = run(&mut m, 10, [0.1; M]);
    assert_eq!(done.len(), 10);
    // Who was drawn, round by round, as every device reads it in the tasks.
    let mut drawn: std::collections::BTreeMap<String, u64> = Default::default();
    for report in &done {
        for device in &report.selected {
            *drawn.entry(device.clone()).or_default() += 1;
        }
    }
    let k = *drawn.values().max().unwrap();
    let spent = m.privacy_spent().unwrap();
    assert_eq!(spent.most_selected, k);
    let unamplified = |steps: u64| {
        Accountant::default()
            .epsilon_after(Sampling::Poisson { rate: 1.0 }, 1.1, steps, 1e-5)
            .unwrap()
            .epsilon
    };
    assert!(spent.epsilon >= unamplified(k), "{spent:?}");
    assert_eq!(spent.epsilon, unamplified(k).max(spent.amplified_epsilon));
    // The amplified figure alone claims far less: what was reported before.
    assert!(spent.amplified_epsilon < unamplified(k) / 2.0, "{spent:?}");
    // The counts survive a checkpoint.
    let saved = m.checkpoint();
    assert_eq!(saved.participation.iter().map(|(_, n)| *n).max(), Some(k));
    let config = RoundConfig {
        fraction: 0.1,
        min_clients: 10,
        min_updates: 1,
        seed: 3,
        privacy: Some(dp(SamplingKind::Poisson, None)),
        ..RoundConfig::default()
    };
    let strategy = DpFedAvg::new(
        dp(SamplingKind::Poisson, None),
        GaussianNoise::from_seed(17),
    );
    let back = Rounds::resume(config, Box::new(strategy), saved, M).unwrap();
    assert_eq!(back.privacy_spent().unwrap().epsilon, spent.epsilon);
}

#[test]
fn no_raw_update_is_journaled_under_central_dp() {
    // The journal is not restored under central DP (a round is drawn afresh), so writing it
    // would only keep un-noised updates on disk.
    let settings = dp(SamplingKind::Poisson, None);
    let config = RoundConfig {
        journal: true,
        rounds: 0,
        fraction: 1.0,
        min_clients: 4,
        min_updates: 1,
        privacy: Some(settings),
        ..RoundConfig::default()
    };
    let strategy = DpFedAvg::new(settings, GaussianNoise::from_seed(17));
    let mut m = Rounds::new(config, Box::new(strategy), vec![0.0; M]);
    let mut outputs = Vec::new();
    for c in clients(4) {
        m.handle_client_status(&c, true, 0);
    }
    let task = tasks(&drain_into(&mut m, &mut outputs)).pop().unwrap();
    for c in &task.selected {
        m.handle_packet(c, &update(c, task.round, [0.1; M], 5), 10);
    }
    drain_into(&mut m, &mut outputs);
    assert!(reports(&outputs).iter().any(|r| r.aggregated));
    let journaled = outputs.iter().filter(|o| matches!(o, Output::Journal(_)));
    assert_eq!(journaled.count(), 0);
}

/// Drains the machine's outputs, keeping a copy of each in `all`.
fn drain_into(m: &mut Rounds, all: &mut Vec<Output>) -> Vec<Output> {
    let out = drain(m);
    all.extend(out.iter().cloned());
    out
}
