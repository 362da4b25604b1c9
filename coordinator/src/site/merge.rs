//! A site's devices as one participant of the global federation: their updates for one round
//! merged into the single update the site sends upstream.
//!
//! - The delta is the sample-weighted mean of the devices' deltas (FedAvg inside the site) and
//!   its weight their total sample count, so FedAvg across sites gives the global model FedAvg
//!   over all devices would.
//! - FedDDL's prototypes are merged exactly: per class the summed count and the count-weighted
//!   mean, so the global prototypes are those a flat federation computes
//!   (docs/algorithms.md §4).
//! - FedDIM's class statistics cannot be merged in their compact form: the coordinator rebuilds
//!   each participant's insight from its own classifier, `W_g + ΔW`, and the site's merged
//!   classifier is not each device's. A merge with FedDIM statistics is refused
//!   ([`MergeError::FedDim`]).
//! - The metrics: the loss is the sample-weighted mean of the devices', the validation accuracy
//!   their validation-sample-weighted mean over the summed validation samples, the time the
//!   longest device's (they train side by side).

use fedge_wire::{ClassStats, ClientUpdate, Codec, TensorF32};

/// Why updates cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Nothing to merge.
    #[error("no device update to merge")]
    Empty,
    /// The updates answer different rounds or runs, or have different shapes.
    #[error("the device updates do not match: {0}")]
    Mismatch(String),
    /// No device reported a sample.
    #[error("the device updates carry no samples")]
    NoSamples,
    /// FedDIM's compact class statistics (see the module's documentation).
    #[error(
        "FedDIM's class statistics cannot be merged at a site: the coordinator rebuilds each \
         participant's insight from its own classifier; run FedDIM with devices as participants"
    )]
    FedDim,
}

/// One update for `site` holding `updates` (the devices' updates for one round, already
/// validated), encoded with `codec`.
pub fn merge(
    site: &str,
    updates: &[ClientUpdate],
    codec: Codec,
) -> Result<ClientUpdate, MergeError> {
    let first = updates.first().ok_or(MergeError::Empty)?;
    if updates.iter().any(|u| u.class_stats.is_some()) {
        return Err(MergeError::FedDim);
    }
    let len = first.delta.len();
    for u in updates {
        if (u.run, u.round) != (first.run, first.round) || u.delta.len() != len {
            return Err(MergeError::Mismatch(format!(
                "{} answers run {:016x} round {} with {} values, {} run {:016x} round {} with {}",
                u.client_id,
                u.run,
                u.round,
                u.delta.len(),
                first.client_id,
                first.run,
                first.round,
                len
            )));
        }
    }
    let total: u64 = updates.iter().map(|u| u64::from(u.num_samples)).sum();
    if total == 0 {
        return Err(MergeError::NoSamples);
    }
    // Summed in f64 in device order: the same bits whatever the arrival order.
    let mut delta = vec![0f64; len];
    let (mut loss, mut right, mut val, mut seconds) = (0f64, 0f64, 0u64, 0f32);
    for u in updates {
        let w = f64::from(u.num_samples) / total as f64;
        for (d, v) in delta.iter_mut().zip(u.delta.to_vec()) {
            *d += w * f64::from(v);
        }
        loss += w * f64::from(u.metrics.train_loss);
        right += f64::from(u.metrics.val_accuracy) * f64::from(u.metrics.val_samples);
        val += u64::from(u.metrics.val_samples);
        seconds = seconds.max(u.metrics.train_seconds);
    }
    let delta: Vec<f32> = delta.into_iter().map(|v| v as f32).collect();
    let prototypes = merge_stats(updates.iter().filter_map(|u| u.prototypes.as_ref()), codec)?;
    Ok(ClientUpdate {
        run: first.run,
        round: first.round,
        client_id: site.to_owned(),
        seq: first.round,
        num_samples: u32::try_from(total).unwrap_or(u32::MAX),
        delta: TensorF32::from_slice_with(&delta, codec),
        metrics: fedge_wire::LocalMetrics {
            train_loss: loss as f32,
            val_accuracy: if val == 0 {
                0.0
            } else {
                (right / val as f64) as f32
            },
            val_samples: u32::try_from(val).unwrap_or(u32::MAX),
            train_seconds: seconds,
        },
        class_stats: None,
        prototypes,
    })
}

