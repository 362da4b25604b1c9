//! What the driver adds to the machine's status before publishing it: the time, the labelling
//! queue's counts, what the device is loading and the image files it left out (the process's
//! `crate::data::LoadReport`, also brought into the metrics here), and, with a key, the tag.
//! These are facts of the process, which the machine does not know; it decides nothing on them.
//!
//! While a rescan computes the features of new images the driver publishes the status again
//! ([`LoadingWatch`]), so that the fleet sees the device loading rather than nothing.

use std::time::{Duration, Instant};

use fedge_wire::{EdgeStatus, LabellingStatus};

use super::setup::AgentSetup;
use crate::data::LoadReport;
use crate::data::progress::Loading;

/// How often the driver looks at the report while a rescan may load.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Least time between two statuses that say how far the loading got.
pub const LOADING_EVERY: Duration = Duration::from_secs(5);

/// The status document, stamped with the current time and, with a key, signed.
pub fn json(status: &EdgeStatus, setup: &AgentSetup, report: &LoadReport) -> String {
    // Counts of a device that is online: the Last Will, made at connection, would carry
    // stale ones.
    let labelling = (setup.serving.labelling.as_ref().filter(|_| status.online)).map(|l| {
        let counts = l.queue.counts();
        LabellingStatus {
            waiting: counts.left as u64,
            labelled: counts.labelled,
        }
    });
    // Only a rescan loads while an agent runs (another agent's start may, in a process that
    // runs several: `fedge demo`).
    let loads = setup.scan.is_some();
    let mut stamped = EdgeStatus {
        updated_at: fedge_mqtt::now_rfc3339(),
        ..with_facts(status, labelling, report, loads)
    };
    setup.serving.metrics.images_skipped(stamped.skipped_images);
    // The drift watch as it stands now, from the first status after a release is installed
    // (not only after an alarm), so that the status says what `GET /v1/drift` and the metrics
    // say.
    if status.online
        && let Some(drift) = setup.serving.drift.snapshot()
    {
        stamped.drift = Some(drift);
    }
    if status.online {
        stamped.head_check = setup.serving.head.snapshot();
    }
    if let Some(key) = &setup.key {
        stamped.sign(&setup.federation, key);
    }
    serde_json::to_string(&stamped).unwrap_or_default()
}

/// `status` with the labelling counts and, while online, what the report says: the files left
/// out, and what loads now when the agent `loads` (it rescans its site folder).
pub fn with_facts(
    status: &EdgeStatus,
    labelling: Option<LabellingStatus>,
    report: &LoadReport,
    loads: bool,
) -> EdgeStatus {
    let mut out = EdgeStatus {
        labelling,
        ..status.clone()
    };
    if !status.online {
        return out;
    }
    if let Some(loading) = report.loading().filter(|_| loads) {
        out.loading = Some(loading.phase.name().to_owned());
        (out.loading_done, out.loading_total) = (loading.done, loading.total);
    }
    let skipped = report.skipped();
    out.skipped_images = skipped.count;
    if let Some(last) = skipped.last {
        out.last_skipped_image = Some(last.file);
        out.last_skipped_reason = Some(last.reason);
    }
    out
}

/// When a loading under way is worth a status: once it has lasted [`LOOK_EVERY`] (a rescan of
/// a few images says nothing), every [`LOADING_EVERY`] while it goes on, and once when it
/// ends.
#[derive(Debug, Default)]
pub struct LoadingWatch {
    /// When the loading now under way was first seen.
    seen: Option<Instant>,
    /// When a status last said it.
    said: Option<Instant>,
}

impl LoadingWatch {
    /// Whether to publish the status again, `loading` being what loads at `now`.
    pub fn due(&mut self, loading: Option<Loading>, now: Instant) -> bool {
        let Some(_) = loading else {
            self.seen = None;
            // Once more, without it, if a status said it.
            return self.said.take().is_some();
        };
        let seen = *self.seen.get_or_insert(now);
        let due = match self.said {
            None => now.duration_since(seen) >= LOOK_EVERY,
            Some(said) => now.duration_since(said) >= LOADING_EVERY,
        };
        if due {
            self.said = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::progress::{Phase, Progress};

    #[test]
    fn an_online_status_says_what_loads_and_the_files_left_out() {
        let report = LoadReport::default();
        let site = std::path::Path::new("site");
        report.skip(site, &site.join("cat/3.png"), "truncated");
        let online = EdgeStatus {
            online: true,
            ..EdgeStatus::default()
        };
        let plain = with_facts(&online, None, &report, true);
        assert_eq!(plain.loading, None);
        assert_eq!(plain.skipped_images, 1);
        assert_eq!(plain.last_skipped_image.as_deref(), Some("cat/3.png"));
        assert_eq!(plain.last_skipped_reason.as_deref(), Some("truncated"));
        let mut progress = Progress::start(&report, Phase::Features, 400, "computing");
        progress.advance(120);
        let loading = with_facts(&online, None, &report, true);
        assert_eq!(loading.loading.as_deref(), Some("features"));
        assert_eq!((loading.loading_done, loading.loading_total), (120, 400));
        let steady = with_facts(&online, None, &report, false);
        assert_eq!(
            steady.loading, None,
            "an agent that does not rescan loads nothing"
        );
        let json = serde_json::to_string(&loading).unwrap();
        assert!(
            json.contains(r#""loading":"features","loading_done":120,"loading_total":400"#),
            "{json}"
        );
        // The Last Will, made at connection, carries none of it.
        let will = with_facts(&EdgeStatus::default(), None, &report, true);
        assert_eq!((will.loading, will.skipped_images), (None, 0));
        drop(progress);
        assert_eq!(with_facts(&online, None, &report, true).loading, None);
    }

    #[test]
    fn a_long_loading_is_said_then_every_few_seconds_and_its_end_once() {
        let loading = Some(Loading {
            phase: Phase::Features,
            done: 1,
            total: 9,
        });
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut watch = LoadingWatch::default();
        assert!(!watch.due(None, at(0)), "nothing loads, nothing to say");
        assert!(!watch.due(loading, at(0)), "a short rescan says nothing");
        assert!(watch.due(loading, at(1)));
        assert!(!watch.due(loading, at(2)));
        assert!(watch.due(loading, at(6)));
        assert!(watch.due(None, at(7)), "its end, once");
        assert!(!watch.due(None, at(8)));
        // A short one after it: nothing again.
        assert!(!watch.due(loading, at(9)));
        assert!(!watch.due(None, at(9)));
    }
}
