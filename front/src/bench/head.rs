//! `fedge bench head`: local head training speed of the Burn CPU backends, side by side.
//!
//! Trains the same head (same features, same seed, same hyper-parameters) on each backend and
//! reports samples per second and the ratio to the first backend.

use std::time::Instant;

use fedge_device::{FeatureSet, TrainJob, train_head};
use fedge_models::{Backend, HeadConfig, training_device};
use fedge_wire::TrainParams;
use rand::{Rng, SeedableRng};

/// One backend's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeadBench {
    /// Backend name.
    pub backend: &'static str,
    /// Threads a batch may be split across (`fedge_device::train::parallel`).
    pub threads: usize,
    /// Training samples processed per second (median of the repeats).
    pub samples_per_s: f64,
    /// Final loss, to show the backends computed the same thing.
    pub final_loss: f32,
}

/// `samples` random features in 0..1 with random labels, for timing.
pub fn random_features(head: &HeadConfig, samples: usize, rng: &mut impl Rng) -> FeatureSet {
    FeatureSet {
        dim: head.features,
        features: (0..samples * head.features)
            .map(|_| rng.random_range(0.0f32..1.0))
            .collect(),
        labels: (0..samples)
            .map(|_| rng.random_range(0..head.classes as u32))
            .collect(),
    }
}

/// Times `epochs` epochs over `samples` random samples, `repeats` times per backend and
/// thread count.
pub fn run(
    head: &HeadConfig,
    samples: usize,
    epochs: u32,
    batch: u32,
    repeats: usize,
    backends: &[Backend],
    threads: &[usize],
) -> Vec<HeadBench> {
    let data = random_features(head, samples, &mut rand::rngs::StdRng::seed_from_u64(7));
    let params = TrainParams {
        local_epochs: epochs,
        batch_size: batch,
        // The head alone, as the PyTorch side trains it.
        feature_norm: fedge_wire::FeatureNorm::None,
        ..TrainParams::default()
    };
    let global = head.init_flat(1);
    let runs = backends
        .iter()
        .flat_map(|&backend| threads.iter().map(move |&t| (backend, t.max(1))));
    runs.map(|(backend, threads)| {
        let device = training_device(backend);
        let job = TrainJob::new(head, &global, &data, &params, &device).with_threads(threads);
        // One untimed warm-up run.
        let _ = train_head(&job);
        let mut rates = Vec::new();
        let mut final_loss = f32::NAN;
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            let outcome = train_head(&job);
            let seconds = start.elapsed().as_secs_f64();
            final_loss = outcome.map(|o| o.last_epoch_loss).unwrap_or(f32::NAN);
            rates.push((samples * epochs as usize) as f64 / seconds);
        }
        rates.sort_by(|a, b| a.total_cmp(b));
        HeadBench {
            backend: backend.name(),
            threads,
            samples_per_s: rates[rates.len() / 2],
            final_loss,
        }
    })
    .collect()
}

