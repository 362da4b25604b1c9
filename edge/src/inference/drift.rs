//! The serving device's drift alarm: every prediction's familiarity distance goes through the
//! detector of `fedge_device::drift`, whichever way it was asked (HTTP, MQTT, `predict`).
//!
//! Each installed release starts the watch again ([`DriftWatch::restart`]): its reference is
//! the distances of the device's own rows under the release's pooled summary, or, on a site
//! without data of its own, the first [`REFERENCE_REQUESTS`] requests it serves. An alarm is
//! logged, counted in the metrics (`fedge_edge_drift_alarms_total`, with the level in
//! `fedge_edge_drift_level`) and wakes the agent's loop ([`DriftWatch::woken`]), which puts
//! it in the device's retained status, the event dashboards show.
//!
//! After an alarm the watch keeps the features of the next [`RECENT_REQUESTS`] requests (the
//! site as it is now) and wakes the loop again once it has them ([`DriftWatch::take_window`]):
//! the agent re-estimates the site's statistics from them where the release standardises with
//! the site's own (the agent's `readapt`). The reference stays what it was: a camera that stays
//! broken stays drifted (level 1 in the status, the metrics and `GET /v1/drift` alike) until it
//! is mended or the site says the change is its new normal (`POST /v1/drift/readapt`,
//! [`DriftWatch::start_window`]), whose window then becomes the reference
//! ([`DriftWatch::adapted`]).

use std::sync::{Arc, Mutex};

use fedge_device::drift::{DriftDetector, DriftPair, MIN_REFERENCE};
use fedge_wire::DriftStatus;

use crate::metrics::EdgeMetrics;

/// Requests taken as the reference where the device has no rows of its own.
pub const REFERENCE_REQUESTS: usize = 500;
/// The requests after an alarm whose features re-estimate the site's statistics.
pub const RECENT_REQUESTS: usize = 256;

/// The drift alarm shared by every way predictions are asked.
#[derive(Debug)]
pub struct DriftWatch {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    metrics: Option<Arc<EdgeMetrics>>,
}

#[derive(Debug, Default)]
struct State {
    detector: Option<DriftPair>,
    /// The first requests' distances, while they are the reference to be.
    collecting: Option<Vec<f32>>,
    /// The served head's confidence on the requests since it was installed, while they are
    /// the confidence's reference to be.
    confidences: Option<Vec<f32>>,
    /// After an alarm: the features of the requests since, while they are gathered.
    window: Option<Vec<f32>>,
    /// A full window, waiting for the agent to take it.
    ready: Option<Vec<f32>>,
    /// The window was the site's command: it becomes the new reference.
    rereference: bool,
    alarms: u64,
    last_alarm: Option<String>,
    adaptations: u64,
    last_adapted: Option<String>,
    requests: u64,
    /// Whether a release with a pooled summary is being watched.
    watching: bool,
}

impl Default for DriftWatch {
    fn default() -> Self {
        Self::new(None)
    }
}

