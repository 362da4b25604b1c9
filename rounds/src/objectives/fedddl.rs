//! FedDDL on the coordinator (docs/algorithms.md §4, DEB): the global causal prototypes `U_G`.
//!
//! Each client sends, per class, how many object-only inputs it has and the mean of their
//! projector features under the round's global head. **Choice**: `U_G^k` is the count-weighted
//! mean of the clients' class-`k` prototypes, which is the mean object-only feature of class `k`
//! over every client's data (the paper averages over clients without saying how; weighting by
//! counts keeps a client with three samples of a class from counting as much as one with three
//! hundred). A class no client saw this round keeps its previous prototype (zero before any).
//!
//! [`GlobalPrototypes`] is the state the round machine keeps between rounds (`U_G`); it goes
//! down with each task and into the checkpoint. Nothing here validates updates or knows about
//! rounds.

use fedge_wire::TensorF32;

use super::ClientStats;
use crate::updates::RoundUpdates;

/// FedDDL's server settings: the prototype shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrototypeConfig {
    /// Projector width `H`.
    pub hidden: usize,
    /// Classes `K`.
    pub classes: usize,
}

/// The new global prototypes `[K, H]` from the clients' `(counts [K], means [K, H])` and the
/// previous ones (f64 sums).
pub fn average_prototypes(
    previous: Option<&[f32]>,
    clients: &[(&[u32], &[f32])],
    config: &PrototypeConfig,
) -> Vec<f32> {
    let (h, k) = (config.hidden, config.classes);
    let mut sum = vec![0f64; k * h];
    let mut total = vec![0f64; k];
    for (counts, means) in clients {
        for c in 0..k {
            let n = counts.get(c).copied().unwrap_or(0);
            let Some(mean) = means.get(c * h..(c + 1) * h) else {
                continue;
            };
            if n == 0 {
                continue;
            }
            total[c] += f64::from(n);
            for (s, v) in sum[c * h..(c + 1) * h].iter_mut().zip(mean) {
                *s += f64::from(n) * f64::from(*v);
            }
        }
    }
    (0..k * h)
        .map(|i| {
            let c = i / h;
            if total[c] > 0.0 {
                (sum[i] / total[c]) as f32
            } else {
                previous.and_then(|p| p.get(i).copied()).unwrap_or(0.0)
            }
        })
        .collect()
}

/// FedDDL's server state: the prototype shape and the global `U_G` `[K, H]`, once a round made
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalPrototypes {
    config: PrototypeConfig,
    global: Option<Vec<f32>>,
}

impl GlobalPrototypes {
    /// No `U_G` yet.
    pub fn new(config: PrototypeConfig) -> Self {
        Self {
            config,
            global: None,
        }
    }

    /// Whether `values` saved in a checkpoint have the shape of this configuration's `U_G`.
    pub fn fits(&self, values: &[f32]) -> bool {
        values.len() == self.config.classes * self.config.hidden
    }

    /// Takes a saved `U_G` back (checked with [`GlobalPrototypes::fits`] first).
    pub fn restore(&mut self, values: Vec<f32>) {
        self.global = Some(values);
    }

    /// The global `U_G`, if a round produced one.
    pub fn global(&self) -> Option<&[f32]> {
        self.global.as_deref()
    }

    /// The global `U_G` as sent with a task.
    pub fn tensor(&self) -> Option<TensorF32> {
        let shape = vec![self.config.classes as u32, self.config.hidden as u32];
        TensorF32::new(shape, self.global.as_deref()?).ok()
    }

    /// Folds the accepted clients' local prototypes into `U_G`.
    pub fn fold(&mut self, accepted: &RoundUpdates, stats: &ClientStats) {
        let clients: Vec<(&[u32], &[f32])> = (0..accepted.len())
            .filter_map(|i| stats.get(accepted.client(i)))
            .map(|(counts, means)| (counts.as_slice(), means.as_slice()))
            .collect();
        if !clients.is_empty() {
            let previous = self.global.as_deref();
            self.global = Some(average_prototypes(previous, &clients, &self.config));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prototypes_are_count_weighted_and_unseen_classes_keep_their_value() {
        let config = PrototypeConfig {
            hidden: 2,
            classes: 3,
        };
        // Client a: 1 sample of class 0, 3 of class 1; client b: 3 of class 0, none of class 1.
        let a = ([1u32, 3, 0], [1.0f32, 2.0, 10.0, 10.0, 99.0, 99.0]);
        let b = ([3u32, 0, 0], [5.0f32, 6.0, 77.0, 77.0, 88.0, 88.0]);
        let clients = [(&a.0[..], &a.1[..]), (&b.0[..], &b.1[..])];
        let previous = [0.0, 0.0, 0.0, 0.0, 7.0, 8.0];
        let got = average_prototypes(Some(&previous), &clients, &config);
        // Class 0: (1·(1, 2) + 3·(5, 6)) / 4 = (4, 5); class 1 from a alone; class 2 kept.
        assert_eq!(got, vec![4.0, 5.0, 10.0, 10.0, 7.0, 8.0]);
        assert_eq!(average_prototypes(None, &clients, &config)[4..], [0.0, 0.0]);
    }
}
