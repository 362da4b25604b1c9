//! Stable learning's sample weights, as Stable-FedADG's paper runs them (StableNet's weighting
//! with the paper's `lr_w`; docs/algorithms.md §5).
//!
//! For a batch of projector features `z` (`[B, d]`) and the saved [`Memory`] (`[M, d]` features
//! with their logits), the batch's logits `l` (starting at 1) minimise
//!
//! `L_w = L_b / λp + Σ_j softmax(l)_j²`, `L_b = Σ_{a≠b} C_ab²`,
//!
//! where `C` is the covariance of Random Fourier Features `u(x) = √2 cos(ωx + φ)` (`ω ~ N(0,1)`,
//! `φ ~ U(0, 2π)`, one function per dimension, a fresh draw every iteration) of the batch and
//! the memory together, weighted by `softmax([l ; l_mem])` over all `B + M` rows, and
//! `λp` = [`LOSS_SCALE`]. SGD on `l`: learning rate [`WEIGHT_LR`] (the paper's Table 1), ×0.1
//! after half of the [`WEIGHT_ITERATIONS`], momentum 0.9 with PyTorch semantics. The batch's
//! weights are `softmax(l)`; they carry no gradient into the network.
//!
//! The gradient is written out ([`covariance_gradient`]) rather than taken by autodiff: 20 inner
//! iterations per batch made Burn's graph bookkeeping the largest cost of a round. Through the
//! softmax over all rows, `∂L_b/∂l_j = s_j (g_j − Σ_k s_k g_k)` with `g = ∂L_b/∂s`; the sum over
//! all rows needs no per-row gradient of the memory: `Σ_k s_k g_k = 2 (⟨C′, S⟩ − 2 mᵀC′m)`
//! with `S` the weighted second moment, `m` the weighted mean and `C′` the covariance with a
//! zero diagonal.

use rand::Rng;

use crate::random::standard_normal;

/// Learning rate of the sample-weight optimiser (`lr_w`, the paper's Table 1).
pub const WEIGHT_LR: f32 = 0.1;
/// The sample-weight learning rate is multiplied by this after half the iterations.
pub const WEIGHT_LR_DECAY: f32 = 0.1;
/// Momentum of the sample-weight optimiser.
pub const WEIGHT_MOMENTUM: f32 = 0.9;
/// Inner iterations per batch.
pub const WEIGHT_ITERATIONS: usize = 20;
/// StableNet's `λp`: the decorrelation loss is divided by it.
pub const LOSS_SCALE: f32 = 70.0;
/// Rows of the saved memory.
pub const MEMORY_ROWS: usize = 128;
/// Share of a memory row kept when a new batch row is folded in (`presave_ratio`).
pub const MEMORY_DECAY: f32 = 0.9;
/// A memory row is the running mean of its first this many batch rows, then an exponential
/// average.
pub const MEMORY_WARMUP: u32 = 10;

/// Stable learning's saved features and logits ("saving and reloading"), kept by the device
/// between batches and rounds.
///
/// **Choice** (distinct rows): a batch of `B < M` rows writes the next `B` slots in turn, so the
/// memory holds `M` distinct rows (StableNet writes rows `0..B` every batch and, with its batch
/// as large as its memory, never needed more); a batch of `B ≥ M` rows writes all slots from its
/// first `M` rows. Slots never written do not join the weighting (StableNet's start at zero).
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// `MEMORY_ROWS × dims` features, row-major.
    pub features: Vec<f32>,
    /// One logit per row.
    pub logits: Vec<f32>,
    /// Batch rows folded into each row, up to [`MEMORY_WARMUP`].
    pub writes: Vec<u32>,
    /// The next slot a batch of fewer than `MEMORY_ROWS` rows writes.
    pub next: usize,
    /// Feature size.
    pub dims: usize,
}

impl Memory {
    /// An empty memory for features of size `dims`.
    pub fn new(dims: usize) -> Self {
        Self {
            features: vec![0.0; MEMORY_ROWS * dims],
            logits: vec![0.0; MEMORY_ROWS],
            writes: vec![0; MEMORY_ROWS],
            next: 0,
            dims,
        }
    }