/// Per class, the summed counts and the count-weighted means of `stats`.
fn merge_stats<'a>(
    stats: impl Iterator<Item = &'a ClassStats>,
    codec: Codec,
) -> Result<Option<ClassStats>, MergeError> {
    let mut counts: Vec<u64> = Vec::new();
    let mut sums: Vec<f64> = Vec::new();
    let mut width = 0;
    let mut any = false;
    for s in stats {
        let means = s.means.to_vec();
        let classes = s.counts.len();
        if classes == 0 || !means.len().is_multiple_of(classes) {
            return Err(MergeError::Mismatch("prototypes of no class".into()));
        }
        if !any {
            (counts, sums, width) = (
                vec![0; classes],
                vec![0.0; means.len()],
                means.len() / classes,
            );
            any = true;
        }
        if classes != counts.len() || means.len() != sums.len() {
            return Err(MergeError::Mismatch(
                "prototypes of different shapes".into(),
            ));
        }
        for (k, &n) in s.counts.iter().enumerate() {
            counts[k] += u64::from(n);
            for (sum, m) in sums[k * width..(k + 1) * width]
                .iter_mut()
                .zip(&means[k * width..(k + 1) * width])
            {
                *sum += f64::from(n) * f64::from(*m);
            }
        }
    }
    if !any {
        return Ok(None);
    }
    let means: Vec<f32> = (sums.chunks(width.max(1)).zip(&counts))
        .flat_map(|(row, &n)| {
            row.iter()
                .map(move |s| if n == 0 { 0.0 } else { (s / n as f64) as f32 })
        })
        .collect();
    Ok(Some(ClassStats {
        counts: counts
            .iter()
            .map(|&n| u32::try_from(n).unwrap_or(u32::MAX))
            .collect(),
        means: TensorF32::from_slice_with(&means, codec),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(
        id: &str,
        samples: u32,
        delta: &[f32],
        protos: Option<(&[u32], &[f32])>,
    ) -> ClientUpdate {
        ClientUpdate {
            run: 5,
            round: 2,
            client_id: id.into(),
            seq: 2,
            num_samples: samples,
            delta: TensorF32::from_slice(delta),
            metrics: fedge_wire::LocalMetrics::default(),
            class_stats: None,
            prototypes: protos.map(|(counts, means)| ClassStats {
                counts: counts.to_vec(),
                means: TensorF32::from_slice(means),
            }),
        }
    }

    #[test]
    fn the_site_update_is_the_sample_weighted_mean_and_prototypes_are_exact() {
        let a = update("a", 1, &[1.0, 0.0], Some((&[1, 0], &[2.0, 2.0, 0.0, 0.0])));
        let b = update("b", 3, &[5.0, 4.0], Some((&[3, 2], &[6.0, 2.0, 1.0, 3.0])));
        let site = merge("plant-7", &[a, b], Codec::F32).unwrap();
        assert_eq!(site.client_id, "plant-7");
        assert_eq!(site.num_samples, 4);
        assert_eq!(site.delta.to_vec(), [4.0, 3.0]);
        let p = site.prototypes.unwrap();
        assert_eq!(p.counts, [4, 2]);
        // Class 0: (1·[2,2] + 3·[6,2]) / 4; class 1: b's alone.
        assert_eq!(p.means.to_vec(), [5.0, 2.0, 1.0, 3.0]);
    }

    #[test]
    fn what_cannot_be_merged_is_refused() {
        let a = update("a", 1, &[1.0], None);
        assert_eq!(merge("s", &[], Codec::F32), Err(MergeError::Empty));
        let mut other_round = update("b", 1, &[1.0], None);
        other_round.round = 3;
        assert!(matches!(
            merge("s", &[a.clone(), other_round], Codec::F32),
            Err(MergeError::Mismatch(_))
        ));
        let empty = update("c", 0, &[1.0], None);
        assert_eq!(merge("s", &[empty], Codec::F32), Err(MergeError::NoSamples));
        let mut feddim = a.clone();
        feddim.class_stats = Some(ClassStats {
            counts: vec![1],
            means: TensorF32::from_slice(&[0.5]),
        });
        assert_eq!(
            merge("s", &[a, feddim], Codec::F32),
            Err(MergeError::FedDim)
        );
    }
}