impl DriftWatch {
    /// A watch that watches nothing until [`DriftWatch::restart`]; alarms and the level go to
    /// `metrics` when given.
    pub fn new(metrics: Option<Arc<EdgeMetrics>>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            wake: tokio::sync::Notify::new(),
            metrics,
        }
    }

    /// Starts over for a newly installed release: compare with `reference` (the device's own
    /// rows' distances) when it holds enough of them, else with the first requests; `None`:
    /// the release has no pooled summary, and nothing is watched.
    pub fn restart(&self, reference: Option<Vec<f32>>) {
        let mut state = self.lock();
        *state = State::default();
        let Some(reference) = reference else {
            return;
        };
        state.watching = true;
        match DriftDetector::new(reference) {
            Some(detector) => state.detector = Some(DriftPair::new(detector, None)),
            None => state.collecting = Some(Vec::with_capacity(REFERENCE_REQUESTS)),
        }
        state.confidences = Some(Vec::with_capacity(REFERENCE_REQUESTS));
        if let Some(m) = &self.metrics {
            m.drift_level(0.0);
        }
    }

    /// One prediction: its raw backbone features, their distance (none: the release
    /// measures none) and the served head's top probability.
    pub fn observe(&self, features: &[f32], distance: Option<f32>, confidence: f32) {
        let Some(distance) = distance else {
            return;
        };
        let mut state = self.lock();
        if !state.watching {
            return;
        }
        state.requests += 1;
        let full = |values: &mut Option<Vec<f32>>, value: f32| -> Option<Vec<f32>> {
            let collecting = values.as_mut()?;
            collecting.push(value);
            if collecting.len() < REFERENCE_REQUESTS.max(MIN_REFERENCE) {
                return None;
            }
            values.take()
        };
        // The confidence's reference: what the head served now answered on the site's own
        // requests (a release's rows are not it: the head trained on them).
        if let Some(reference) = full(&mut state.confidences, confidence)
            && let Some(pair) = &mut state.detector
        {
            pair.set_confidence(DriftDetector::from_stream(reference));
        }
        if state.collecting.is_some() {
            if let Some(reference) = full(&mut state.collecting, distance) {
                state.detector = DriftDetector::from_stream(reference)
                    .map(|detector| DriftPair::new(detector, None));
            }
            return;
        }
        let mut wake = false;
        if let Some(window) = &mut state.window {
            window.extend_from_slice(features);
            if window.len() >= RECENT_REQUESTS * features.len().max(1) {
                state.ready = state.window.take();
                wake = true;
            }
        }
        let Some(seen) = (state.detector.as_mut()).map(|d| d.observe(distance, Some(confidence)))
        else {
            return;
        };
        if let Some(m) = &self.metrics {
            m.drift_level(seen.level.min(1.0));
        }
        if seen.alarm {
            state.alarms += 1;
            let at = fedge_mqtt::now_rfc3339();
            tracing::warn!(
                requests = state.requests,
                alarms = state.alarms,
                "drift alarm: what this device serves no longer looks like its reference \
                 (a new sensor, a dirty lens, new light or new objects?); it stays drifted \
                 until that changes back or the site makes the change its new normal \
                 (POST /v1/drift/readapt)"
            );
            state.last_alarm = Some(at);
            if state.window.is_none() && state.ready.is_none() {
                state.window = Some(Vec::with_capacity(RECENT_REQUESTS * features.len()));
            }
            if let Some(m) = &self.metrics {
                m.drift_alarm();
            }
            wake = true;
        }
        if wake {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Another head serves the same release (the site's variant): the confidence's reference
    /// is learnt again from the next requests; the distance's stays.
    pub fn head_changed(&self) {
        let mut state = self.lock();
        if state.watching {
            if let Some(pair) = &mut state.detector {
                pair.set_confidence(None);
            }
            state.confidences = Some(Vec::with_capacity(REFERENCE_REQUESTS));
        }
    }

    /// The site's own command: the change is its new normal. The next requests become the
    /// window its statistics are re-estimated from and then the detector's reference. False
    /// when nothing is watched or a window is being gathered or waits already.
    pub fn start_window(&self) -> bool {
        let mut state = self.lock();
        if !state.watching || state.window.is_some() || state.ready.is_some() {
            return false;
        }
        state.window = Some(Vec::new());
        state.rereference = true;
        true
    }

    /// The features (`RECENT_REQUESTS` rows, flat) gathered since the last alarm, once there
    /// are that many; taken once.
    pub fn take_window(&self) -> Option<Vec<f32>> {
        self.lock().ready.take()
    }

    /// The site re-estimated its statistics from the window (`adapted`), or could not, and
    /// serves on. When the window was the site's command, `reference` (the window's distances)
    /// becomes the detector's reference; after an alarm the reference stays the site's own.
    pub fn adapted(&self, reference: Vec<f32>, adapted: bool) {
        let mut state = self.lock();
        state.window = None;
        state.ready = None;
        if std::mem::take(&mut state.rereference)
            && let Some(detector) = DriftDetector::from_stream(reference)
        {
            state.detector = Some(DriftPair::new(detector, None));
        }
        // The head now served answers otherwise: its confidence is learnt again.
        state.confidences = Some(Vec::with_capacity(REFERENCE_REQUESTS));
        if adapted {
            state.adaptations += 1;
            let at = fedge_mqtt::now_rfc3339();
            state.last_adapted = Some(at);
        }
        let level = state.detector.as_ref().map_or(0.0, |d| d.level().min(1.0));
        if let Some(m) = &self.metrics {
            m.drift_level(level);
        }
    }

    /// What the status says; `None` while no release with a pooled summary is watched.
    pub fn snapshot(&self) -> Option<DriftStatus> {
        let state = self.lock();
        state.watching.then(|| DriftStatus {
            level: state.detector.as_ref().map_or(0.0, |d| d.level().min(1.0)),
            alarms: state.alarms,
            last_alarm: state.last_alarm.clone(),
            requests: state.requests,
            reference: (state.detector.as_ref()).map_or(0, |d| d.distance.reference_len() as u32),
            adaptations: state.adaptations,
            last_adapted: state.last_adapted.clone(),
        })
    }

    /// Resolves at the next alarm, and when a window after one is full (one waiting task is
    /// woken each time; a wake-up while nobody waits is kept for the next).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A served head's confidence on request `i`: stable, never the same twice in a row.
    fn confidence(i: usize) -> f32 {
        0.5 + (i % 13) as f32 / 30.0
    }

    #[tokio::test]
    async fn an_alarm_is_counted_timed_and_wakes_the_agent() {
        let metrics = Arc::new(EdgeMetrics::default());
        let watch = Arc::new(DriftWatch::new(Some(Arc::clone(&metrics))));
        assert_eq!(watch.snapshot(), None, "nothing watched before a release");
        let reference: Vec<f32> = (0..400).map(|i| 1.0 + (i % 40) as f32 / 40.0).collect();
        watch.restart(Some(reference.clone()));
        let woken = tokio::spawn({
            let watch = Arc::clone(&watch);
            async move { watch.woken().await }
        });
        for i in 0..1_000 {
            watch.observe(&[0.0], Some(reference[i % reference.len()]), confidence(i));
        }
        assert_eq!(watch.snapshot().unwrap().alarms, 0);
        // The site's images move away from everything it knew.
        for i in 0..50 {
            watch.observe(&[0.0], Some(5.0 + (i % 7) as f32 / 10.0), confidence(i));
        }
        let status = watch.snapshot().unwrap();
        assert!(status.alarms >= 1, "{status:?}");
        assert!(status.last_alarm.is_some());
        assert_eq!((status.requests, status.reference), (1_050, 400));
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("the agent is woken")
            .unwrap();
        let exposition = metrics.encode();
        assert!(
            exposition.contains("fedge_edge_drift_alarms_total"),
            "{exposition}"
        );
        // A new release starts again; predictions without a distance change nothing.
        watch.restart(Some(reference));
        watch.observe(&[0.0], None, 0.5);
        assert_eq!(watch.snapshot().unwrap().requests, 0);
        watch.restart(None);
        assert_eq!(watch.snapshot(), None);
    }

    #[test]
    fn a_site_without_rows_takes_its_first_requests_as_the_reference() {
        let watch = DriftWatch::new(None);
        watch.restart(Some(Vec::new()));
        assert_eq!(watch.snapshot().unwrap().reference, 0);
        for i in 0..REFERENCE_REQUESTS {
            watch.observe(&[0.0], Some(1.0 + (i % 10) as f32 / 10.0), confidence(i));
        }
        let status = watch.snapshot().unwrap();
        assert_eq!(status.reference as usize, REFERENCE_REQUESTS);
        // The detector learns the stream's scale for its first batches, then catches it.
        for i in 0..300 {
            watch.observe(&[0.0], Some(9.0 + (i % 7) as f32 / 10.0), confidence(i));
        }
        assert!(watch.snapshot().unwrap().alarms >= 1);
    }

    #[test]
    fn a_head_grown_unsure_on_familiar_looking_requests_raises_the_alarm() {
        let watch = DriftWatch::new(None);
        let reference: Vec<f32> = (0..400).map(|i| 1.0 + (i * 7 % 40) as f32 / 40.0).collect();
        watch.restart(Some(reference.clone()));
        // The first requests teach the head's confidence; the distances' reference is the rows.
        for i in 0..2_000 {
            watch.observe(&[0.0], Some(reference[i % reference.len()]), confidence(i));
        }
        assert_eq!(watch.snapshot().unwrap().alarms, 0);
        for i in 0..300 {
            let unsure = 0.2 + (i % 11) as f32 / 50.0;
            watch.observe(&[0.0], Some(reference[i % reference.len()]), unsure);
        }
        assert_eq!(
            watch.snapshot().unwrap().alarms,
            1,
            "{:?}",
            watch.snapshot()
        );
        // Another head of the release: its confidence is learnt again, the alarm's level kept
        // by the distance (quiet here) falls.
        watch.head_changed();
        for i in 0..1_000 {
            watch.observe(
                &[0.0],
                Some(reference[i % reference.len()]),
                0.3 + (i % 11) as f32 / 50.0,
            );
        }
        assert!(
            watch.snapshot().unwrap().level < 0.5,
            "{:?}",
            watch.snapshot()
        );
    }

    #[test]
    fn a_camera_that_stays_changed_stays_drifted_until_the_site_makes_it_its_normal() {
        let metrics = Arc::new(EdgeMetrics::default());
        let watch = DriftWatch::new(Some(Arc::clone(&metrics)));
        let reference: Vec<f32> = (0..400).map(|i| 1.0 + (i * 7 % 40) as f32 / 40.0).collect();
        watch.restart(Some(reference.clone()));
        for i in 0..1_000 {
            watch.observe(&[0.0], Some(reference[i % reference.len()]), confidence(i));
        }
        let changed = |i: usize| 3.0 + (i * 3 % 11) as f32 / 10.0;
        for i in 0..2_000 {
            watch.observe(&[0.0], Some(changed(i)), confidence(i));
            if let Some(window) = watch.take_window() {
                // The agent re-estimates from the window and serves on: the reference stays.
                assert_eq!(window.len(), RECENT_REQUESTS);
                watch.adapted(vec![3.0; RECENT_REQUESTS], true);
            }
        }
        let status = watch.snapshot().unwrap();
        assert_eq!((status.alarms, status.adaptations), (1, 1), "{status:?}");
        assert_eq!(status.level, 1.0, "still drifted: {status:?}");
        assert!(metrics.encode().contains("fedge_edge_drift_level 1"));
        // The site says the change is its new normal: its window becomes the reference.
        assert!(watch.start_window());
        let mut window = Vec::new();
        for i in 0..RECENT_REQUESTS {
            window.push(changed(i));
            watch.observe(&[0.0], Some(changed(i)), confidence(i));
        }
        assert!(watch.take_window().is_some());
        watch.adapted(window, true);
        for i in 0..2_000 {
            watch.observe(&[0.0], Some(changed(i + 5)), confidence(i));
        }
        let status = watch.snapshot().unwrap();
        assert_eq!(status.alarms, 1, "{status:?}");
        assert!(status.level < 0.5, "{status:?}");
        let exposition = metrics.encode();
        let line = (exposition.lines())
            .find(|l| l.starts_with("fedge_edge_drift_level "))
            .unwrap();
        let metric: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((metric - status.level).abs() < 1e-6, "{line} vs {status:?}");
    }
}
