//! The agent's decisions on a task's pooled feature summary: one that does not hold
//! together, or is of other features than the device's, is declined, never trained on.

use super::tests::{agent, deliver, identity, send, task, trains};
use super::*;

/// A pooled feature summary whose tensors do not hold together: `means` one value short of
/// `classes × features` (2 × 2), or a mean that is not a number.
pub(super) fn malformed_summaries() -> [fedge_wire::FeatureSummary; 2] {
    let good = fedge_wire::FeatureSummary {
        counts: vec![3.0, 4.0],
        means: TensorF32::new(vec![2, 2], &[0.0, 1.0, 2.0, 3.0]).unwrap(),
        within: TensorF32::from_slice(&[1.0, 1.0]),
    };
    let short = fedge_wire::FeatureSummary {
        means: TensorF32::from_slice(&[0.0, 1.0, 2.0]),
        ..good.clone()
    };
    let nan = fedge_wire::FeatureSummary {
        means: TensorF32::new(vec![2, 2], &[0.0, f32::NAN, 2.0, 3.0]).unwrap(),
        ..good
    };
    [short, nan]
}

#[test]
fn a_task_whose_pooled_summary_does_not_hold_together_is_declined_not_trained() {
    for (i, bad) in malformed_summaries().into_iter().enumerate() {
        let mut agent = agent(RoundState::default());
        let mut pooling = task(1, &["cam-1"], 10_000);
        pooling.train.feature_norm = fedge_wire::FeatureNorm::Balanced;
        pooling.pooled = Some(bad);
        assert!(trains(&send(&mut agent, pooling, 0)).is_empty(), "case {i}");
        let declined = agent.status().declined.clone().expect("declined");
        assert_eq!(declined.round, 1);
        assert!(
            declined.reason.contains("pooled feature statistics"),
            "case {i}: {}",
            declined.reason
        );
        assert_eq!(agent.status().last_error, declined.reason);
        // The next good task is trained.
        assert_eq!(
            trains(&deliver(&mut agent, 2, 10_000, 1)),
            vec![2],
            "case {i}"
        );
    }
}

#[test]
fn a_task_whose_pooled_summary_is_of_other_features_than_the_device_s_is_declined() {
    let own = fedge_wire::HeadConfig::new(3, 2).with_hidden(1);
    let mut agent = Agent::new(identity("cam-1", None), RoundState::default())
        .unwrap()
        .with_head(own);
    // A summary that holds together, of two features: this device's backbone gives three.
    let [short, _] = malformed_summaries();
    let two = fedge_wire::FeatureSummary {
        means: TensorF32::new(vec![2, 2], &[0.0, 1.0, 2.0, 3.0]).unwrap(),
        ..short
    };
    let mut pooling = task(1, &["cam-1"], 10_000);
    pooling.pooled = Some(two);
    assert!(trains(&send(&mut agent, pooling, 0)).is_empty());
    let reason = agent.status().declined.clone().expect("declined").reason;
    assert!(
        reason.contains("pooled feature statistics") && reason.contains("2 features"),
        "{reason}"
    );
}
