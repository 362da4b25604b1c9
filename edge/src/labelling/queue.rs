//! The site's labelling queue on disk: the inputs `fedge_device::labelling::Selector` keeps,
//! each as its image file and what the model said of it; a label moves the image into the
//! site folder under the class's name, where `[data] rescan` finds it before the next round.
//!
//! The folder (`[labelling] dir`, by default `<cache_dir>/labelling/<client_id>`):
//!
//! - `pending/<id>.<png|jpg>` and `pending/<id>.json` (an [`Item`]): an input waiting;
//! - `state.json` ([`State`]): the next id, the inputs the sample was offered, and the labels
//!   given, newest last (the last [`UNDO_DEPTH`] can be undone).
//!
//! Every file is written with `fedge_daemon::write_atomically`. Nothing here leaves the
//! device: the page and the JSON API read it on the device's own port.
//!
//! The folder is the agent's alone ([`ensure_private_dir`]): one it creates is mode 0700; one
//! that is a symbolic link, belongs to another user or is writable by group or others is
//! refused (another user who made it first would control `state.json`, and through it what
//! `undo` reads and deletes); one only readable by others is made private. Inside it, and in
//! the site folder, the queue reads, moves and deletes only regular files, never through a
//! symbolic link ([`read_regular`]), and only the paths it makes itself: an input's file from
//! its id and `png` or `jpg`, a label's from a class name that is a plain folder name
//! ([`check_class_name`]) and the input's id, whatever `state.json` says.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fedge_daemon::Visibility;
use fedge_device::labelling::{Held, Pick, Selector, uncertainty};
use serde::{Deserialize, Serialize};

use crate::inference::Prediction;

/// How many labels can be undone, newest first.
pub const UNDO_DEPTH: usize = 50;

/// What the model said of one input, kept beside its image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// The input's number in the queue (hex in URLs and file names).
    pub id: u64,
    /// Why it is asked: among the most uncertain, or drawn at random.
    pub pick: Pick,
    /// `1 − (p₁ − p₂)` of the prediction.
    pub uncertainty: f32,
    /// The model's best guesses, most likely first.
    pub guesses: Vec<Guess>,
    /// The round of the release that answered.
    pub model_round: u64,
    /// When the input was served (RFC 3339, UTC).
    pub received: String,
    /// The image's file extension, `png` or `jpg`.
    pub ext: String,
}

/// One of the model's guesses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Guess {
    pub class: String,
    pub probability: f32,
}

/// One label given through the queue, kept so that it can be undone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Given {
    pub item: Item,
    pub class: String,
    /// The image's place in the site folder, relative to it.
    pub file: PathBuf,
}

/// The queue's own bookkeeping.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub next_id: u64,
    pub offered: u64,
    /// Labels given, newest last, at most [`UNDO_DEPTH`].
    pub given: Vec<Given>,
    /// Labels given in all (undone ones taken off).
    pub labelled: u64,
}

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("no input {0:x} in the queue (labelled, skipped or replaced meanwhile)")]
    Unknown(u64),
    #[error("class {class:?} is not one of the federation's: {}", classes.join(", "))]
    Class { class: String, classes: Vec<String> },
    #[error(
        "class {0:?} cannot be a folder of the site folder (empty, `.` or `..`, or holding `/`, \
         `\\` or NUL): rename it in the federation's class list"
    )]
    ClassName(String),
    #[error("nothing to undo")]
    NothingToUndo,
    #[error("{}: {problem}", path.display())]
    Unsafe { path: PathBuf, problem: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The queue's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSettings {
    /// The queue's folder.
    pub dir: PathBuf,
    /// The site folder labelled images go to (`<site>/<class>/`).
    pub site: PathBuf,
    /// Places in the queue.
    pub capacity: usize,
    /// Share of the places for the uniform sample.
    pub random_share: f32,
    /// The queue's images in all, at most this many bytes: an image above
    /// `max_bytes / capacity` is not kept.
    pub max_bytes: u64,
}

struct Inner {
    selector: Selector,
    state: State,
    draw: rand::rngs::StdRng,
    /// Inputs not kept because their file was over its share of the budget.
    too_large: u64,
}