    /// Slots written at least once.
    pub fn filled(&self) -> usize {
        self.writes.iter().filter(|&&w| w > 0).count()
    }

    /// Folds a batch (`z`: `[B, dims]`, its learned `logits`) into the memory: each written slot
    /// becomes the running mean of its first [`MEMORY_WARMUP`] rows, then
    /// `0.9·old + 0.1·new`.
    pub fn fold(&mut self, z: &[f32], logits: &[f32]) {
        let (b, d) = (logits.len(), self.dims);
        if b == 0 || z.len() != b * d {
            return;
        }
        let rows = b.min(MEMORY_ROWS);
        for r in 0..rows {
            let slot = if b >= MEMORY_ROWS {
                r
            } else {
                (self.next + r) % MEMORY_ROWS
            };
            let c = self.writes[slot];
            let keep = if c < MEMORY_WARMUP {
                c as f32 / (c + 1) as f32
            } else {
                MEMORY_DECAY
            };
            let new = &z[r * d..(r + 1) * d];
            for (old, v) in self.features[slot * d..(slot + 1) * d].iter_mut().zip(new) {
                *old = keep * *old + (1.0 - keep) * v;
            }
            self.logits[slot] = keep * self.logits[slot] + (1.0 - keep) * logits[r];
            self.writes[slot] = (c + 1).min(MEMORY_WARMUP);
        }
        if b < MEMORY_ROWS {
            self.next = (self.next + b) % MEMORY_ROWS;
        }
    }

    /// The features and logits of the written slots.
    fn joined(&self) -> (Vec<f32>, Vec<f32>) {
        let d = self.dims;
        let mut features = Vec::with_capacity(self.features.len());
        let mut logits = Vec::with_capacity(MEMORY_ROWS);
        for (slot, &w) in self.writes.iter().enumerate() {
            if w > 0 {
                features.extend_from_slice(&self.features[slot * d..(slot + 1) * d]);
                logits.push(self.logits[slot]);
            }
        }
        (features, logits)
    }
}

/// One draw of Random Fourier Features, one function per feature dimension:
/// `u_j(x) = √2 cos(ω_j x + φ_j)` with `ω_j ~ N(0, 1)` and `φ_j ~ U(0, 2π)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rff {
    /// Frequencies, one per dimension.
    pub omega: Vec<f32>,
    /// Phases, one per dimension.
    pub phi: Vec<f32>,
}

impl Rff {
    /// A fresh draw for `dims` dimensions.
    pub fn draw(dims: usize, rng: &mut impl Rng) -> Self {
        let omega = (0..dims).map(|_| standard_normal(rng)).collect();
        let phi = (0..dims)
            .map(|_| rng.random::<f32>() * std::f32::consts::TAU)
            .collect();
        Self { omega, phi }
    }

    /// `u(x)` for the rows of `x` (`[n, dims]`, row-major) into `out` (as long as `x`).
    pub fn apply_into(&self, x: &[f32], out: &mut [f32]) {
        let d = self.omega.len();
        for (row, dst) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            for (o, &v) in dst.iter_mut().zip(row) {
                *o = v;
            }
            for ((o, &w), &p) in dst.iter_mut().zip(&self.omega).zip(&self.phi) {
                *o = w * *o + p;
            }
            for o in dst.iter_mut() {
                *o = std::f32::consts::SQRT_2 * cos(*o);
            }
        }
    }
}

/// `cos(x)` in straight-line arithmetic the compiler vectorises (the RFF's cosines were a sixth
/// of a Stable-FedADG round through libm): within 5e-5 for `|x| ≤ 200`, the error growing with
/// `|x|` as f32's own rounding of `x/2π` does; arguments beyond ±6·10⁶ (features no head
/// produces) are clamped there.
#[inline(always)]
pub fn cos(x: f32) -> f32 {
    // x = 2π (k + t) with k an integer and t in [−½, ½]; adding and subtracting 1.5·2²³
    // rounds to the nearest integer in f32.
    const ROUND: f32 = 12_582_912.0;
    let turns = (x * std::f32::consts::FRAC_1_PI * 0.5).clamp(-1e6, 1e6);
    let t = (turns - ((turns + ROUND) - ROUND)).abs();
    // cos(2πt) = −cos(2π(½ − t)): fold t into [0, ¼] so that the series converges fast.
    // Branch-free, so that a loop of it vectorises: `sign` is −1 past a quarter turn.
    let past = f32::from(u8::from(t > 0.25));
    let sign = 1.0 - 2.0 * past;
    let y = std::f32::consts::TAU * (t + past * (0.5 - 2.0 * t));
    let y2 = y * y;
    let c = 1.0
        + y2 * (-1.0 / 2.0
            + y2 * (1.0 / 24.0
                + y2 * (-1.0 / 720.0
                    + y2 * (1.0 / 40_320.0 + y2 * (-1.0 / 3_628_800.0 + y2 / 479_001_600.0)))));
    sign * c
}

