//! FedDIM on the device (ALGORITHMS.md §3): the insight term of the local loss and the compact
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
use fedge_models::HeadConfig;

/// FedDIM's insight term for a batch.
///
/// # Shapes
/// - `w`: `[H, K]` classifier weight
/// - `z`: `[B, H]` projector features
/// - `one_hot`: `[B, K]` labels
/// - `insight`: `[K, H, K]` global class-mean insight matrices (a constant)
pub fn insight_term(
    w: Tensor<2>,
    z: Tensor<2>,
    one_hot: Tensor<2>,
    insight: Tensor<3>,
) -> Tensor<1> {
    let [h, k] = w.dims();
    let w_sq = w.clone().powi_scalar(2).sum_dim(1); // [H, 1]
    let own = z.clone().powi_scalar(2).matmul(w_sq); // [B, 1]
    let contracted = (insight.clone() * w.reshape([1, h, k]))
        .sum_dim(2)
        .reshape([k, h]); // [K, H]
    let cross = (z * one_hot.clone().matmul(contracted)).sum_dim(1); // [B, 1]
    let norms = insight.powi_scalar(2).sum_dim(2).sum_dim(1).reshape([k, 1]); // [K, 1]
    let constant = one_hot.matmul(norms); // [B, 1]
    (own - cross.mul_scalar(2.0) + constant).mean()
}

/// One-hot rows for `labels`.
pub fn one_hot(labels: &[u32], classes: usize, device: &Device) -> Tensor<2> {
    let mut values = vec![0f32; labels.len() * classes];
    for (row, &y) in labels.iter().enumerate() {
        values[row * classes + y as usize] = 1.0;
    }
    Tensor::from_data(TensorData::new(values, [labels.len(), classes]), device)
}

/// Class counts and class-mean projector features `[K, H]` of the head `params` (flat layout)
/// on `features` (`len × F`), in plain f32 with f64 sums; zero rows for absent classes.
pub fn class_stats(
    config: &HeadConfig,
    params: &[f32],
    features: &[f32],
    labels: &[u32],
) -> (Vec<u32>, Vec<f32>) {
    let (f, h, k) = (config.features, config.hidden, config.classes);
    let (w1, rest) = params.split_at(f * h);
    let b1 = &rest[..h];
    let mut counts = vec![0u32; k];
    let mut sums = vec![0f64; k * h];
    let mut z = vec![0f32; h];
    for (x, &y) in features.chunks_exact(f).zip(labels) {
        z.copy_from_slice(b1);
        for (xi, row) in x.iter().zip(w1.chunks_exact(h)) {
            for (zj, w) in z.iter_mut().zip(row) {
                *zj += xi * w;
            }
        }
        let c = y as usize;
        counts[c] += 1;
        for (s, zj) in sums[c * h..(c + 1) * h].iter_mut().zip(&z) {
            *s += zj.max(0.0) as f64;
        }
    }
    let means = sums
        .chunks_exact(h)
        .zip(&counts)
        .flat_map(|(row, n)| {
            row.iter()
                .map(move |s| if *n > 0 { (s / *n as f64) as f32 } else { 0.0 })
        })
        .collect();
    (counts, means)
}