/// The labelling queue of one device.
pub struct LabelQueue {
    settings: QueueSettings,
    inner: Mutex<Inner>,
    /// Told the counts at every change, when given.
    metrics: Option<std::sync::Arc<crate::metrics::EdgeMetrics>>,
}

impl std::fmt::Debug for LabelQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelQueue")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The counts the page and the metrics show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Inputs waiting for a label.
    pub left: usize,
    /// Labels given (undone ones taken off).
    pub labelled: u64,
    /// Inputs not kept because their file was too large for the budget.
    pub too_large: u64,
}

impl LabelQueue {
    /// Opens (or creates) the queue in `settings.dir`, restoring what it held; refuses a
    /// folder that is not the agent's alone ([`ensure_private_dir`]).
    pub fn open(settings: QueueSettings) -> Result<Self, QueueError> {
        ensure_private_dir(&settings.dir)?;
        let pending = settings.dir.join("pending");
        ensure_private_dir(&pending)?;
        let state = read_state(&settings.dir.join("state.json"))?;
        let mut items = Vec::new();
        for entry in std::fs::read_dir(&pending).map_err(io(&pending))?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Ok(bytes) = fedge_daemon::private_dir::read_regular(&path)
                && let Ok(item) = serde_json::from_slice::<Item>(&bytes)
                && valid_ext(&item.ext)
                && path.file_stem() == Some(std::ffi::OsStr::new(&format!("{:016x}", item.id)))
            {
                items.push(item);
            }
        }
        let held: Vec<Held> = (items.iter())
            .map(|i| Held {
                id: i.id,
                uncertainty: i.uncertainty,
                pick: i.pick,
            })
            .collect();
        let selector = Selector::new(settings.capacity, settings.random_share)
            .restore(held.iter().copied(), state.offered);
        let kept: std::collections::HashSet<u64> = selector.held().iter().map(|h| h.id).collect();
        let queue = Self {
            inner: Mutex::new(Inner {
                selector,
                state,
                draw: rand::SeedableRng::from_os_rng(),
                too_large: 0,
            }),
            settings,
            metrics: None,
        };
        // Entries a smaller queue no longer has places for.
        for item in items.iter().filter(|i| !kept.contains(&i.id)) {
            queue.delete_pending(item);
        }
        Ok(queue)
    }

    /// The same queue reporting its counts to `metrics` at every change.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::EdgeMetrics>) -> Self {
        let inner = self.lock();
        metrics.labelling(inner.selector.len() as u64, inner.state.labelled);
        drop(inner);
        self.metrics = Some(metrics);
        self
    }

    /// The settings it was opened with.
    pub fn settings(&self) -> &QueueSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending_path(&self, id: u64, ext: &str) -> PathBuf {
        self.settings
            .dir
            .join("pending")
            .join(format!("{id:016x}.{ext}"))
    }

    fn delete_pending(&self, item: &Item) {
        let _ = std::fs::remove_file(self.pending_path(item.id, &item.ext));
        let _ = std::fs::remove_file(self.pending_path(item.id, "json"));
    }

    fn save_state(&self, inner: &mut Inner) -> Result<(), QueueError> {
        inner.state.offered = inner.selector.offered();
        if let Some(metrics) = &self.metrics {
            metrics.labelling(inner.selector.len() as u64, inner.state.labelled);
        }
        let path = self.settings.dir.join("state.json");
        let bytes = serde_json::to_vec_pretty(&inner.state).unwrap_or_default();
        fedge_daemon::write_atomically(&path, &bytes, Visibility::Private).map_err(io(&path))
    }

    /// Input `id`'s note; unknown unless it is a regular file naming that id and a `png` or
    /// `jpg` image.
    fn read_item(&self, id: u64) -> Result<Item, QueueError> {
        let path = self.pending_path(id, "json");
        let bytes =
            fedge_daemon::private_dir::read_regular(&path).map_err(|_| QueueError::Unknown(id))?;
        let item: Item = serde_json::from_slice(&bytes).map_err(|_| QueueError::Unknown(id))?;
        match item.id == id && valid_ext(&item.ext) {
            true => Ok(item),
            false => Err(QueueError::Unknown(id)),
        }
    }

    fn write_item(&self, item: &Item, image: &[u8]) -> Result<(), QueueError> {
        let path = self.pending_path(item.id, &item.ext);
        fedge_daemon::write_atomically(&path, image, Visibility::Private).map_err(io(&path))?;
        self.write_note(item)
    }

    /// What the model said of `item`, beside its image.
    fn write_note(&self, item: &Item) -> Result<(), QueueError> {
        let meta = self.pending_path(item.id, "json");
        let bytes = serde_json::to_vec_pretty(item).unwrap_or_default();
        fedge_daemon::write_atomically(&meta, &bytes, Visibility::Private).map_err(io(&meta))
    }

    /// Offers an input the device served: `image` the file's bytes, `prediction` what the
    /// model answered, `classes` the release's class list (its logits' order). Kept when the
    /// selector takes it; whatever it puts out is deleted. Returns whether the input was kept.
    pub fn offer(
        &self,
        image: &[u8],
        prediction: &Prediction,
        classes: &[String],
    ) -> Result<bool, QueueError> {
        let probabilities = crate::inference::scores::softmax(&prediction.logits);
        let u = uncertainty(&probabilities);
        let mut inner = self.lock();
        if image.len() as u64 > self.settings.max_bytes / self.settings.capacity.max(1) as u64 {
            inner.too_large += 1;
            return Ok(false);
        }
        let id = inner.state.next_id;
        let draw = rand::Rng::random::<f64>(&mut inner.draw);
        let offered = inner.selector.offer(id, u, draw);
        let Some(pick) = offered.kept else {
            if inner.selector.offered().is_multiple_of(64) {
                self.save_state(&mut inner)?;
            }
            return Ok(false);
        };
        inner.state.next_id += 1;
        for gone in offered.evicted {
            if let Ok(item) = self.read_item(gone) {
                self.delete_pending(&item);
            }
        }
        for moved in offered.moved {
            if let Ok(item) = self.read_item(moved) {
                self.write_note(&Item {
                    pick: Pick::Uncertain,
                    ..item
                })?;
            }
        }
        let mut order: Vec<usize> = (0..probabilities.len()).collect();
        order.sort_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
        let item = Item {
            id,
            pick,
            uncertainty: u,
            guesses: (order.iter().take(3))
                .filter_map(|&k| {
                    Some(Guess {
                        class: classes.get(k)?.clone(),
                        probability: probabilities[k],
                    })
                })
                .collect(),
            model_round: prediction.model_round,
            received: fedge_mqtt::now_rfc3339(),
            ext: image_ext(image).to_owned(),
        };
        let written = self.write_item(&item, image);
        if written.is_err() {
            inner.selector.remove(id);
            self.delete_pending(&item);
        }
        self.save_state(&mut inner)?;
        written.map(|()| true)
    }

    /// The inputs waiting, most uncertain first.
    pub fn pending(&self) -> Vec<Item> {
        let inner = self.lock();
        (inner.selector.held().iter())
            .filter_map(|h| self.read_item(h.id).ok())
            .collect()
    }

    /// The image of input `id`, and its content type.
    pub fn image(&self, id: u64) -> Result<(Vec<u8>, &'static str), QueueError> {
        let item = self.read_item(id)?;
        let bytes = fedge_daemon::private_dir::read_regular(&self.pending_path(id, &item.ext))
            .map_err(|_| QueueError::Unknown(id))?;
        let kind = if item.ext == "png" {
            "image/png"
        } else {
            "image/jpeg"
        };
        Ok((bytes, kind))
    }

    /// Labels input `id` as `class`, one of `classes` (the federation's): its image goes to
    /// `<site>/<class>/label-<id>.<ext>` and leaves the queue. Returns that path.
    pub fn label(&self, id: u64, class: &str, classes: &[String]) -> Result<PathBuf, QueueError> {
        if !classes.iter().any(|c| c == class) {
            return Err(QueueError::Class {
                class: class.to_owned(),
                classes: classes.to_vec(),
            });
        }
        let mut inner = self.lock();
        let item = self.read_item(id)?;
        let file = label_file(class, &item)?;
        let image = self.pending_path(id, &item.ext);
        let bytes =
            fedge_daemon::private_dir::read_regular(&image).map_err(|_| QueueError::Unknown(id))?;
        let dest = self.settings.site.join(&file);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // The site folder's images are the device's data: owner only, as its feature cache.
        fedge_daemon::write_atomically(&dest, &bytes, Visibility::Private).map_err(io(&dest))?;
        inner.selector.remove(id);
        self.delete_pending(&item);
        inner.state.given.push(Given {
            item,
            class: class.to_owned(),
            file,
        });
        let over = inner.state.given.len().saturating_sub(UNDO_DEPTH);
        inner.state.given.drain(..over);
        inner.state.labelled += 1;
        self.save_state(&mut inner)?;
        Ok(dest)
    }

    /// Takes input `id` out without a label (nothing a class fits, or not worth one).
    pub fn skip(&self, id: u64) -> Result<(), QueueError> {
        let mut inner = self.lock();
        let item = self.read_item(id)?;
        inner.selector.remove(id);
        self.delete_pending(&item);
        self.save_state(&mut inner)
    }

    /// Undoes the newest label: its image leaves the site folder and waits in the queue again
    /// (over the places the queue has, if it filled meanwhile: the person asked for it back).
    pub fn undo(&self) -> Result<Given, QueueError> {
        let mut inner = self.lock();
        let given = inner.state.given.pop().ok_or(QueueError::NothingToUndo)?;
        // Only the file a label makes, whatever state.json says.
        let file =
            label_file(&given.class, &given.item).and_then(|file| match file == given.file {
                true => Ok(file),
                false => Err(QueueError::Unknown(given.item.id)),
            });
        let file = match file {
            Ok(file) => file,
            Err(e) => {
                inner.state.given.push(given);
                return Err(e);
            }
        };
        let placed = self.settings.site.join(&file);
        let restored = fedge_daemon::private_dir::read_regular(&placed).and_then(|bytes| {
            self.write_item(&given.item, &bytes)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            std::fs::remove_file(&placed)
        });
        if let Err(source) = restored {
            inner.state.given.push(given);
            return Err(QueueError::Io {
                path: placed,
                source,
            });
        }
        inner.selector.put_back(Held {
            id: given.item.id,
            uncertainty: given.item.uncertainty,
            pick: given.item.pick,
        });
        inner.state.labelled = inner.state.labelled.saturating_sub(1);
        self.save_state(&mut inner)?;
        Ok(given)
    }

    /// What the page and the metrics show.
    pub fn counts(&self) -> Counts {
        let inner = self.lock();
        Counts {
            left: inner.selector.len(),
            labelled: inner.state.labelled,
            too_large: inner.too_large,
        }
    }
}

