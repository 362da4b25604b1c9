//! Local DP in the agent's decisions: what an update carries once privatised, the objectives
//! refused, and the device's accountant in its status and round state.

use fedge_privacy::{Accountant, GaussianNoise, Sampling, l2_norm};
use fedge_wire::Objective;

use super::tests::{drain, identity, send, task, trains};
use super::*;
use crate::local_dp::{LocalDp, LocalPrivacy};

const SIGMA: f64 = 0.5;
const CLIP: f64 = 0.1;

fn settings() -> LocalPrivacy {
    LocalPrivacy {
        local_noise_multiplier: SIGMA,
        local_clip_norm: CLIP,
        delta: 1e-5,
        seed: Some(17),
    }
}

fn private_agent(state: RoundState) -> Agent {
    Agent::new(identity("cam-1", None), state)
        .unwrap()
        .with_local_dp(LocalDp::new(settings(), GaussianNoise::from_seed(17)))
}

/// A round's task for cam-1 with `objective`, updates in lossless f32.
fn task_with(round: u64, objective: Objective) -> RoundTask {
    let mut task = task(round, &["cam-1"], 60_000);
    task.train.objective = objective;
    task.train.update_codec = Codec::F32;
    task
}

/// A deterministic raw delta of `len` values and L2 norm `norm` (not Gaussian-looking).
fn raw_delta(len: usize, norm: f64) -> Vec<f32> {
    let raw: Vec<f64> = (0..len)
        .map(|i| ((i * 7919) % 101) as f64 / 101.0 - 0.3)
        .collect();
    let n = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
    raw.iter().map(|v| (v * norm / n) as f32).collect()
}

fn trained_with(round: u64, delta: Vec<f32>) -> Trained {
    Trained {
        round,
        result: Ok(TrainOutcome {
            params: delta.clone(),
            delta,
            last_epoch_loss: 0.25,
            steps: 3,
            class_stats: Some((vec![1, 1], vec![0.5; 4])),
            prototypes: None,
            features: None,
        }),
        val_accuracy: 0.5,
        seconds: 0.1,
        peak_memory_mb: None,
        data: None,
    }
}

/// Trains round `round` with `delta` and returns the update sent and every output in order.
fn answer(agent: &mut Agent, round: u64, delta: Vec<f32>) -> (ClientUpdate, Vec<Output>) {
    assert_eq!(
        trains(&send(agent, task_with(round, Objective::CrossEntropy), 0)),
        [round]
    );
    agent.handle_trained(trained_with(round, delta));
    let mut outputs = drain(agent);
    let update = outputs
        .iter()
        .find_map(|o| match o {
            Output::Update { frame, .. } => match fedge_wire::decode(frame) {
                Ok(Message::ClientUpdate(update)) => Some(update),
                _ => None,
            },
            _ => None,
        })
        .expect("an update is sent");
    agent.handle_update_sent(Ok(100));
    outputs.extend(drain(agent));
    (update, outputs)
}

