//! FedDIM on the device (docs/algorithms.md §3): the insight term of the local loss and the compact
//! class statistics sent with the update.
//!
//! The insight term is `(1/B) Σ_i ‖W ⊙ (z_i 1ᵀ) − Ī_{y_i}‖²_F` with `W` the `[H, K]` classifier
//! weight. Materialising the per-sample `H×K` matrices costs `B·H·K`; the term expands exactly
//! into three cheaper parts, per sample `i` of class `c = y_i`:
//!
//! `Σ_j z_ij² (Σ_k W_jk²)  −  2 Σ_j z_ij (Σ_k W_jk Ī_c,jk)  +  ‖Ī_c‖²`,
//!
//! i.e. one `[B,H]·[H]` product, one `[K,H]` contraction of `W` with `Ī` shared by the whole
//! batch, and a per-class constant: `O(B·H + K·H·K)` work, and autodiff sees only these.

use burn::prelude::*;
use burn::tensor::TensorData;
use fedge_models::Head;

use crate::features::FeatureSet;

/// FedDIM's global `Ī` prepared once per round: the tensor and its per-class squared norms.
#[derive(Debug, Clone)]
pub struct GlobalInsight {
    /// `[K, H, K]`.
    pub matrices: Tensor<3>,
    /// `‖Ī_c‖²_F` per class.
    pub norms: Vec<f32>,
}

impl GlobalInsight {
    /// From the task's flat `[K, H, K]` values.
    pub fn new(values: &[f32], hidden: usize, classes: usize, device: &Device) -> Self {
        let matrices = Tensor::<3>::from_data(
            TensorData::new(values.to_vec(), [classes, hidden, classes]),
            device,
        );
        let norms = values
            .chunks_exact(hidden * classes)
            .map(|m| m.iter().map(|v| v * v).sum())
            .collect();
        Self { matrices, norms }
    }
}

/// FedDIM's insight term for a batch, as `mean_i Σ_j z_ij (z_ij Σ_k W_jk² − 2 Σ_k W_jk Ī_{y_i},jk)`
/// plus the constant `mean_i ‖Ī_{y_i}‖²` (added as a number: it has no gradient).
///
/// # Shapes
/// - `w`: `[H, K]` classifier weight
/// - `z`: `[B, H]` projector features
/// - `labels`: `[B]` classes, also given as `labels_host`
pub fn insight_term(
    w: Tensor<2>,
    z: Tensor<2>,
    labels: Tensor<1, Int>,
    labels_host: &[u32],
    insight: &GlobalInsight,
) -> Tensor<1> {
    let [h, k] = w.dims();
    let batch = labels_host.len().max(1) as f32;
    let w_sq = w.clone().powi_scalar(2).sum_dim(1).reshape([1, h]); // [1, H]
    let contracted = (insight.matrices.clone() * w.reshape([1, h, k]))
        .sum_dim(2)
        .reshape([k, h]); // [K, H]: Σ_k W_jk Ī_c,jk
    let target = contracted.select(0, labels).mul_scalar(2.0); // [B, H]
    let per_entry = (z.clone() * w_sq - target) * z; // [B, H]
    let constant: f32 = labels_host.iter().map(|&y| insight.norms[y as usize]).sum();
    per_entry.sum().add_scalar(constant).div_scalar(batch)
}

/// Class counts and class-mean projector features `[K, H]` of `head` on `data`, computed with
/// Burn in blocks of rows (f32 sums); zero rows for absent classes.
pub fn class_stats(
    head: &Head,
    classes: usize,
    data: &FeatureSet,
    device: &Device,
) -> (Vec<u32>, Vec<f32>) {
    let hidden = head.classifier.weight.val().dims()[0];
    let mut counts = vec![0u32; classes];
    let mut sums: Option<Tensor<2>> = None;
    let rows = 1024;
    for (block, labels) in data
        .features
        .chunks(rows * data.dim)
        .zip(data.labels.chunks(rows))
    {
        let n = labels.len();
        let x = Tensor::<2>::from_data(TensorData::new(block.to_vec(), [n, data.dim]), device);
        let mut one_hot = vec![0f32; n * classes];
        for (i, &y) in labels.iter().enumerate() {
            one_hot[i * classes + y as usize] = 1.0;
            counts[y as usize] += 1;
        }
        let one_hot = Tensor::<2>::from_data(TensorData::new(one_hot, [n, classes]), device);
        let part = one_hot.transpose().matmul(head.features(x).detach()); // [K, H]
        sums = Some(match sums {
            Some(s) => s + part,
            None => part,
        });
    }
    let sums: Vec<f32> = sums
        .map(|s| {
            s.into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .unwrap_or_default()
        })
        .unwrap_or_else(|| vec![0.0; classes * hidden]);
    let means = sums
        .chunks_exact(hidden)
        .zip(&counts)
        .flat_map(|(row, n)| {
            row.iter()
                .map(move |s| if *n > 0 { s / *n as f32 } else { 0.0 })
        })
        .collect();
    (counts, means)
}