impl crate::inference::Served for LabelQueue {
    /// A failure to keep the input is logged; the prediction was answered all the same.
    fn served(&self, image: &[u8], prediction: &Prediction, classes: &[String]) {
        if let Err(e) = self.offer(image, prediction, classes) {
            tracing::warn!(error = %e, "labelling queue: the input was not kept");
        }
    }
}

/// Refuses a class name that is not a plain folder name in the site folder: empty, `.`, `..`,
/// or holding a path separator (`/`, `\`) or NUL.
pub fn check_class_name(class: &str) -> Result<(), QueueError> {
    let plain = !matches!(class, "" | "." | "..") && !class.contains(['/', '\\', '\0']);
    match plain {
        true => Ok(()),
        false => Err(QueueError::ClassName(class.to_owned())),
    }
}

/// Where a label of `item` as `class` goes, relative to the site folder.
fn label_file(class: &str, item: &Item) -> Result<PathBuf, QueueError> {
    check_class_name(class)?;
    if !valid_ext(&item.ext) {
        return Err(QueueError::Unknown(item.id));
    }
    Ok(Path::new(class).join(format!("label-{:016x}.{}", item.id, item.ext)))
}

/// Whether `ext` is an extension the queue writes.
fn valid_ext(ext: &str) -> bool {
    matches!(ext, "png" | "jpg")
}

