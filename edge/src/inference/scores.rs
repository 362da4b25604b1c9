//! A released head's scores for one image's features: its logits and their softmax, the one
//! way the predictor and the release it replaced (`head_watch::Shadow`) compute them.

use fedge_models::HeadConfig;

/// The head's logits for one feature vector, by the one forward pass (`fedge_models::Forward`,
/// which `fedge_models::head::predict_flat` runs too: the same sums, so the same winner). The
/// parameters come from a verified release, whose layout matches its head; were they not, every
/// class would score 0.
pub(crate) fn logits(config: &HeadConfig, flat: &[f32], x: &[f32]) -> Vec<f32> {
    match config.split(flat) {
        Ok(head) => fedge_models::Forward::new(config).logits(&head, x).to_vec(),
        Err(_) => vec![0.0; config.classes],
    }
}

/// Softmax, shifted by the largest logit so that no exponential overflows.
pub(crate) fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}
