//! What loading a device's data shows while it runs and after: progress on standard error (a
//! bar on a terminal), in the log (what journald keeps under systemd: a line once a phase has
//! taken [`FIRST_AFTER`], then every [`LOG_EVERY`] with its ETA, and one at its end; a quick
//! phase says its start and end at debug only, so that the commands whose standard output is
//! their result stay quiet), and, for the agent's status and metrics, what is being loaded now
//! and the image files left out because they do not decode ([`LoadReport`]).
//!
//! The agent reads the process's report ([`LoadReport::process`]): a device's data are loaded
//! by its profile's set-up before the agent starts, which hands it the data only, and one
//! process runs one device. The loaders take another report in tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A phase that has run this long says so in the log, with how far it got.
pub const FIRST_AFTER: Duration = Duration::from_secs(1);

/// Least time between two progress lines in the log.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// What a device loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The site folder's image files, read and decoded.
    Reading,
    /// The backbone over images: at start, or over the new images a rescan found.
    Features,
}

impl Phase {
    /// The name the status carries (`loading`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Reading => "reading",
            Phase::Features => "features",
        }
    }
}

/// What is being loaded now, with counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loading {
    /// What.
    pub phase: Phase,
    /// Images done so far.
    pub done: u64,
    /// Images to do.
    pub total: u64,
}

/// An image file left out because it does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedImage {
    /// The file, relative to its site folder (`<class>/<file>`).
    pub file: String,
    /// Why, without the folder's path.
    pub reason: String,
}

/// The image files left out so far: how many (each file once) and the last one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Files left out.
    pub count: u64,
    /// The last of them.
    pub last: Option<SkippedImage>,
}

/// What is being loaded now and the image files left out; see the module documentation.
#[derive(Debug, Default)]
pub struct LoadReport {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    loading: Option<Loading>,
    counted: BTreeSet<PathBuf>,
    skipped: Skipped,
}

impl LoadReport {
    /// The process's report, which the loaders of a device's site folder feed.
    pub fn process() -> Arc<LoadReport> {
        static PROCESS: OnceLock<Arc<LoadReport>> = OnceLock::new();
        Arc::clone(PROCESS.get_or_init(Default::default))
    }

    /// What is being loaded now, if anything.
    pub fn loading(&self) -> Option<Loading> {
        self.lock().loading
    }

    /// The image files left out so far.
    pub fn skipped(&self) -> Skipped {
        self.lock().skipped.clone()
    }

    /// `file` of the site folder `site` does not decode, for `reason`: counted unless it was
    /// before (a rescan tries it again each time). Returns whether it was counted now.
    pub fn skip(&self, site: &Path, file: &Path, reason: &str) -> bool {
        let mut inner = self.lock();
        if !inner.counted.insert(file.to_owned()) {
            return false;
        }
        let shown = file.strip_prefix(site).unwrap_or(file);
        let shown = (shown.iter())
            .map(|part| part.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        inner.skipped.count += 1;
        inner.skipped.last = Some(SkippedImage {
            file: shown,
            reason: reason.to_owned(),
        });
        true
    }

    fn set_loading(&self, loading: Option<Loading>) {
        self.lock().loading = loading;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One phase of loading under way: the report says it with its counts until it is dropped,
/// and it is shown on standard error (see the module documentation).
pub struct Progress<'a> {
    report: &'a LoadReport,
    phase: Phase,
    what: &'static str,
    done: u64,
    total: u64,
    started: Instant,
    /// When the log last said how far the phase got, if it did.
    logged: Option<Instant>,
    bar: indicatif::ProgressBar,
}

impl<'a> Progress<'a> {
    /// `total` images of `phase` to load, said in the log as `what` (e.g. "reading the site
    /// folder").
    pub fn start(report: &'a LoadReport, phase: Phase, total: u64, what: &'static str) -> Self {
        tracing::debug!(phase = phase.name(), images = total, "{what}");
        let template = "{msg} {bar:30} {pos}/{len} images, {per_sec}, ETA {eta}";
        let bar = indicatif::ProgressBar::new(total).with_style(
            indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(phase.name());
        report.set_loading(Some(Loading {
            phase,
            done: 0,
            total,
        }));
        Self {
            report,
            phase,
            what,
            done: 0,
            total,
            started: Instant::now(),
            logged: None,
            bar,
        }
    }

    /// `n` more images done.
    pub fn advance(&mut self, n: u64) {
        self.done = (self.done + n).min(self.total);
        self.bar.set_position(self.done);
        self.report.set_loading(Some(Loading {
            phase: self.phase,
            done: self.done,
            total: self.total,
        }));
        let due = match self.logged {
            None => self.started.elapsed() >= FIRST_AFTER,
            Some(logged) => logged.elapsed() >= LOG_EVERY,
        };
        if due && self.done < self.total {
            self.logged = Some(Instant::now());
            let per_image = self.started.elapsed().as_secs_f64() / self.done.max(1) as f64;
            let left = Duration::from_secs((per_image * (self.total - self.done) as f64) as u64);
            tracing::info!(
                phase = self.phase.name(),
                done = self.done,
                of = self.total,
                eta = %humantime::format_duration(left),
                "{}",
                self.what
            );
        }
    }

    /// Ends the phase, saying `summary` in the log with the time it took: at info when the log
    /// said how far it got (it took [`FIRST_AFTER`] or more), else at debug.
    pub fn end(self, summary: &str) {
        let (phase, seconds) = (self.phase.name(), self.started.elapsed().as_secs_f64());
        let seconds = (seconds * 10.0).round() / 10.0;
        match self.logged {
            Some(_) => tracing::info!(phase, seconds, "{summary}"),
            None => tracing::debug!(phase, seconds, "{summary}"),
        }
    }
}

impl Drop for Progress<'_> {
    /// The phase is over (done, or failed): the bar goes and the report says nothing loads.
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        self.report.set_loading(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_in_the_report_with_its_counts_until_it_ends() {
        let report = LoadReport::default();
        assert_eq!(report.loading(), None);
        {
            let mut progress = Progress::start(&report, Phase::Features, 3, "computing");
            assert_eq!(
                report.loading(),
                Some(Loading {
                    phase: Phase::Features,
                    done: 0,
                    total: 3
                })
            );
            progress.advance(2);
            assert_eq!(report.loading().map(|l| (l.done, l.total)), Some((2, 3)));
            progress.advance(5);
            assert_eq!(
                report.loading().map(|l| l.done),
                Some(3),
                "never past the total"
            );
        }
        assert_eq!(report.loading(), None, "over when dropped");
    }

    #[test]
    fn each_skipped_file_counts_once_named_inside_its_site_folder() {
        let report = LoadReport::default();
        let site = Path::new("sites").join("a");
        let file = site.join("cat").join("3.png");
        assert!(report.skip(&site, &file, "truncated"));
        assert!(
            !report.skip(&site, &file, "truncated"),
            "tried again: not counted again"
        );
        assert!(report.skip(&site, &site.join("dog/0.jpg"), "not an image"));
        let skipped = report.skipped();
        assert_eq!(skipped.count, 2);
        assert_eq!(
            skipped.last,
            Some(SkippedImage {
                file: "dog/0.jpg".into(),
                reason: "not an image".into()
            })
        );
    }
}