/// The queue's bookkeeping in `path`: a fresh one when there is none (or it is unreadable
/// JSON); refused when `path` is a symbolic link or not a file.
fn read_state(path: &Path) -> Result<State, QueueError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(io(path)(e)),
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(QueueError::Unsafe {
                path: path.to_owned(),
                problem: "the queue's state is not a regular file (a symbolic link?): remove \
                          it, and the queue starts afresh"
                    .to_owned(),
            });
        }
        Ok(_) => {}
    }
    let bytes = fedge_daemon::private_dir::read_regular(path).map_err(io(path))?;
    let mut state: State = serde_json::from_slice(&bytes).unwrap_or_default();
    let before = state.given.len();
    state
        .given
        .retain(|g| label_file(&g.class, &g.item).is_ok_and(|f| f == g.file));
    if state.given.len() < before {
        tracing::warn!(path = %path.display(), "labelling queue: labels that name another file than their own were dropped from the undo list");
    }
    Ok(state)
}

/// Makes `dir` the queue's own folder (`fedge_daemon::private_dir::ensure_private_dir`), or
/// says why it cannot be.
pub fn ensure_private_dir(dir: &Path) -> Result<(), QueueError> {
    fedge_daemon::private_dir::ensure_private_dir(dir, "[labelling] dir").map_err(|problem| {
        QueueError::Unsafe {
            path: dir.to_owned(),
            problem: format!("the labelling queue's folder {problem}"),
        }
    })
}