/// Work space of [`covariance_gradient`], reused across iterations.
#[derive(Debug, Default)]
pub struct Scratch {
    second: Vec<f32>,
    mean: Vec<f32>,
    cm: Vec<f32>,
    cu: Vec<f32>,
    /// A row of zeros standing in for the missing rows of the last block of four.
    zero: Vec<f32>,
}

/// What [`covariance_gradient`] computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Covariance {
    /// `L_b`, the sum of squared off-diagonal entries of the weighted covariance.
    pub loss: f32,
    /// `Σ_k w_k ∂L_b/∂w_k` over all rows.
    pub weighted_gradient: f32,
}

/// `L_b` for `u` (`[n, d]`) and weights `w` (`[n]`, summing to 1), with
/// `C = Uᵀ diag(w) U − (Uᵀw)(Uᵀw)ᵀ`, and its gradient with respect to the first `rows` weights
/// written into `gradient[..rows]`: `∂/∂w_i = 2 (u_iᵀ C′ u_i − 2 u_iᵀ C′ m)` with `m = Uᵀw`.
pub fn covariance_gradient(
    u: &[f32],
    d: usize,
    w: &[f32],
    rows: usize,
    gradient: &mut [f32],
    scratch: &mut Scratch,
) -> Covariance {
    let Scratch {
        second,
        mean,
        cm,
        cu,
        zero,
    } = scratch;
    second.clear();
    second.resize(d * d, 0.0);
    mean.clear();
    mean.resize(d, 0.0);
    // The upper triangle of S = Uᵀ diag(w) U, four rows at a time (one pass over S per four),
    // in zipped loops the compiler vectorises.
    zero.clear();
    zero.resize(d, 0.0);
    let zero = &*zero;
    for (block, wb) in u.chunks(4 * d).zip(w.chunks(4)) {
        let row = |r: usize| block.get(r * d..(r + 1) * d).unwrap_or(zero);
        let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
        let wt = |r: usize| wb.get(r).copied().unwrap_or(0.0);
        let (w0, w1, w2, w3) = (wt(0), wt(1), wt(2), wt(3));
        for (((m, a0), (a1, a2)), a3) in mean.iter_mut().zip(r0).zip(r1.iter().zip(r2)).zip(r3) {
            *m += w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3;
        }
        for a in 0..d {
            let (c0, c1, c2, c3) = (w0 * r0[a], w1 * r1[a], w2 * r2[a], w3 * r3[a]);
            let dst = &mut second[a * d + a..(a + 1) * d];
            let rows = r0[a..]
                .iter()
                .zip(&r1[a..])
                .zip(r2[a..].iter().zip(&r3[a..]));
            for (s, ((x0, x1), (x2, x3))) in dst.iter_mut().zip(rows) {
                *s += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3;
            }
        }
    }
    // C′ (overwriting S) with the loss and ⟨C′, S⟩ on the way.
    let (mut loss, mut inner) = (0.0f32, 0.0f32);
    for a in 0..d {
        for b in a..d {
            let s = second[a * d + b];
            let c = if a == b { 0.0 } else { s - mean[a] * mean[b] };
            let twice = if a == b { 1.0 } else { 2.0 };
            loss += twice * c * c;
            inner += twice * c * s;
            second[a * d + b] = c;
            second[b * d + a] = c;
        }
    }
    let cov = &*second;
    cm.clear();
    cm.extend(
        cov.chunks_exact(d)
            .map(|row| row.iter().zip(mean.iter()).map(|(c, m)| c * m).sum::<f32>()),
    );
    let mcm: f32 = mean.iter().zip(cm.iter()).map(|(m, c)| m * c).sum();
    cu.clear();
    cu.resize(d, 0.0);
    for (row, g) in u.chunks_exact(d).zip(gradient.iter_mut()).take(rows) {
        cu.fill(0.0);
        for (a, &ua) in row.iter().enumerate() {
            for (x, &c) in cu.iter_mut().zip(&cov[a * d..(a + 1) * d]) {
                *x += ua * c;
            }
        }
        let quadratic: f32 = row.iter().zip(cu.iter()).map(|(u, c)| u * c).sum();
        let linear: f32 = row.iter().zip(cm.iter()).map(|(u, c)| u * c).sum();
        *g = 2.0 * (quadratic - 2.0 * linear);
    }
    Covariance {
        loss,
        weighted_gradient: 2.0 * (inner - 2.0 * mcm),
    }
}

