//! The rescan before a round (`crate::rescan`), on the training thread: the site folder's data
//! now, on the task's class list.

use std::sync::{Arc, Mutex};

use crate::rescan::SiteScan;
use fedge_device::FeatureSet;
use fedge_device::classes;
use fedge_device::machine::DataSummary;
use fedge_device::train::TrainError;

/// The device's data after a rescan, for the driver to keep and the machine to report.
#[derive(Debug, Clone)]
pub struct Refreshed {
    /// Training split, on the task's class list.
    pub train: Arc<FeatureSet>,
    /// Validation split.
    pub val: Arc<FeatureSet>,
    /// The task's class list (the labels' names).
    pub class_names: Vec<String>,
    /// What the status reports.
    pub summary: DataSummary,
}

/// Rescans and renumbers onto `federation`; an unreadable folder or a class the federation
/// lacks fails the round (the previous data stay).
pub fn rescan(scan: &Mutex<SiteScan>, federation: &[String]) -> Result<Refreshed, TrainError> {
    let mut scan = scan.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let scanned = scan.scan().map_err(|e| TrainError::Rescan(e.to_string()))?;
    if scanned.deferred > 0 {
        tracing::warn!(
            deferred = scanned.deferred,
            "new images left out: their features would pass [resources] feature_cache_mb"
        );
    }
    let (mut train, mut val) = (scanned.train, scanned.val);
    let mut names = scanned.class_names;
    classes::renumber(&mut [&mut train, &mut val], &mut names, federation)?;
    let used = (names.iter().enumerate())
        .filter(|(k, _)| (train.labels.iter().chain(&val.labels)).any(|l| *l as usize == *k))
        .map(|(_, n)| n.clone())
        .collect();
    let summary = DataSummary {
        samples: train.len() as u32,
        val_samples: val.len() as u32,
        new_samples: scanned.added as u32,
        classes: used,
    };
    Ok(Refreshed {
        train: Arc::new(train),
        val: Arc::new(val),
        class_names: names,
        summary,
    })
}