/// The same head and optimiser in plain f32 loops (no framework): forward, cross-entropy,
/// backward and SGD with momentum and weight decay, one thread, written so the compiler can
/// vectorise the inner loops for the build's baseline CPU, but without cache blocking or
/// hand-written kernels. Measured, it is well below Burn's kernels (BENCHMARKS.md): a floor a
/// framework must beat, not the ceiling a tuned GEMM would give. Returns samples per second
/// (median of `repeats`) and the last epoch's mean loss.
pub fn plain(
    head: &HeadConfig,
    samples: usize,
    epochs: u32,
    batch: usize,
    repeats: usize,
) -> HeadBench {
    let data = random_features(head, samples, &mut rand::rngs::StdRng::seed_from_u64(7));
    let params = TrainParams::default();
    let mut rates = Vec::new();
    let mut final_loss = f32::NAN;
    for run in 0..repeats.max(1) + 1 {
        let mut trainer = PlainHead::new(head, &head.init_flat(1));
        let start = Instant::now();
        for epoch in 0..epochs {
            let mut order: Vec<usize> = (0..samples).collect();
            rand::seq::SliceRandom::shuffle(
                &mut order[..],
                &mut rand::rngs::StdRng::seed_from_u64(epoch as u64),
            );
            let mut loss_sum = 0.0f64;
            for rows in order.chunks(batch.max(1)) {
                loss_sum += trainer.step(&data, rows, &params) as f64 * rows.len() as f64;
            }
            final_loss = (loss_sum / samples as f64) as f32;
        }
        // The first run warms up, as for the backends.
        if run > 0 {
            rates.push((samples * epochs as usize) as f64 / start.elapsed().as_secs_f64());
        }
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    HeadBench {
        backend: "plain-f32",
        threads: 1,
        samples_per_s: rates[rates.len() / 2],
        final_loss,
    }
}

/// Parameters, momentum buffers and scratch space of the plain-loop head.
struct PlainHead {
    f: usize,
    h: usize,
    k: usize,
    /// `W1 [F,H], b1 [H], W [H,K], b [K]`, the flat layout.
    w: Vec<f32>,
    velocity: Vec<f32>,
    grad: Vec<f32>,
    x: Vec<f32>,
    z: Vec<f32>,
    logits: Vec<f32>,
    dz: Vec<f32>,
}

impl PlainHead {
    fn new(head: &HeadConfig, flat: &[f32]) -> Self {
        Self {
            f: head.features,
            h: head.hidden,
            k: head.classes,
            w: flat.to_vec(),
            velocity: vec![0.0; flat.len()],
            grad: vec![0.0; flat.len()],
            x: Vec::new(),
            z: Vec::new(),
            logits: Vec::new(),
            dz: Vec::new(),
        }
    }

    /// One SGD step on `rows`; returns the batch's mean cross-entropy.
    fn step(&mut self, data: &FeatureSet, rows: &[usize], params: &TrainParams) -> f32 {
        let (f, h, k, b) = (self.f, self.h, self.k, rows.len());
        let (w1, rest) = self.w.split_at(f * h);
        let (b1, rest) = rest.split_at(h);
        let (w2, b2) = rest.split_at(h * k);
        self.x.clear();
        for &r in rows {
            self.x.extend_from_slice(&data.features[r * f..(r + 1) * f]);
        }
        // Forward: z = relu(x W1 + b1), logits = z W + b.
        self.z.clear();
        self.z.resize(b * h, 0.0);
        for (x, z) in self.x.chunks_exact(f).zip(self.z.chunks_exact_mut(h)) {
            z.copy_from_slice(b1);
            for (&xi, wrow) in x.iter().zip(w1.chunks_exact(h)) {
                for (zj, &wj) in z.iter_mut().zip(wrow) {
                    *zj += xi * wj;
                }
            }
            for zj in z.iter_mut() {
                *zj = zj.max(0.0);
            }
        }
        self.logits.clear();
        self.logits.resize(b * k, 0.0);
        for (z, out) in self.z.chunks_exact(h).zip(self.logits.chunks_exact_mut(k)) {
            out.copy_from_slice(b2);
            for (&zj, wrow) in z.iter().zip(w2.chunks_exact(k)) {
                for (o, &wj) in out.iter_mut().zip(wrow) {
                    *o += zj * wj;
                }
            }
        }
        // Softmax cross-entropy; logits become d(loss)/d(logits).
        let mut loss = 0.0f32;
        for (out, &r) in self.logits.chunks_exact_mut(k).zip(rows) {
            let max = out.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut sum = 0.0;
            for o in out.iter_mut() {
                *o = (*o - max).exp();
                sum += *o;
            }
            let label = data.labels[r] as usize;
            loss -= (out[label] / sum).ln();
            for o in out.iter_mut() {
                *o /= sum * b as f32;
            }
            out[label] -= 1.0 / b as f32;
        }
        // Backward into the flat gradient.
        self.grad.iter_mut().for_each(|g| *g = 0.0);
        let (g1, rest) = self.grad.split_at_mut(f * h);
        let (gb1, rest) = rest.split_at_mut(h);
        let (g2, gb2) = rest.split_at_mut(h * k);
        self.dz.clear();
        self.dz.resize(b * h, 0.0);
        for ((z, d), dz) in self
            .z
            .chunks_exact(h)
            .zip(self.logits.chunks_exact(k))
            .zip(self.dz.chunks_exact_mut(h))
        {
            for (gb, &dv) in gb2.iter_mut().zip(d) {
                *gb += dv;
            }
            for (((&zj, grow), wrow), dzj) in z
                .iter()
                .zip(g2.chunks_exact_mut(k))
                .zip(w2.chunks_exact(k))
                .zip(dz.iter_mut())
            {
                let mut back = 0.0;
                for ((g, &dv), &wv) in grow.iter_mut().zip(d).zip(wrow) {
                    *g += zj * dv;
                    back += dv * wv;
                }
                *dzj = if zj > 0.0 { back } else { 0.0 };
            }
        }
        for (x, dz) in self.x.chunks_exact(f).zip(self.dz.chunks_exact(h)) {
            for (gb, &d) in gb1.iter_mut().zip(dz) {
                *gb += d;
            }
            for (&xi, grow) in x.iter().zip(g1.chunks_exact_mut(h)) {
                for (g, &d) in grow.iter_mut().zip(dz) {
                    *g += xi * d;
                }
            }
        }
        // SGD with momentum (PyTorch semantics) and weight decay.
        let (lr, mu, wd) = (params.learning_rate, params.momentum, params.weight_decay);
        for ((w, v), &g) in self.w.iter_mut().zip(&mut self.velocity).zip(&self.grad) {
            *v = mu * *v + g + wd * *w;
            *w -= lr * *v;
        }
        loss / b as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_loop_head_learns_like_the_burn_head() {
        // A separable problem: the label is the feature with the largest value.
        let head = HeadConfig::new(8, 4).with_hidden(16);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut data = random_features(&head, 512, &mut rng);
        for (r, label) in data.labels.iter_mut().enumerate() {
            let row = &mut data.features[r * 8..(r + 1) * 8];
            row[*label as usize] += 1.0;
        }
        let params = TrainParams::default();
        let mut plain = PlainHead::new(&head, &head.init_flat(1));
        let rows: Vec<usize> = (0..512).collect();
        let first = plain.step(&data, &rows[..32], &params);
        let mut last = first;
        for _ in 0..20 {
            for chunk in rows.chunks(32) {
                last = plain.step(&data, chunk, &params);
            }
        }
        assert!(first > 1.0 && last < 0.3, "{first} -> {last}");
        // The first step's loss is Burn's for the same parameters and batch.
        let device = training_device(Backend::Flex);
        let params_one = TrainParams {
            local_epochs: 1,
            batch_size: 32,
            learning_rate: 1e-9,
            feature_norm: fedge_wire::FeatureNorm::None,
            ..TrainParams::default()
        };
        let subset = FeatureSet {
            dim: 8,
            features: data.features[..32 * 8].to_vec(),
            labels: data.labels[..32].to_vec(),
        };
        let burn = train_head(&TrainJob::new(
            &head,
            &head.init_flat(1),
            &subset,
            &params_one,
            &device,
        ))
        .unwrap()
        .last_epoch_loss;
        assert!((burn - first).abs() < 1e-4, "{burn} vs {first}");
    }
}