/// The softmax of `logits`.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// `L_w = L_b(softmax([l ; l_mem])) / λp + Σ softmax(l)²` for the RFF rows `u` (`[n + M, d]`,
/// the batch's `n` rows first) and its gradient with respect to the batch's logits `l`, written
/// into `gradient[..n]`. Returns `L_w`.
pub fn logit_gradient(
    u: &[f32],
    d: usize,
    logits: &[f32],
    saved_logits: &[f32],
    gradient: &mut [f32],
    scratch: &mut Scratch,
) -> f32 {
    let n = logits.len();
    let joint: Vec<f32> = logits.iter().chain(saved_logits).copied().collect();
    let s = softmax(&joint);
    let cov = covariance_gradient(u, d, &s, n, gradient, scratch);
    let p = softmax(logits);
    let p2: f32 = p.iter().map(|p| p * p).sum();
    for ((g, s), p) in gradient.iter_mut().zip(&s).zip(&p) {
        let decorrelate = s * (*g - cov.weighted_gradient) / LOSS_SCALE;
        *g = decorrelate + 2.0 * p * (p - p2);
    }
    cov.loss / LOSS_SCALE + p2
}

/// What [`sample_weights`] learned for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchWeights {
    /// `softmax(l)`, summing to 1 over the batch.
    pub weights: Vec<f32>,
    /// The learned logits `l` (what the memory keeps).
    pub logits: Vec<f32>,
}

/// Stable learning's sample weights for one batch of projector features `z` (`[n, dims]`,
/// row-major) together with `memory` (see the module docs).
pub fn sample_weights(
    z: &[f32],
    dims: usize,
    memory: Option<&Memory>,
    rng: &mut impl Rng,
) -> BatchWeights {
    let n = z.len() / dims.max(1);
    if n == 0 {
        return BatchWeights {
            weights: Vec::new(),
            logits: Vec::new(),
        };
    }
    let (saved, saved_logits) = memory
        .filter(|m| m.dims == dims)
        .map(Memory::joined)
        .unwrap_or_default();
    let all: Vec<f32> = z.iter().chain(&saved).copied().collect();
    let mut logits = vec![1.0f32; n];
    let mut velocity = vec![0.0f32; n];
    let mut gradient = vec![0.0f32; n];
    let mut u = vec![0.0f32; all.len()];
    let mut scratch = Scratch::default();
    for iteration in 0..WEIGHT_ITERATIONS {
        let lr = if iteration < WEIGHT_ITERATIONS / 2 {
            WEIGHT_LR
        } else {
            WEIGHT_LR * WEIGHT_LR_DECAY
        };
        Rff::draw(dims, rng).apply_into(&all, &mut u);
        logit_gradient(
            &u,
            dims,
            &logits,
            &saved_logits,
            &mut gradient,
            &mut scratch,
        );
        for ((logit, v), &g) in logits.iter_mut().zip(&mut velocity).zip(&gradient) {
            // PyTorch's SGD with momentum: the buffer starts at the first gradient.
            *v = if iteration == 0 {
                g
            } else {
                WEIGHT_MOMENTUM * *v + g
            };
            *logit -= lr * *v;
        }
    }
    BatchWeights {
        weights: softmax(&logits),
        logits,
    }
}
