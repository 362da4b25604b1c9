//! End to end: edge agents, coordinator and a real broker, over loopback.

use fedge::demo::{self, DemoOptions, DemoResult};

use crate::common;

fn check_learned(result: &DemoResult) {
    assert_eq!(result.rounds.len(), 3, "{:?}", result.rounds);
    let mut previous_norm = common::norm(&result.initial_params);
    for row in &result.rounds {
        assert_eq!(
            row.clients, 3,
            "every client reported in round {}",
            row.round
        );
        // The held-out 75° domain is an evaluation-only agent's: its score is the target's.
        assert_eq!(
            row.site_accuracy.get("unseen-rot75").copied(),
            row.target_accuracy,
            "round {}",
            row.round
        );
        assert!(row.target_accuracy.is_some());
        assert!(row.bytes_up > 0 && row.bytes_down > 0);
        assert_ne!(
            row.params_norm, previous_norm,
            "round {} did not change the global parameters",
            row.round
        );
        previous_norm = row.params_norm;
    }
    assert_ne!(result.final_params, result.initial_params);
    let final_acc = result.final_target_accuracy.unwrap();
    assert!(
        final_acc > result.initial_target_accuracy + 0.05,
        "target accuracy {final_acc} did not beat the untrained head's {}",
        result.initial_target_accuracy
    );
    assert!(result.rejected.is_empty(), "{:?}", result.rejected);
    let first_val = result.rounds[0].source_val_accuracy.unwrap();
    let last_val = result.rounds[2].source_val_accuracy.unwrap();
    assert!(
        last_val > first_val,
        "source validation accuracy did not improve: {first_val} -> {last_val}"
    );
}

/// FedDIM on the devices with FedOMG on the coordinator, over the embedded broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_edges_learn_with_feddim_and_fedomg_over_the_embedded_broker() {
    let base = common::demo_options(None, "e2e-embedded");
    let options = DemoOptions {
        strategy: fedge_coordinator::strategy::StrategyConfig {
            strategy: fedge_coordinator::strategy::StrategyKind::Fedomg,
            ..Default::default()
        },
        train: fedge_wire::TrainParams {
            objective: fedge_wire::Objective::FedDim,
            // Without the pooled feature summary, so that the task grows by Ī alone.
            feature_norm: fedge_wire::FeatureNorm::None,
            ..base.train.clone()
        },
        ..base
    };
    let result = common::run_demo(&options).await;
    check_learned(&result);
    // From round 2 on, the task carries the global insight matrices, K·H·K = 6,400 values in
    // f16, the task's codec.
    let task_bytes = |r: usize| result.rounds[r].bytes_down / 3;
    let grown = task_bytes(1) - task_bytes(0);
    assert!(
        (12_800..12_816).contains(&grown),
        "task grew by {grown} bytes: {:?}",
        result.rounds
    );
    assert_eq!(task_bytes(2), task_bytes(1));
}

/// Over mosquitto the coordinator runs FedOMG with server momentum, so both strategy paths
/// cross a real broker; every device has a key, so tasks and updates are sealed and checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_edges_learn_with_fedomg_over_mosquitto_in_three_rounds() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let options = DemoOptions {
        strategy: fedge_coordinator::strategy::StrategyConfig {
            strategy: fedge_coordinator::strategy::StrategyKind::Fedomg,
            server_momentum: 0.5,
            ..Default::default()
        },
        auth: true,
        ..common::demo_options(Some(mosquitto.broker()), "e2e-mosquitto")
    };
    let result = common::run_demo(&options).await;
    check_learned(&result);
    assert_eq!(result.strategy, "fedomg+momentum");
    for row in &result.rounds {
        assert_eq!(row.gamma.len(), 3, "one weight per client: {:?}", row.gamma);
        let sum: f64 = row.gamma.values().sum();
        assert!((sum - 1.0).abs() < 1e-9, "Γ sums to {sum}");
        assert!(row.gamma.values().all(|g| *g > 0.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federation_survives_a_broker_restart_mid_round() {
    let Some(mut mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let options = DemoOptions {
        rounds: 4,
        round_timeout_s: 3.0,
        ..common::demo_options(Some(mosquitto.broker()), "e2e-restart")
    };
    let data = demo::prepare(&options).unwrap();
    let mut restarted = false;
    let run = demo::run(&options, &data, |row| {
        // Called as round 1 ends, right after round 2's task went out: the broker dies while
        // the devices train round 2. Every session and retained message disappears; clients
        // must reconnect with back-off, resubscribe, republish their status, the coordinator
        // its task, and round 2 must still complete.
        if row.round == 1 && !restarted {
            restarted = true;
            mosquitto.restart(std::time::Duration::from_millis(500));
        }
    });
    let result = tokio::time::timeout(std::time::Duration::from_secs(90), run)
        .await
        .expect("federation hung")
        .unwrap();
    assert!(restarted);
    let aggregated: Vec<_> = result
        .rounds
        .iter()
        .filter(|r| r.target_accuracy.is_some())
        .collect();
    assert_eq!(aggregated.len(), 4, "{:?}", result.rounds);
    assert!(result.final_target_accuracy.unwrap() > result.initial_target_accuracy + 0.05);
}
