//! The device's metrics for Prometheus, served on `metrics_listen` (a profile's top-level
//! setting; docs/prometheus.md lists them): local training, the samples it trains on, the image
//! files of its site folder left out because they do not decode, the model it serves,
//! predictions asked over HTTP and MQTT, and the process's memory. The agent's driver and the
//! inference endpoints feed it; nothing in the agent's state machine depends on it.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a prediction was asked and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    via: &'static str,
    outcome: &'static str,
}

/// The device's metrics.
pub struct EdgeMetrics {
    registry: Registry,
    rounds_trained: Counter,
    train_seconds: Histogram,
    samples: Gauge,
    model_round: Gauge,
    requests: Family<RequestLabels, Counter>,
    inference_seconds: Histogram,
    resident: Gauge<u64, AtomicU64>,
    peak: Gauge<u64, AtomicU64>,
    privacy_epsilon: Gauge<f64, AtomicU64>,
    drift_level: Gauge<f64, AtomicU64>,
    drift_alarms: Counter,
    labelling_waiting: Gauge,
    labelling_labelled: Gauge,
    serving: Family<ReleaseLabels, Gauge>,
    site_variant: Family<VariantLabels, Gauge>,
    images_skipped: Counter,
    /// Held while `images_skipped` is brought up to a total, so two callers add it once.
    skipped_sync: std::sync::Mutex<()>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReleaseLabels {
    sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VariantLabels {
    variant: &'static str,
}

impl std::fmt::Debug for EdgeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeMetrics").finish_non_exhaustive()
    }
}

impl Default for EdgeMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fedge_edge");
        let rounds_trained = Counter::default();
        let train_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        let samples = Gauge::default();
        let model_round = Gauge::default();
        let requests = Family::default();
        let inference_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 16));
        let resident = Gauge::default();
        let peak = Gauge::default();
        let privacy_epsilon = Gauge::default();
        let drift_level = Gauge::default();
        let drift_alarms = Counter::default();
        let labelling_waiting = Gauge::default();
        let labelling_labelled = Gauge::default();
        let serving = Family::default();
        let site_variant = Family::<VariantLabels, Gauge>::default();
        for variant in fedge_wire::SiteVariant::ALL {
            let labels = VariantLabels {
                variant: variant.name(),
            };
            site_variant
                .get_or_create(&labels)
                .set(i64::from(variant == fedge_wire::SiteVariant::Release));
        }
        let images_skipped = Counter::default();
        let r = &mut registry;
        r.register(
            "rounds_trained",
            "Rounds this device trained for",
            rounds_trained.clone(),
        );
        r.register(
            "train_duration_seconds",
            "Local training time per round",
            train_seconds.clone(),
        );
        r.register("samples", "Samples the device trains on", samples.clone());
        r.register(
            "model_round",
            "Round of the global model the device holds (and serves, when it answers predictions)",
            model_round.clone(),
        );
        r.register(
            "inference_requests",
            "Predictions asked, by channel (http, mqtt) and outcome (ok, error)",
            requests.clone(),
        );
        r.register(
            "inference_duration_seconds",
            "Time to answer a prediction (decoding, backbone, head)",
            inference_seconds.clone(),
        );
        r.register(
            "resident_memory_bytes",
            "The agent's resident memory",
            resident.clone(),
        );
        r.register(
            "peak_resident_memory_bytes",
            "The agent's peak resident memory",
            peak.clone(),
        );
        r.register(
            "privacy_epsilon",
            "Local differential privacy: the epsilon this device's updates have spent so far at its [privacy] delta (0 when off)",
            privacy_epsilon.clone(),
        );
        r.register(
            "drift_level",
            "The drift alarm's level on what the device serves: 0 quiet, 1 at an alarm",
            drift_level.clone(),
        );
        r.register(
            "drift_alarms",
            "Drift alarms raised on what the device serves",
            drift_alarms.clone(),
        );
        r.register(
            "labelling_waiting",
            "Inputs in the site's labelling queue waiting for a label",
            labelling_waiting.clone(),
        );
        r.register(
            "labelling_labelled",
            "Labels given in the site's labelling queue (undone ones taken off)",
            labelling_labelled.clone(),
        );
        r.register(
            "images_skipped",
            "Image files of the site folder left out because they do not decode, each file once",
            images_skipped.clone(),
        );
        r.register(
            "serving_release",
            "1 for the release (its SHA-256) the device serves predictions with",
            serving.clone(),
        );
        r.register(
            "site_variant",
            "1 for the variant of the release the device serves at its site (release, prior-em, \
             correction), 0 for the others",
            site_variant.clone(),
        );
        Self {
            registry,
            rounds_trained,
            train_seconds,
            samples,
            model_round,
            requests,
            inference_seconds,
            resident,
            peak,
            privacy_epsilon,
            drift_level,
            drift_alarms,
            labelling_waiting,
            labelling_labelled,
            serving,
            site_variant,
            images_skipped,
            skipped_sync: Default::default(),
        }
    }
}

