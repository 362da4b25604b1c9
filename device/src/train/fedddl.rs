//! FedDDL's building blocks on the device (docs/algorithms.md §4): DEC's counterfactual images and
//! DEB's contrastive regulariser against causal prototypes.
//!
//! - **DEC**: the backgrounds of each class are split at random into `η` groups; a
//!   counterfactual is a group's mean background with a real object pasted on it, labelled
//!   with the object's class. Every object gets a background drawn from a random class, so
//!   objects of every class meet backgrounds of every class and the background stops telling
//!   the class. Counterfactuals are images: they go through the backbone like real ones.
//! - **DEB**: `L_CR = −log(exp(f·U⁺/τ) / Σ_k exp(f·U_k/τ))` with `f` the sample's projector
//!   feature, `U⁺` its class's global prototype and the sum over all classes' prototypes; `f`
//!   and `U` are L2-normalised (cosine similarity), so `L_CR` is a cross-entropy over cosine
//!   similarities divided by `τ`.
//!
//! A device builds its [`DdlViews`] once, when it loads its data (`fedge-edge`'s `views`):
//! counterfactual and object-only images through the backbone, cached like the real features. The paper draws
//! new counterfactuals every round (its Algorithm 1, line 6); a backbone pass per round is
//! minutes on a gateway running EfficientNet, so **Choice**: a device draws a pool of
//! `pool` counterfactuals per image once (each draw a new grouping of the backgrounds and a new
//! background for every object; [`DEFAULT_POOL`] draws, so `pool` extra backbone passes in
//! all), and every round picks one of each image's draws at random ([`DdlViews::draw`]).
//! **Choice**: each object's background class is drawn uniformly over the classes, and a
//! counterfactual shares its batch with its own real image. Object-only inputs keep the
//! object's pixels and set the background to 0 (black). The trainer's `L_J + λ L_CR` is in
//! `crate::train`'s gradient loop, the prototypes' average in the coordinator.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use rand::Rng;

use super::error::TrainError;
use crate::features::FeatureSet;
use crate::site_norm::{FeatureStats, standardise};

/// FedDDL's extra views of a device's training data, row for row with the real features.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DdlViews {
    /// The pool: each a feature set of one counterfactual per row (its object on another
    /// background, same label), drawn independently.
    pub counterfactuals: Vec<FeatureSet>,
    /// Features of each row's object alone (background set to 0).
    pub objects: FeatureSet,
}

impl DdlViews {
    /// The rows `indices` of every view, in that order.
    pub fn rows(&self, indices: &[usize]) -> Self {
        Self {
            counterfactuals: self
                .counterfactuals
                .iter()
                .map(|c| c.rows(indices))
                .collect(),
            objects: self.objects.rows(indices),
        }
    }

    /// Every view standardised with a site's statistics (`crate::site_norm`).
    pub fn standardised(&self, stats: &FeatureStats) -> Self {
        Self {
            counterfactuals: self
                .counterfactuals
                .iter()
                .map(|s| standardise(stats, s))
                .collect(),
            objects: standardise(stats, &self.objects),
        }
    }

    /// This round's counterfactuals: for each row, one of its draws at random.
    pub fn draw(&self, rng: &mut impl Rng) -> FeatureSet {
        let Some(first) = self.counterfactuals.first() else {
            return FeatureSet::default();
        };
        if self.counterfactuals.len() == 1 {
            return first.clone();
        }
        let d = first.dim;
        let mut features = Vec::with_capacity(first.features.len());
        for row in 0..first.len() {
            let pick = &self.counterfactuals[rng.random_range(0..self.counterfactuals.len())];
            features.extend_from_slice(&pick.features[row * d..(row + 1) * d]);
        }
        FeatureSet {
            dim: d,
            features,
            labels: first.labels.clone(),
        }
    }

    /// `self` when every view matches `data` row for row (same count, size and labels).
    pub fn checked(&self, data: &FeatureSet) -> Result<&Self, TrainError> {
        let views = self.counterfactuals.iter().map(|c| ("counterfactual", c));
        for (name, view) in views.chain([("object-only", &self.objects)]) {
            if view.dim != data.dim || view.labels != data.labels {
                return Err(TrainError::Params(format!(
                    "the {name} features do not match the training data row for row \
                     ({} rows of size {}, expected {} of size {})",
                    view.len(),
                    view.dim,
                    data.len(),
                    data.dim
                )));
            }
        }
        Ok(self)
    }
}

/// Default temperature `τ` of the contrastive regulariser.
pub const DEFAULT_TAU: f32 = 0.07;

/// FedDDL's global prototypes for a round: `U_G` `[K, H]`, and per class whether the
/// federation has a prototype for it yet (a class nobody had seen has an all-zero row).
#[derive(Debug, Clone)]
pub struct GlobalPrototypes {
    /// `[K, H]`.
    pub u: Tensor<2>,
    /// Per class, whether its row is a prototype.
    pub known: Vec<bool>,
}

impl GlobalPrototypes {
    /// From the task's flat `[K, H]` values.
    pub fn new(values: &[f32], hidden: usize, classes: usize, device: &Device) -> Self {
        let u = Tensor::<2>::from_data(TensorData::new(values.to_vec(), [classes, hidden]), device);
        let known = values
            .chunks_exact(hidden)
            .map(|row| row.iter().any(|v| *v != 0.0))
            .collect();
        Self { u, known }
    }
}

