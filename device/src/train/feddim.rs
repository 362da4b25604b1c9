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
    /// Per class, whether the federation has an insight for it yet: a class nobody had seen
    /// has an all-zero block, and its samples are left out of the term instead of being
    /// pulled towards zero.
    pub known: Vec<bool>,
}

impl GlobalInsight {
    /// From the task's flat `[K, H, K]` values.
    pub fn new(values: &[f32], hidden: usize, classes: usize, device: &Device) -> Self {
        let matrices = Tensor::<3>::from_data(
            TensorData::new(values.to_vec(), [classes, hidden, classes]),
            device,
        );
        let norms: Vec<f32> = values
            .chunks_exact(hidden * classes)
            .map(|m| m.iter().map(|v| v * v).sum())
            .collect();
        let known = values
            .chunks_exact(hidden * classes)
            .map(|m| m.iter().any(|v| *v != 0.0))
            .collect();
        Self {
            matrices,
            norms,
            known,
        }
    }
}

/// FedDIM's insight term for a batch, as `mean_i Σ_j z_ij (z_ij Σ_k W_jk² − 2 Σ_k W_jk Ī_{y_i},jk)`
/// plus the constant `mean_i ‖Ī_{y_i}‖²` (added as a number: it has no gradient); samples of a
/// class without an insight yet ([`GlobalInsight::known`]) add nothing.
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
    let mut per_entry = (z.clone() * w_sq - target) * z; // [B, H]
    if labels_host.iter().any(|&y| !insight.known[y as usize]) {
        let mask: Vec<f32> = (labels_host.iter())
            .map(|&y| f32::from(u8::from(insight.known[y as usize])))
            .collect();
        let rows = labels_host.len();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [rows, 1]), &per_entry.device());
        per_entry = per_entry * mask;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of a class without an insight yet adds nothing to the term; one of a known
    /// class adds its full share.
    #[test]
    fn classes_without_an_insight_are_left_out_of_the_term() {
        let device = Device::default();
        let (h, k) = (2, 2);
        // Class 0 has an insight, class 1 none yet (all zeros).
        let insight = GlobalInsight::new(&[1.0, 0.5, -1.0, 2.0, 0.0, 0.0, 0.0, 0.0], h, k, &device);
        assert_eq!(insight.known, [true, false]);
        let w = Tensor::<2>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [h, k]),
            &device,
        );
        let term = |rows: Vec<f32>, labels: Vec<u32>| -> f32 {
            let b = labels.len();
            let z = Tensor::<2>::from_data(TensorData::new(rows, [b, h]), &device);
            let y = Tensor::<1, Int>::from_data(
                TensorData::new(labels.iter().map(|&l| l as i64).collect::<Vec<_>>(), [b]),
                &device,
            );
            insight_term(w.clone(), z, y, &labels, &insight)
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap()[0]
        };
        // One known sample alone: ‖W ⊙ z 1ᵀ − Ī_0‖² with z = (1, 1): W rows (1,2), (3,4)
        // against Ī_0 rows (1, 0.5), (−1, 2): 0 + 2.25 + 16 + 4 = 22.25.
        let known = term(vec![1.0, 1.0], vec![0]);
        assert!((known - 22.25).abs() < 1e-4, "{known}");
        // The same sample next to one of the unknown class: the batch mean halves it, and the
        // unknown sample adds nothing (it would add ‖W ⊙ z 1ᵀ‖² = 30 if pulled to zero).
        let mixed = term(vec![1.0, 1.0, 1.0, 1.0], vec![0, 1]);
        assert!((mixed - 22.25 / 2.0).abs() < 1e-4, "{mixed}");
    }
}
