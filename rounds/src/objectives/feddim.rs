//! FedDIM on the coordinator (docs/algorithms.md §3): class-mean insight matrices rebuilt exactly
//! from each client's compact statistics, averaged per class, smoothed with momentum.
//!
//! Shapes: a classifier weight `W` is `[H, K]` row-major (`W[j][k]`); class means are
//! `[K, H]`; an insight matrix `I^(c)` is `[H, K]` with `I^(c)[j][k] = W[j][k] · z̄_c[j]`; the
//! global `Ī` is `[K, H, K]` (class, then the matrix).
//!
//! The rebuild is exact because `W_c` is the same for every sample of the client: the mean over
//! class `c` of `W_c ⊙ (z_i 1ᵀ)` is `W_c ⊙ (z̄_c 1ᵀ)`. A client sends K·H numbers instead of the
//! K·H·K of the tensor itself.
//!
//! [`GlobalInsight`] is the state the round machine keeps between rounds (the global `Ī`); it
//! goes down with each task and into the checkpoint. Nothing here validates updates or knows
//! about rounds.

use fedge_wire::{HeadConfig, TensorF32};

use super::ClientStats;
use crate::updates::RoundUpdates;

/// FedDIM's server settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InsightConfig {
    /// Projector width `H`.
    pub hidden: usize,
    /// Classes `K`.
    pub classes: usize,
    /// Momentum `m` of `Ī ← (1 − m) Ī + m Ī_g`.
    pub momentum: f32,
}

/// One client's contribution: its final classifier weight and its class statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientInsight {
    /// `W_c = W_g + ΔW_c`, `[H, K]`.
    pub classifier: Vec<f32>,
    /// Samples per class.
    pub counts: Vec<u32>,
    /// Class-mean projector features, `[K, H]`.
    pub means: Vec<f32>,
}

/// `W ⊙ (z̄ 1ᵀ)`: the `[H, K]` insight matrix of mean feature `z̄` (length H).
pub fn class_insight(classifier: &[f32], mean: &[f32], classes: usize) -> Vec<f32> {
    classifier
        .chunks_exact(classes)
        .zip(mean)
        .flat_map(|(row, z)| row.iter().map(move |w| w * z))
        .collect()
}

/// `Ī_g`: per class, the mean of the clients' class insight matrices over the clients that saw
/// the class (f64 sums). Returns the `[K, H, K]` tensor and which classes were seen.
pub fn round_insight(clients: &[ClientInsight], config: &InsightConfig) -> (Vec<f32>, Vec<bool>) {
    let (h, k) = (config.hidden, config.classes);
    let block = h * k;
    let mut sum = vec![0f64; k * block];
    let mut seen = vec![0usize; k];
    for client in clients {
        for c in 0..k {
            if client.counts.get(c).copied().unwrap_or(0) == 0 {
                continue;
            }
            let mean = &client.means[c * h..(c + 1) * h];
            let insight = class_insight(&client.classifier, mean, k);
            for (s, v) in sum[c * block..(c + 1) * block].iter_mut().zip(&insight) {
                *s += *v as f64;
            }
            seen[c] += 1;
        }
    }
    let out = sum
        .chunks_exact(block)
        .zip(&seen)
        .flat_map(|(cls, n)| {
            cls.iter()
                .map(move |v| if *n > 0 { (v / *n as f64) as f32 } else { 0.0 })
        })
        .collect();
    (out, seen.iter().map(|n| *n > 0).collect())
}

/// `Ī ← (1 − m) Ī + m Ī_g` for the classes seen this round; a class seen for the first time
/// (no `previous`, or its block still all zeros: nobody had seen it) takes `Ī_g` whole, rather
/// than `m Ī_g` pulled towards zero; an unseen class keeps its previous value (zeros before
/// anyone saw it, which devices read as "no insight yet" and leave out of the term).
pub fn update_global(
    previous: Option<&[f32]>,
    round: &[f32],
    seen: &[bool],
    config: &InsightConfig,
) -> Vec<f32> {
    let block = config.hidden * config.classes;
    let m = config.momentum;
    let mut out = previous.map_or_else(|| vec![0.0; round.len()], <[f32]>::to_vec);
    for (c, is_seen) in seen.iter().enumerate() {
        if !is_seen {
            continue;
        }
        let range = c * block..(c + 1) * block;
        let first = out[range.clone()].iter().all(|v| *v == 0.0);
        for (o, g) in out[range.clone()].iter_mut().zip(&round[range]) {
            *o = if first { *g } else { (1.0 - m) * *o + m * g };
        }
    }
    out
}

/// FedDIM's server state: its settings and the global `Ī` `[K, H, K]`, once a round made it.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalInsight {
    config: InsightConfig,
    global: Option<Vec<f32>>,
}

impl GlobalInsight {
    /// No `Ī` yet.
    pub fn new(config: InsightConfig) -> Self {
        Self {
            config,
            global: None,
        }
    }

    /// Whether `values` saved in a checkpoint have the shape of this configuration's `Ī`.
    pub fn fits(&self, values: &[f32]) -> bool {
        values.len() == self.config.classes * self.config.hidden * self.config.classes
    }

    /// Takes a saved `Ī` back (checked with [`GlobalInsight::fits`] first).
    pub fn restore(&mut self, values: Vec<f32>) {
        self.global = Some(values);
    }