/// `L_CR` for a batch: projector features `f` (`[B, H]`), the global prototypes, labels `[B]`
/// (also given as `labels_host`), temperature `tau`; mean over the batch. Rows of `f` and `U`
/// are L2-normalised first. A class without a prototype yet is left out of every denominator
/// (a zero row would enter it as a cosine of 0), and its samples, which have no positive, add
/// nothing.
pub fn contrastive_loss(
    f: Tensor<2>,
    prototypes: &GlobalPrototypes,
    labels: Tensor<1, Int>,
    labels_host: &[u32],
    tau: f32,
) -> Tensor<1> {
    let normalise = |t: Tensor<2>| {
        let norm = t.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
        t / norm
    };
    let device = f.device();
    let logits = normalise(f)
        .matmul(normalise(prototypes.u.clone()).transpose())
        .div_scalar(tau);
    let known = &prototypes.known;
    if known.iter().all(|k| *k) {
        return CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, labels);
    }
    let (b, k) = (labels_host.len(), known.len());
    let bias: Vec<f32> = known.iter().map(|&c| if c { 0.0 } else { -1e4 }).collect();
    let logits = logits + Tensor::<2>::from_data(TensorData::new(bias, [1, k]), &device);
    let picked = burn::tensor::activation::log_softmax(logits, 1).gather(1, labels.reshape([b, 1]));
    let mask: Vec<f32> = (labels_host.iter())
        .map(|&y| f32::from(u8::from(known.get(y as usize).copied().unwrap_or(false))))
        .collect();
    let mask = Tensor::<2>::from_data(TensorData::new(mask, [b, 1]), &device);
    (picked * mask).sum().neg().div_scalar(b.max(1) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use fedge_models::{Backend, training_device};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn each_round_draws_one_of_each_rows_counterfactuals() {
        // Three draws of 50 rows; draw p holds the value 10·p + row in both columns.
        let pool: Vec<FeatureSet> = (0..3)
            .map(|p| FeatureSet {
                dim: 2,
                features: (0..50).flat_map(|r| [(10 * p + r) as f32; 2]).collect(),
                labels: (0..50).map(|r| r % 2).collect(),
            })
            .collect();
        let views = DdlViews {
            counterfactuals: pool,
            objects: FeatureSet::default(),
        };
        let mut rng = StdRng::seed_from_u64(1);
        let picks = |set: &FeatureSet| -> Vec<u32> {
            set.features
                .chunks(2)
                .enumerate()
                .map(|(r, v)| {
                    assert_eq!(v[0], v[1], "a row is copied whole");
                    let p = (v[0] as u32 - r as u32) / 10;
                    assert_eq!(v[0], (10 * p + r as u32) as f32, "row {r} from draw {p}");
                    p
                })
                .collect()
        };
        let first = views.draw(&mut rng);
        assert_eq!(first.labels, views.counterfactuals[0].labels);
        let (a, b) = (picks(&first), picks(&views.draw(&mut rng)));
        for p in 0..3 {
            assert!(a.contains(&p), "every draw is used: {a:?}");
        }
        assert_ne!(a, b, "a new pick every round");
    }

    #[test]
    fn contrastive_loss_on_normalised_vectors() {
        let device = training_device(Backend::default());
        // f = (3, 4) normalises to (0.6, 0.8); prototypes (1, 0) and (0, 2) to (1, 0), (0, 1):
        // cosines 0.6 and 0.8. With τ = 0.5: logits 1.2 and 1.6.
        let f = Tensor::<2>::from_data(TensorData::new(vec![3.0f32, 4.0], [1, 2]), &device);
        let u = GlobalPrototypes::new(&[1.0, 0.0, 0.0, 2.0], 2, 2, &device);
        for (label, positive) in [(0i64, 1.2f64), (1, 1.6)] {
            let y = Tensor::<1, Int>::from_data(TensorData::new(vec![label], [1]), &device);
            let got = contrastive_loss(f.clone(), &u, y, &[label as u32], 0.5)
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap()[0];
            let want = -(positive.exp() / (1.2f64.exp() + 1.6f64.exp())).ln();
            assert!(
                (f64::from(got) - want).abs() < 1e-5,
                "{label}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn a_class_without_a_prototype_leaves_the_denominator_and_adds_nothing() {
        let device = training_device(Backend::default());
        let f = Tensor::<2>::from_data(
            TensorData::new(vec![3.0f32, 4.0, 3.0, 4.0], [2, 2]),
            &device,
        );
        // Class 2 has no prototype yet: its row is zero.
        let u = GlobalPrototypes::new(&[1.0, 0.0, 0.0, 2.0, 0.0, 0.0], 2, 3, &device);
        assert_eq!(u.known, [true, true, false]);
        let loss = |labels: Vec<i64>| -> f64 {
            let host: Vec<u32> = labels.iter().map(|&l| l as u32).collect();
            let n = labels.len();
            let y = Tensor::<1, Int>::from_data(TensorData::new(labels, [n]), &device);
            let got = contrastive_loss(f.clone().slice([0..n, 0..2]), &u, y, &host, 0.5);
            f64::from(
                got.into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap()[0],
            )
        };
        // Label 0 against classes 0 and 1 only, as if class 2 did not exist (with its zero
        // row the denominator would gain e^0).
        let want = -(1.2f64.exp() / (1.2f64.exp() + 1.6f64.exp())).ln();
        assert!((loss(vec![0]) - want).abs() < 1e-5);
        // A sample of class 2 has no positive: it adds nothing, and halves the batch mean.
        assert!((loss(vec![0, 2]) - want / 2.0).abs() < 1e-5);
    }
}