/// `png` for a PNG file, `jpg` otherwise (the endpoint takes nothing else).
fn image_ext(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(b"\x89PNG") {
        "png"
    } else {
        "jpg"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSES: [&str; 3] = ["bolt", "nut", "washer"];

    fn classes() -> Vec<String> {
        CLASSES.iter().map(|c| c.to_string()).collect()
    }

    fn prediction(logits: [f32; 3]) -> Prediction {
        Prediction {
            class: String::new(),
            index: 0,
            probability: 0.0,
            top_k: Vec::new(),
            logits: logits.to_vec(),
            model_round: 4,
            model_sha256: String::new(),
            distance: None,
            unfamiliar: None,
            variant: fedge_wire::SiteVariant::Release,
        }
    }

    fn png(shade: u8) -> Vec<u8> {
        let mut bytes = Vec::new();
        image::GrayImage::from_pixel(4, 4, image::Luma([shade]))
            .write_to(
                &mut std::io::Cursor::new(&mut bytes),
                image::ImageFormat::Png,
            )
            .unwrap();
        bytes
    }

    fn open(root: &Path, capacity: usize) -> LabelQueue {
        LabelQueue::open(QueueSettings {
            dir: root.join("queue"),
            site: root.join("site"),
            capacity,
            random_share: 0.0,
            max_bytes: 1 << 20,
        })
        .unwrap()
    }

    /// The most uncertain inputs wait, most uncertain first, with the model's guesses; a label
    /// moves the image into the site folder under the class; undo brings it back; a restart
    /// finds the same queue.
    #[test]
    fn label_undo_skip_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let queue = open(dir.path(), 2);
        // Sure, unsure, very unsure: the sure one is put out when the third arrives.
        assert!(
            queue
                .offer(&png(10), &prediction([9.0, 0.0, 0.0]), &classes())
                .unwrap()
        );
        assert!(
            queue
                .offer(&png(20), &prediction([1.0, 0.8, 0.0]), &classes())
                .unwrap()
        );
        assert!(
            queue
                .offer(&png(30), &prediction([0.0, 1.0, 1.0]), &classes())
                .unwrap()
        );
        assert!(
            !queue
                .offer(&png(40), &prediction([9.0, 0.0, 0.0]), &classes())
                .unwrap()
        );
        let pending = queue.pending();
        assert_eq!(pending.iter().map(|i| i.id).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(pending[0].guesses[0].class, "nut");
        assert_eq!(pending[0].guesses.len(), 3);
        assert_eq!(pending[1].guesses[0].class, "bolt");
        assert_eq!(queue.image(2).unwrap(), (png(30), "image/png"));
        assert!(matches!(queue.image(0), Err(QueueError::Unknown(0))));
        assert_eq!(
            std::fs::read_dir(dir.path().join("queue/pending"))
                .unwrap()
                .count(),
            4,
            "the image and its note of each input waiting, nothing of the one put out"
        );

        let err = queue.label(2, "screw", &classes()).unwrap_err();
        assert!(err.to_string().contains("bolt, nut, washer"), "{err}");
        let file = queue.label(2, "washer", &classes()).unwrap();
        assert_eq!(
            file,
            dir.path().join("site/washer/label-0000000000000002.png")
        );
        assert_eq!(std::fs::read(&file).unwrap(), png(30));
        assert!(matches!(
            queue.label(2, "nut", &classes()),
            Err(QueueError::Unknown(2))
        ));
        let counts = queue.counts();
        assert_eq!((counts.left, counts.labelled), (1, 1));

        let undone = queue.undo().unwrap();
        assert_eq!((undone.item.id, undone.class.as_str()), (2, "washer"));
        assert!(!file.exists());
        assert_eq!(queue.counts().left, 2);
        assert!(matches!(queue.undo(), Err(QueueError::NothingToUndo)));

        queue.skip(1).unwrap();
        drop(queue);
        let again = open(dir.path(), 2);
        assert_eq!(
            again.pending().iter().map(|i| i.id).collect::<Vec<_>>(),
            [2]
        );
        // Ids go on from where they were (an input not kept used none).
        assert!(
            again
                .offer(&png(50), &prediction([1.0, 1.0, 0.0]), &classes())
                .unwrap()
        );
        assert_eq!(again.pending().iter().map(|i| i.id).max(), Some(3));
    }

    /// An image over its share of the byte budget is not kept, and counted.
    #[test]
    fn an_image_over_its_share_of_the_budget_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let queue = LabelQueue::open(QueueSettings {
            dir: dir.path().join("queue"),
            site: dir.path().join("site"),
            capacity: 4,
            random_share: 0.5,
            max_bytes: 4 * 60,
        })
        .unwrap();
        let big = vec![0x89u8; 61];
        assert!(
            !queue
                .offer(&big, &prediction([0.0, 0.0, 0.0]), &classes())
                .unwrap()
        );
        assert_eq!(queue.counts().too_large, 1);
        assert_eq!(queue.counts().left, 0);
    }

    /// An input the model was unsure of, kept.
    fn offer_unsure(queue: &LabelQueue, shade: u8) {
        let kept = queue.offer(&png(shade), &prediction([1.0, 0.9, 0.0]), &classes());
        assert!(kept.unwrap());
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// A queue folder another user may have made first or may write in is refused, naming
    /// the fix, as is a symbolic link in its place or in `pending`'s; a folder the queue makes
    /// is private, and one others may only read is made private.
    #[cfg(unix)]
    #[test]
    fn a_queue_folder_others_control_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let at = |name: &str| {
            LabelQueue::open(QueueSettings {
                dir: root.join(name),
                site: root.join("site"),
                capacity: 2,
                random_share: 0.0,
                max_bytes: 1 << 20,
            })
        };
        let made = |name: &str, mode: u32| {
            std::fs::create_dir(root.join(name)).unwrap();
            std::fs::set_permissions(root.join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        };
        at("fresh/deeper").unwrap();
        assert_eq!(mode(&root.join("fresh/deeper")), 0o700);
        assert_eq!(mode(&root.join("fresh/deeper/pending")), 0o700);

        for open in [0o777, 0o770, 0o702] {
            let name = format!("open-{open:o}");
            made(&name, open);
            let err = at(&name).unwrap_err().to_string();
            assert!(
                err.contains(&format!("mode {open:04o}")) && err.contains("chmod 700"),
                "{err}"
            );
            assert!(
                !root.join(&name).join("pending").exists(),
                "nothing made in it"
            );
        }

        made("readable", 0o755);
        at("readable").unwrap();
        assert_eq!(mode(&root.join("readable")), 0o700);

        std::os::unix::fs::symlink(root.join("fresh/deeper"), root.join("link")).unwrap();
        let err = at("link").unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");

        made("inner", 0o700);
        std::os::unix::fs::symlink(
            root.join("fresh/deeper/pending"),
            root.join("inner/pending"),
        )
        .unwrap();
        let err = at("inner").unwrap_err().to_string();
        assert!(
            err.contains("pending") && err.contains("symbolic link"),
            "{err}"
        );

        // Another user's folder, private to them (only root can give one away).
        if fedge_daemon::private_dir::current_uid() == Some(0) {
            made("theirs", 0o700);
            std::os::unix::fs::chown(root.join("theirs"), Some(4242), Some(4242)).unwrap();
            let err = at("theirs").unwrap_err().to_string();
            assert!(
                err.contains("belongs to user 4242") && err.contains("chown"),
                "{err}"
            );
        }
    }

    /// Symbolic links planted in the queue, or over a labelled file in the site folder, are
    /// not followed, and paths in `state.json` or a note are not trusted: what they point at
    /// is neither served, nor copied into the site folder, nor moved or deleted.
    #[cfg(unix)]
    #[test]
    fn planted_links_and_paths_are_not_followed() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.png");
        std::fs::write(&secret, b"\x89PNG the agent's secret").unwrap();
        let queue = open(dir.path(), 4);
        for shade in [10, 20, 30] {
            offer_unsure(&queue, shade);
        }
        let pending = dir.path().join("queue/pending");

        // Input 0's image replaced by a link to the secret.
        let image = pending.join("0000000000000000.png");
        std::fs::remove_file(&image).unwrap();
        symlink(&secret, &image).unwrap();
        assert!(matches!(queue.image(0), Err(QueueError::Unknown(0))));
        assert!(queue.label(0, "bolt", &classes()).is_err());
        assert!(!dir.path().join("site/bolt").exists());

        // Input 1's note names a file elsewhere as its image.
        let note = pending.join("0000000000000001.json");
        let mut item: Item = serde_json::from_slice(&std::fs::read(&note).unwrap()).unwrap();
        item.ext = "png/../../../secret.png".into();
        std::fs::write(&note, serde_json::to_vec(&item).unwrap()).unwrap();
        assert!(matches!(queue.image(1), Err(QueueError::Unknown(1))));

        // Input 2 labelled, then its file in the site folder replaced by a link.
        let file = queue.label(2, "nut", &classes()).unwrap();
        std::fs::remove_file(&file).unwrap();
        symlink(&secret, &file).unwrap();
        assert!(queue.undo().is_err());
        assert!(
            queue.image(2).is_err(),
            "the secret is not back in the queue"
        );
        assert_eq!(
            std::fs::read(&secret).unwrap(),
            b"\x89PNG the agent's secret"
        );
        drop(queue);

        // state.json naming another file for the newest label: not undone, the file stays.
        let state_path = dir.path().join("queue/state.json");
        let mut state: State =
            serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
        state.given.last_mut().unwrap().file = PathBuf::from("../secret.png");
        std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
        let again = open(dir.path(), 4);
        assert!(matches!(again.undo(), Err(QueueError::NothingToUndo)));
        assert!(secret.exists());
        drop(again);

        // state.json itself a link: refused.
        std::fs::remove_file(&state_path).unwrap();
        symlink(&secret, &state_path).unwrap();
        let err = LabelQueue::open(QueueSettings {
            dir: dir.path().join("queue"),
            site: dir.path().join("site"),
            capacity: 4,
            random_share: 0.0,
            max_bytes: 1 << 20,
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("state.json") && err.contains("symbolic link"),
            "{err}"
        );
    }

    /// A class name that would not be a plain folder of the site folder (`.`, `..`, empty, a
    /// separator, NUL) is refused even when the federation's list holds it: nothing is written
    /// outside the site folder, and the input still waits.
    #[test]
    fn class_names_that_are_not_plain_folder_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let queue = open(dir.path(), 2);
        offer_unsure(&queue, 10);
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "nu\0t"] {
            let classes = vec![bad.to_owned(), "nut".to_owned()];
            let err = queue.label(0, bad, &classes).unwrap_err();
            assert!(matches!(err, QueueError::ClassName(_)), "{bad:?}: {err}");
            assert!(err.to_string().contains("rename it"), "{err}");
        }
        let outside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(outside.len(), 1, "only the queue: {outside:?}");
        assert_eq!(queue.counts().left, 1);
        let file = queue.label(0, "nut", &classes()).unwrap();
        assert!(file.starts_with(dir.path().join("site/nut")));
    }
}