    /// The global `Ī`, if a round produced one.
    pub fn global(&self) -> Option<&[f32]> {
        self.global.as_deref()
    }

    /// The global `Ī` as sent with a task.
    pub fn tensor(&self) -> Option<TensorF32> {
        let (h, k) = (self.config.hidden as u32, self.config.classes as u32);
        TensorF32::new(vec![k, h, k], self.global.as_deref()?).ok()
    }

    /// Rebuilds each accepted client's class insight from `W_g + ΔW_c` (`params` are the
    /// parameters before this round's aggregation) and its class means, and folds the round
    /// into `Ī`.
    pub fn fold(&mut self, params: &[f32], accepted: &RoundUpdates, stats: &ClientStats) {
        let config = self.config;
        let (h, k) = (config.hidden, config.classes);
        let Some(w_range) = HeadConfig::classifier_range_from_end(params.len(), h, k) else {
            return;
        };
        let clients: Vec<ClientInsight> = (0..accepted.len())
            .filter_map(|i| {
                let (counts, means) = stats.get(accepted.client(i))?;
                let delta = accepted.delta(i).slice(w_range.clone());
                let classifier = params[w_range.clone()]
                    .iter()
                    .zip(delta.iter())
                    .map(|(g, d)| g + d)
                    .collect();
                Some(ClientInsight {
                    classifier,
                    counts: counts.clone(),
                    means: means.clone(),
                })
            })
            .collect();
        if clients.is_empty() {
            return;
        }
        let (round, seen) = round_insight(&clients, &config);
        self.global = Some(update_global(
            self.global.as_deref(),
            &round,
            &seen,
            &config,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn compact_statistics_rebuild_the_full_class_mean_tensor() {
        let (h, k) = (6, 4);
        let config = InsightConfig {
            hidden: h,
            classes: k,
            momentum: 0.5,
        };
        let mut seed = 3;
        // Two clients with random heads and per-sample features; client 1 never sees class 3.
        let mut clients = Vec::new();
        let mut direct = vec![vec![0f64; h * k]; k];
        let mut clients_per_class = vec![0; k];
        for client in 0..2 {
            let w: Vec<f32> = (0..h * k).map(|_| lcg(&mut seed)).collect();
            let labels: Vec<usize> = (0..20)
                .map(|i| if client == 1 { i % 3 } else { i % k })
                .collect();
            let z: Vec<Vec<f32>> = labels
                .iter()
                .map(|_| (0..h).map(|_| lcg(&mut seed).max(0.0)).collect())
                .collect();
            let mut counts = vec![0u32; k];
            let mut means = vec![0f32; k * h];
            // The full per-sample tensors, averaged per class: what FedDIM would send.
            let mut full = vec![vec![0f64; h * k]; k];
            for (zi, &y) in z.iter().zip(&labels) {
                counts[y] += 1;
                for j in 0..h {
                    means[y * h + j] += zi[j];
                    for kk in 0..k {
                        full[y][j * k + kk] += (w[j * k + kk] * zi[j]) as f64;
                    }
                }
            }
            for c in 0..k {
                if counts[c] > 0 {
                    means[c * h..(c + 1) * h]
                        .iter_mut()
                        .for_each(|v| *v /= counts[c] as f32);
                    for (d, f) in direct[c].iter_mut().zip(&full[c]) {
                        *d += f / counts[c] as f64;
                    }
                    clients_per_class[c] += 1;
                }
            }
            clients.push(ClientInsight {
                classifier: w,
                counts,
                means,
            });
        }
        let (rebuilt, seen) = round_insight(&clients, &config);
        assert_eq!(seen, vec![true; k]);
        for c in 0..k {
            for i in 0..h * k {
                let want = direct[c][i] / clients_per_class[c] as f64;
                let got = rebuilt[c * h * k + i] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "class {c} entry {i}: {got} vs {want}"
                );
            }
        }
        assert_eq!(
            clients_per_class[3], 1,
            "class 3 averages over one client only"
        );
    }

    #[test]
    fn momentum_first_round_later_rounds_and_a_missing_class() {
        let config = InsightConfig {
            hidden: 1,
            classes: 2,
            momentum: 0.25,
        };
        // Ī is [K=2, H=1, K=2]: class 0 → entries 0..2, class 1 → entries 2..4.
        let first = update_global(None, &[1.0, 2.0, 3.0, 4.0], &[true, false], &config);
        assert_eq!(
            first,
            vec![1.0, 2.0, 0.0, 0.0],
            "first round takes Ī_g; unseen stays 0"
        );
        let second = update_global(Some(&first), &[5.0, 6.0, 7.0, 8.0], &[true, true], &config);
        // Class 0 with momentum; class 1, seen for the first time, takes Ī_g whole (not
        // 0.25 × Ī_g, a quarter of its magnitude pulled towards zero).
        assert_eq!(second, vec![2.0, 3.0, 7.0, 8.0]);
        let third = update_global(
            Some(&second),
            &[9.0, 9.0, 9.0, 9.0],
            &[false, true],
            &config,
        );
        assert_eq!(
            &third[..2],
            &[2.0, 3.0],
            "a class nobody saw keeps its value"
        );
        assert_eq!(&third[2..], &[7.5, 8.25]);
    }
}
