//! Data that grows: with `[data] rescan = true` a device looks at its site folder again before
//! each round, featurises the images it has not seen (through the same decoder and backbone as
//! at start), drops the ones that are gone, and trains on what is there now.
//!
//! Each file keeps its features and its split for as long as it exists: whether an image is
//! held out for validation is drawn from a hash of its path and the device's seed, so adding
//! images never moves an old one between the splits. The features of all files stay within
//! `[resources] feature_cache_mb`; new images beyond it wait (the oldest are kept).
//!
//! The new images' features are shown as they are computed, and the files that do not decode
//! are counted once each, in the process's `data::LoadReport` (which the agent's status and
//! metrics read) unless [`SiteScan::with_report`] gives another.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fedge_models::Backbone;

use crate::data::decode::{decode, to_chw};
use crate::data::progress::{Phase, Progress};
use crate::data::{DataError, LoadReport, list_site};
use crate::features::BATCH;
use fedge_device::{FeatureSet, Fnv64};

/// One image the device has seen.
struct Seen {
    class: String,
    features: Vec<f32>,
    val: bool,
}

/// A device's site folder and the features of every image in it.
pub struct SiteScan {
    dir: PathBuf,
    backbone: Arc<Backbone>,
    val_fraction: f32,
    seed: u64,
    budget_bytes: usize,
    seen: BTreeMap<PathBuf, Seen>,
    report: Arc<LoadReport>,
}

impl std::fmt::Debug for SiteScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SiteScan")
            .field("dir", &self.dir)
            .field("images", &self.seen.len())
            .finish_non_exhaustive()
    }
}

/// What a scan found.
#[derive(Debug, Clone)]
pub struct Scanned {
    /// The training split, labelled by `class_names`.
    pub train: FeatureSet,
    /// The validation split.
    pub val: FeatureSet,
    /// The class of each label (the site's class folders, sorted).
    pub class_names: Vec<String>,
    /// Images featurised by this scan.
    pub added: usize,
    /// Images gone since the last scan.
    pub removed: usize,
    /// New images left out because the features would pass the budget.
    pub deferred: usize,
    /// New files that could not be decoded (half-written, corrupt), with the reason: left out
    /// of this scan and tried again at the next, so one bad file fails nothing.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Why a scan failed (the last scan's data stay in use).
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The folder or an image cannot be read.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The backbone failed on the new images.
    #[error(transparent)]
    Backbone(#[from] fedge_models::BackboneError),
}

impl SiteScan {
    /// A scanner of `dir` through `backbone`, holding at most `budget_mb` MiB of features
    /// (0: no limit).
    pub fn new(
        dir: &Path,
        backbone: Arc<Backbone>,
        val_fraction: f32,
        seed: u64,
        budget_mb: usize,
    ) -> Self {
        Self {
            dir: dir.to_owned(),
            backbone,
            val_fraction,
            seed,
            budget_bytes: if budget_mb == 0 {
                usize::MAX
            } else {
                budget_mb.saturating_mul(1 << 20)
            },
            seen: BTreeMap::new(),
            report: LoadReport::process(),
        }
    }

    /// Shows the scans' progress and counts the files left out in `report` instead of the
    /// process's.
    pub fn with_report(mut self, report: Arc<LoadReport>) -> Self {
        self.report = report;
        self
    }

    /// Looks at the folder again; see the module documentation.
    pub fn scan(&mut self) -> Result<Scanned, ScanError> {
        let listing = list_site(&self.dir)?;
        let present: BTreeMap<&PathBuf, &String> = (listing.iter())
            .flat_map(|(class, files)| files.iter().map(move |f| (f, class)))
            .collect();
        let before = self.seen.len();
        self.seen
            .retain(|path, seen| present.get(path).is_some_and(|c| **c == seen.class));
        let removed = before - self.seen.len();
        let dim = self.backbone.card().feature_size;
        let room = (self.budget_bytes / (4 * dim.max(1))).saturating_sub(self.seen.len());
        let new: Vec<(&PathBuf, &String)> = (present.iter())
            .filter(|(path, _)| !self.seen.contains_key(**path))
            .map(|(p, c)| (*p, *c))
            .collect();
        let deferred = new.len().saturating_sub(room);
        let card = self.backbone.card();
        let (c, h, w) = (card.channels, card.height as u32, card.width as u32);
        let mut skipped = Vec::new();
        let todo = &new[..new.len() - deferred];
        let report = Arc::clone(&self.report);
        let mut progress = (!todo.is_empty()).then(|| {
            let what = "computing the features of new images";
            Progress::start(&report, Phase::Features, todo.len() as u64, what)
        });
        for batch in todo.chunks(BATCH) {
            if let Some(progress) = progress.as_mut() {
                progress.advance(batch.len() as u64);
            }
            let mut pixels = Vec::new();
            let mut kept = Vec::with_capacity(batch.len());
            for &(path, class) in batch {
                match decode(path) {
                    Ok(image) => {
                        pixels.extend(to_chw(image, c, h, w));
                        kept.push((path, class));
                    }
                    Err(e) => {
                        let counted = report.skip(&self.dir, path, &e.file_reason());
                        skipped.push((path.clone(), e.to_string(), counted));
                    }
                }
            }
            if kept.is_empty() {
                continue;
            }
            let batch = kept;
            let shape = (c, h as usize, w as usize);
            let features = self.backbone.features_of(&pixels, shape, 255.0, BATCH)?;
            for ((path, class), row) in batch.iter().zip(features.chunks_exact(dim)) {
                let val = self.held_out(path);
                let seen = Seen {
                    class: (*class).clone(),
                    features: row.to_vec(),
                    val,
                };
                self.seen.insert((*path).clone(), seen);
            }
        }
        let class_names: Vec<String> = listing.iter().map(|(c, _)| c.clone()).collect();
        let (mut train, mut val) = (empty(dim), empty(dim));
        for seen in self.seen.values() {
            let label = class_names.binary_search(&seen.class).unwrap_or(0) as u32;
            let set = if seen.val { &mut val } else { &mut train };
            set.features.extend_from_slice(&seen.features);
            set.labels.push(label);
        }
        if let Some(progress) = progress {
            let new = todo.len() - skipped.len();
            progress.end(&format!("features of {new} new images computed"));
        }
        // Said once per file; tried again at every scan.
        for (path, reason, counted) in &skipped {
            if *counted {
                tracing::warn!(file = %path.display(), %reason, "image skipped (tried again at the next scan)");
            } else {
                tracing::debug!(file = %path.display(), %reason, "image skipped again");
            }
        }
        let skipped: Vec<(PathBuf, String)> = (skipped.into_iter())
            .map(|(path, reason, _)| (path, reason))
            .collect();
        Ok(Scanned {
            train,
            val,
            class_names,
            added: new.len() - deferred - skipped.len(),
            removed,
            deferred,
            skipped,
        })
    }