impl EdgeMetrics {
    /// A round trained in `seconds` on `samples` samples.
    pub fn trained(&self, seconds: f64, samples: u64) {
        self.rounds_trained.inc();
        self.train_seconds.observe(seconds);
        self.samples.set(samples as i64);
    }

    /// `total` image files of the site folder have been left out so far
    /// (`crate::data::LoadReport`): the counter follows it (it never goes down).
    pub fn images_skipped(&self, total: u64) {
        let _held = self.skipped_sync.lock().unwrap_or_else(|e| e.into_inner());
        let counted = self.images_skipped.get();
        if total > counted {
            self.images_skipped.inc_by(total - counted);
        }
    }

    /// The device serves the release whose SHA-256 is `sha256` (hex), and no other.
    pub fn serving(&self, sha256: &str) {
        self.serving.clear();
        self.serving
            .get_or_create(&ReleaseLabels {
                sha256: sha256.to_owned(),
            })
            .set(1);
    }

    /// The site serves `variant` of the release (1 for it, 0 for the others).
    pub fn site_variant(&self, variant: fedge_wire::SiteVariant) {
        for v in fedge_wire::SiteVariant::ALL {
            let labels = VariantLabels { variant: v.name() };
            self.site_variant
                .get_or_create(&labels)
                .set(i64::from(v == variant));
        }
    }

    /// The labelling queue holds `waiting` inputs; `labelled` labels were given.
    pub fn labelling(&self, waiting: u64, labelled: u64) {
        self.labelling_waiting.set(waiting as i64);
        self.labelling_labelled.set(labelled as i64);
    }

    /// The device holds (and serves, when it answers predictions) the model of `round`.
    pub fn model_round(&self, round: u64) {
        self.model_round.set(round as i64);
    }

    /// A prediction asked over `via` ("http" or "mqtt"), answered (`ok`) or not, in `seconds`.
    pub fn prediction(&self, via: &'static str, ok: bool, seconds: f64) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&RequestLabels { via, outcome })
            .inc();
        self.inference_seconds.observe(seconds);
    }

    /// Local DP: the ε the device's updates have spent so far.
    pub fn privacy_epsilon(&self, epsilon: f64) {
        self.privacy_epsilon.set(epsilon);
    }

    /// The drift alarm's level now (0 to 1).
    pub fn drift_level(&self, level: f64) {
        self.drift_level.set(level);
    }

    /// A drift alarm was raised.
    pub fn drift_alarm(&self) {
        self.drift_alarms.inc();
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let (resident, peak) = fedge_daemon::metrics::memory().unwrap_or_default();
        self.resident.set(resident);
        self.peak.set(peak);
        fedge_daemon::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_serving_and_predictions_read_back_in_the_exposition() {
        let m = EdgeMetrics::default();
        m.trained(0.25, 270);
        m.model_round(3);
        m.prediction("http", true, 0.001);
        m.prediction("http", false, 0.000_2);
        m.prediction("mqtt", true, 0.002);
        m.privacy_epsilon(2.5);
        m.images_skipped(2);
        m.images_skipped(1);
        m.images_skipped(3);
        let text = m.encode();
        for line in [
            "fedge_edge_rounds_trained_total 1",
            "fedge_edge_samples 270",
            "fedge_edge_model_round 3",
            "fedge_edge_inference_requests_total{via=\"http\",outcome=\"ok\"} 1",
            "fedge_edge_inference_requests_total{via=\"http\",outcome=\"error\"} 1",
            "fedge_edge_inference_duration_seconds_count 3",
            "fedge_edge_train_duration_seconds_count 1",
            "fedge_edge_privacy_epsilon 2.5",
            "fedge_edge_images_skipped_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