#[test]
fn a_long_delta_is_clipped_to_c_before_the_noise() {
    const D: usize = 20_000;
    let raw = raw_delta(D, 100.0 * CLIP);
    let mut agent = private_agent(RoundState::default());
    let (update, _) = answer(&mut agent, 1, raw.clone());
    let sent = update.delta.to_vec();
    assert_eq!(sent.len(), D);
    // What clipping alone makes of the raw delta: the same direction at norm C.
    let scale = CLIP / l2_norm(&raw);
    let noise: Vec<f64> = (sent.iter().zip(&raw))
        .map(|(s, r)| f64::from(*s) - f64::from(*r) * scale)
        .collect();
    let std = SIGMA * CLIP;
    let n = D as f64;
    // The noise has mean 0 and standard deviation σC per coordinate (five standard errors:
    // σ/√n for the mean, about σ/√(2n) for the sample deviation).
    let mean = noise.iter().sum::<f64>() / n;
    let sd = (noise.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt();
    assert!(mean.abs() < 5.0 * std / n.sqrt(), "noise mean {mean}");
    assert!(
        (sd - std).abs() < 5.0 * std / (2.0 * n).sqrt(),
        "noise std {sd} ≠ {std}"
    );
    // The norm sent: √(C² + dσ²C²), as clip-then-noise predicts (the unclipped delta would give
    // √(100²C² + dσ²C²), about twice as much here). ‖noise‖² has relative spread √(2/d).
    let expected = (CLIP * CLIP + n * std * std).sqrt();
    let unclipped = ((100.0 * CLIP).powi(2) + n * std * std).sqrt();
    let norm = l2_norm(&sent);
    assert!(
        (norm - expected).abs() < 5.0 * expected / (2.0 * n).sqrt(),
        "norm {norm}, clip then noise predicts {expected} (unclipped: {unclipped})"
    );
    // Along the raw delta's direction, what is left is C plus one draw of the noise.
    let along = (sent.iter().zip(&raw))
        .map(|(s, r)| f64::from(*s) * f64::from(*r))
        .sum::<f64>()
        / l2_norm(&raw);
    assert!((along - CLIP).abs() < 5.0 * std, "{along}");
    // Statistics never leave next to a privatised delta.
    assert!(update.class_stats.is_none() && update.prototypes.is_none());
}

#[test]
fn the_same_seed_sends_the_same_update_and_without_local_dp_the_delta_is_untouched() {
    let raw = raw_delta(64, 1.0);
    let (a, _) = answer(&mut private_agent(RoundState::default()), 1, raw.clone());
    let (b, _) = answer(&mut private_agent(RoundState::default()), 1, raw.clone());
    assert_eq!(a.delta.to_vec(), b.delta.to_vec());
    assert_ne!(a.delta.to_vec(), raw);
    let mut plain = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
    let (c, _) = answer(&mut plain, 1, raw.clone());
    assert_eq!(c.delta.to_vec(), raw);
    assert_eq!(plain.status().epsilon, None);
}

#[test]
fn feddim_and_fedddl_are_refused_under_local_dp_with_the_reason() {
    for objective in [Objective::FedDim, Objective::FedDdl] {
        let mut agent = private_agent(RoundState::default());
        let outputs = send(&mut agent, task_with(3, objective), 0);
        assert!(trains(&outputs).is_empty(), "{objective}: {outputs:?}");
        let error = &agent.status().last_error;
        assert!(
            error.contains("round 3")
                && error.contains(objective.name())
                && error.contains("[privacy]")
                && error.contains("un-noised"),
            "{error}"
        );
        assert!(
            outputs
                .iter()
                .any(|o| matches!(o, Output::Status { status, .. } if status.last_error == *error))
        );
        // Nothing was answered: the round is not spent.
        assert_eq!(agent.state().last_round, 0);
        // The next cross-entropy task trains.
        assert_eq!(
            trains(&send(&mut agent, task_with(4, Objective::CrossEntropy), 0)),
            [4]
        );
        // Without local DP the same task trains.
        let mut plain = Agent::new(identity("cam-1", None), RoundState::default()).unwrap();
        assert_eq!(trains(&send(&mut plain, task_with(3, objective), 0)), [3]);
    }
    // Stable-FedADG and FedProx send nothing besides the delta: trained.
    for objective in [Objective::StableFedAdg, Objective::FedProx] {
        let mut agent = private_agent(RoundState::default());
        assert_eq!(trains(&send(&mut agent, task_with(1, objective), 0)), [1]);
    }
}

#[test]
fn the_status_epsilon_after_k_rounds_is_the_accountant_composed_k_times() {
    let mut agent = private_agent(RoundState::default());
    // Before any update: on, nothing spent.
    assert_eq!(agent.status().epsilon, Some(0.0));
    let mut reference = Accountant::default();
    let mut last = 0.0;
    for round in 1..=5 {
        let (_, outputs) = answer(&mut agent, round, raw_delta(32, 1.0));
        reference
            .compose(Sampling::Poisson { rate: 1.0 }, SIGMA, 1)
            .unwrap();
        let want = reference.epsilon(1e-5).unwrap().epsilon;
        let epsilon = agent.status().epsilon.unwrap();
        assert_eq!(epsilon, want, "round {round}");
        assert!(epsilon > last, "ε grows: {last} → {epsilon}");
        last = epsilon;
        // The state holding the round is saved before the update can leave, and the status
        // published at the end of the round carries the ε.
        let save = outputs.iter().position(|o| matches!(o, Output::Save(_)));
        let sent = outputs
            .iter()
            .position(|o| matches!(o, Output::Update { .. }));
        assert!(save.unwrap() < sent.unwrap(), "{outputs:?}");
        let Some(Output::Status { status, .. }) = outputs.last() else {
            panic!("{outputs:?}");
        };
        assert_eq!(status.epsilon, Some(want));
    }
    assert_eq!(agent.state().accountant.as_ref().unwrap().steps(), 5);
    // A restart with the saved state goes on counting from there.
    let restarted = private_agent(agent.state().clone());
    assert_eq!(restarted.status().epsilon, Some(last));
    let (_, will) = restarted.last_will();
    assert_eq!(will.epsilon, Some(last));
}

#[test]
fn a_failed_training_spends_nothing() {
    let mut agent = private_agent(RoundState::default());
    assert_eq!(
        trains(&send(&mut agent, task_with(1, Objective::CrossEntropy), 0)),
        [1]
    );
    agent.handle_trained(Trained {
        result: Err(crate::train::TrainError::Empty),
        ..trained_with(1, vec![0.0; 4])
    });
    let outputs = drain(&mut agent);
    assert!(!outputs.iter().any(|o| matches!(o, Output::Update { .. })));
    assert_eq!(agent.status().epsilon, Some(0.0));
    assert_eq!(agent.state().accountant.as_ref().unwrap().steps(), 0);
}