    /// Whether the image at `path` is in the validation split: a stable draw from its path.
    fn held_out(&self, path: &Path) -> bool {
        let mut hash = Fnv64::default();
        hash.write(&self.seed.to_le_bytes());
        hash.write(path.as_os_str().as_encoded_bytes());
        // The top 24 bits as a fraction in [0, 1).
        ((hash.0 >> 40) as f32 / (1u64 << 24) as f32) < self.val_fraction
    }
}

fn empty(dim: usize) -> FeatureSet {
    FeatureSet {
        dim,
        ..FeatureSet::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(path: &Path, value: u8) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::GrayImage::from_pixel(8, 8, image::Luma([value]))
            .save(path)
            .unwrap();
    }

    fn backbone() -> Arc<Backbone> {
        let card = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/assets/digits-conv.toml");
        Arc::new(Backbone::load(&card).unwrap())
    }

    #[test]
    fn new_images_are_added_gone_ones_dropped_and_old_ones_keep_their_split() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..6 {
            write_png(&dir.path().join(format!("a/{i}.png")), 10 * i);
        }
        let mut scan = SiteScan::new(dir.path(), backbone(), 0.3, 0, 0);
        let first = scan.scan().unwrap();
        assert_eq!((first.added, first.removed), (6, 0));
        assert_eq!(first.train.len() + first.val.len(), 6);
        assert_eq!(first.class_names, ["a"]);
        let again = scan.scan().unwrap();
        assert_eq!((again.added, again.removed), (0, 0));
        assert_eq!(again.train.features, first.train.features);

        write_png(&dir.path().join("b/new.png"), 200);
        std::fs::remove_file(dir.path().join("a/0.png")).unwrap();
        let grown = scan.scan().unwrap();
        assert_eq!((grown.added, grown.removed), (1, 1));
        assert_eq!(grown.class_names, ["a", "b"]);
        assert_eq!(grown.train.len() + grown.val.len(), 6);
        assert!(grown.train.labels.contains(&1) || grown.val.labels.contains(&1));
    }

    #[test]
    fn images_beyond_the_budget_wait() {
        let dir = tempfile::tempdir().unwrap();
        // 512 features of 4 bytes: 2 KiB per image; 1 MiB holds 512 images.
        for i in 0..3 {
            write_png(&dir.path().join(format!("a/{i}.png")), i);
        }
        let mut scan = SiteScan::new(dir.path(), backbone(), 0.1, 0, 1);
        scan.budget_bytes = 2 * 512 * 4;
        let scanned = scan.scan().unwrap();
        assert_eq!((scanned.added, scanned.deferred), (2, 1));
    }

    #[test]
    fn a_half_written_image_is_skipped_and_taken_once_it_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..4 {
            write_png(&dir.path().join(format!("a/{i}.png")), 10 * i);
        }
        let partial = dir.path().join("a/9.png");
        std::fs::write(&partial, b"\x89PNG\r\n\x1a\n half of a file").unwrap();
        let report = Arc::new(LoadReport::default());
        let mut scan =
            SiteScan::new(dir.path(), backbone(), 0.3, 0, 0).with_report(Arc::clone(&report));
        let first = scan.scan().expect("one bad file fails no scan");
        assert_eq!(first.added, 4);
        assert_eq!(first.skipped.len(), 1);
        assert_eq!(first.skipped[0].0, partial);
        assert_eq!(first.train.len() + first.val.len(), 4);
        // Tried again at each scan, counted once, named inside the site folder.
        assert_eq!(scan.scan().unwrap().skipped.len(), 1);
        let counted = report.skipped();
        assert_eq!(counted.count, 1);
        assert_eq!(counted.last.unwrap().file, "a/9.png");
        assert_eq!(report.loading(), None, "nothing loads between scans");
        write_png(&partial, 90);
        let second = scan.scan().unwrap();
        assert_eq!((second.added, second.skipped.len()), (1, 0));
        assert_eq!(second.train.len() + second.val.len(), 5);
    }
}
