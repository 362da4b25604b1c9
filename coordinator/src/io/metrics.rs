//! The coordinator's metrics for Prometheus: OpenMetrics text on `GET /metrics` at
//! `metrics_listen` (loopback by default in the example configuration), next to the retained
//! JSON status that MQTT dashboards read. Names and meanings are in docs/prometheus.md.
//!
//! The driver feeds it what it sees (round outputs, bytes on the wire); the machine itself
//! stays free of I/O and of metrics.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::round::{RoundReport, Rounds};

/// Buckets of the staleness histogram, in versions: one per value up to 10 (the default
/// `max_staleness`), coarser beyond.
const STALENESS_BUCKETS: [f64; 15] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 50.0, 100.0, 1000.0,
];

/// `outcome` (and `reason`) of an update.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpdateLabels {
    outcome: &'static str,
    reason: &'static str,
}

/// Why a round was abandoned.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// A gate verdict's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The coordinator's metrics.
pub struct Metrics {
    registry: Registry,
    rounds_opened: Counter,
    rounds_aggregated: Counter,
    rounds_abandoned: Family<ReasonLabel, Counter>,
    updates: Family<UpdateLabels, Counter>,
    round_seconds: Histogram,
    aggregation_seconds: Histogram,
    received_bytes: Counter,
    sent_bytes: Counter,
    devices_online: Gauge,
    devices_selected: Gauge,
    round: Gauge,
    resident_bytes: Gauge<u64, AtomicU64>,
    privacy_epsilon: Gauge<f64, AtomicU64>,
    serving_round: Gauge,
    candidate_round: Gauge,
    canary_devices: Gauge,
    gate_verdicts: Family<OutcomeLabel, Counter>,
    gate_candidate_accuracy: Gauge<f64, AtomicU64>,
    gate_serving_accuracy: Gauge<f64, AtomicU64>,
    rollbacks: Counter,
    model_version: Gauge,
    buffer_fill: Gauge,
    buffer_size: Gauge,
    in_flight: Gauge,
    staleness: Histogram,
    last_opened: std::sync::atomic::AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All metrics at zero, registered.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("fedge"),
            rounds_opened: Counter::default(),
            rounds_aggregated: Counter::default(),
            rounds_abandoned: Family::default(),
            updates: Family::default(),
            // 0.05 s to ~27 min.
            round_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
            // 1 ms to ~33 s.
            aggregation_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            received_bytes: Counter::default(),
            sent_bytes: Counter::default(),
            devices_online: Gauge::default(),
            devices_selected: Gauge::default(),
            round: Gauge::default(),
            resident_bytes: Gauge::default(),
            privacy_epsilon: Gauge::default(),
            serving_round: Gauge::default(),
            candidate_round: Gauge::default(),
            canary_devices: Gauge::default(),
            gate_verdicts: Family::default(),
            gate_candidate_accuracy: Gauge::default(),
            gate_serving_accuracy: Gauge::default(),
            rollbacks: Counter::default(),
            model_version: Gauge::default(),
            buffer_fill: Gauge::default(),
            buffer_size: Gauge::default(),
            in_flight: Gauge::default(),
            staleness: Histogram::new(STALENESS_BUCKETS),
            last_opened: Default::default(),
        };
        let r = &mut m.registry;
        r.register("rounds_opened", "Rounds opened", m.rounds_opened.clone());
        r.register(
            "rounds_aggregated",
            "Rounds that ended with an aggregation",
            m.rounds_aggregated.clone(),
        );
        r.register(
            "rounds_abandoned",
            "Rounds that ended without one, by reason",
            m.rounds_abandoned.clone(),
        );
        r.register(
            "updates",
            "Device updates by outcome (accepted, rejected) and rejection reason",
            m.updates.clone(),
        );
        r.register(
            "round_duration_seconds",
            "Time from a round's task to its end",
            m.round_seconds.clone(),
        );
        r.register(
            "aggregation_duration_seconds",
            "Time the coordinator took over the event that closed a round, aggregation included",
            m.aggregation_seconds.clone(),
        );
        r.register(
            "received_bytes",
            "MQTT payload bytes received (updates, device statuses)",
            m.received_bytes.clone(),
        );
        r.register(
            "sent_bytes",
            "MQTT payload bytes published (tasks, releases, statuses, metrics)",
            m.sent_bytes.clone(),
        );
        r.register(
            "devices_online",
            "Devices whose retained status says online",
            m.devices_online.clone(),
        );
        r.register(
            "devices_selected",
            "Devices selected for the open round",
            m.devices_selected.clone(),
        );
        r.register("round", "The current round", m.round.clone());
        r.register(
            "resident_memory_bytes",
            "The coordinator's resident memory",
            m.resident_bytes.clone(),
        );
        r.register(
            "privacy_epsilon",
            "Central differential privacy: the epsilon spent so far at the configured delta (0 when off)",
            m.privacy_epsilon.clone(),
        );
        r.register(
            "release_serving_round",
            "The round of the release every device serves (outside a canary stage); 0 before one",
            m.serving_round.clone(),
        );
        r.register(
            "release_candidate_round",
            "The round of the candidate waiting for the gate; 0 when none",
            m.candidate_round.clone(),
        );
        r.register(
            "release_canary_devices",
            "Devices serving a release in its canary stage; 0 when none",
            m.canary_devices.clone(),
        );
        r.register(
            "gate_verdicts",
            "The evaluation gate's verdicts by outcome (promoted, held)",
            m.gate_verdicts.clone(),
        );
        r.register(
            "gate_candidate_accuracy_points",
            "The last judged candidate's mean accuracy on the evaluation-only sites, in points",
            m.gate_candidate_accuracy.clone(),
        );
        r.register(
            "gate_serving_accuracy_points",
            "The served release's mean accuracy on the same sites when the last candidate was judged",
            m.gate_serving_accuracy.clone(),
        );
        r.register(
            "release_rollbacks",
            "Rollbacks: ctl rollback, and canaries that failed",
            m.rollbacks.clone(),
        );
        r.register(
            "model_version",
            "Buffered aggregation: model versions published (rounds aggregated); 0 in synchronous mode",
            m.model_version.clone(),
        );
        r.register(
            "buffer_fill_updates",
            "Buffered aggregation: accepted updates in the open buffer",
            m.buffer_fill.clone(),
        );
        r.register(
            "buffer_size_updates",
            "Buffered aggregation: accepted updates a model version takes (buffer_size); 0 in synchronous mode",
            m.buffer_size.clone(),
        );
        r.register(
            "in_flight_devices",
            "Buffered aggregation: devices given a task whose update has not come in yet",
            m.in_flight.clone(),
        );
        r.register(
            "update_staleness_versions",
            "Buffered aggregation: updates folded into a model version, by how many versions behind it they started",
            m.staleness.clone(),
        );
        m
    }

    /// Buffered aggregation (FedBuff): the model version, the open buffer's fill and size and
    /// the devices in flight, as the status's `buffer` section says them; all 0 in synchronous
    /// mode.
    pub fn buffer(&self, rounds: &Rounds) {
        if !super::status::buffered(rounds) {
            return;
        }
        let config = &rounds.config().aggregation;
        self.model_version.set(rounds.aggregated_rounds() as i64);
        self.buffer_fill.set(rounds.reported() as i64);
        self.buffer_size.set(config.buffer_size as i64);
        self.in_flight.set(rounds.in_flight().len() as i64);
    }

    /// The release pipeline: the rounds of the release served and of the candidate, and the
    /// devices in a canary stage (`ReleaseFlow::rounds`).
    pub fn releases(&self, (serving, candidate, canary): (Option<u64>, Option<u64>, usize)) {
        let round = |r: Option<u64>| r.map_or(0, |r| r as i64);
        self.serving_round.set(round(serving));
        self.candidate_round.set(round(candidate));
        self.canary_devices.set(canary as i64);
    }

    /// A release event: verdicts and rollbacks are counted.
    pub fn release_event(&self, event: &crate::release::ReleaseEvent) {
        use crate::release::ReleaseEvent;
        match event {
            ReleaseEvent::Verdict(verdict) => {
                let outcome = match verdict.outcome {
                    fedge_wire::GateOutcome::Promoted => "promoted",
                    fedge_wire::GateOutcome::Held => "held",
                    fedge_wire::GateOutcome::Waiting => return,
                };
                self.gate_verdicts
                    .get_or_create(&OutcomeLabel { outcome })
                    .inc();
                if let (Some(c), Some(s)) = (verdict.candidate_accuracy, verdict.serving_accuracy) {
                    self.gate_candidate_accuracy.set(c);
                    self.gate_serving_accuracy.set(s);
                }
            }
            ReleaseEvent::RolledBack { .. } => {
                self.rollbacks.inc();
            }
            _ => {}
        }
    }

    /// Central DP's ε spent so far.
    pub fn privacy_epsilon(&self, epsilon: f64) {
        self.privacy_epsilon.set(epsilon);
    }

    /// A round's task was published (a republished task is not a new round).
    pub fn task_published(&self, round: u64) {
        use std::sync::atomic::Ordering;
        if self.last_opened.fetch_max(round, Ordering::Relaxed) < round {
            self.rounds_opened.inc();
            self.round.set(round as i64);
        }
    }

    /// A round ended; `closing_seconds` is how long the event that closed it took.
    pub fn round_ended(&self, report: &RoundReport, closing_seconds: f64) {
        if report.aggregated {
            self.rounds_aggregated.inc();
            self.aggregation_seconds.observe(closing_seconds);
        }
        if let Some(reason) = report.abandoned {
            self.rounds_abandoned
                .get_or_create(&ReasonLabel { reason })
                .inc();
        }
        self.round_seconds.observe(report.duration_ms as f64 / 1e3);
        let accepted = UpdateLabels {
            outcome: "accepted",
            reason: "",
        };
        let n = report.reported.len() as u64;
        self.updates.get_or_create(&accepted).inc_by(n);
        // Buffered mode: each update the version took, at its staleness (empty otherwise).
        for (versions, &count) in report.staleness.iter().enumerate() {
            for _ in 0..count {
                self.staleness.observe(versions as f64);
            }
        }
    }

    /// An update (or status, or chunk) was rejected.
    pub fn rejected(&self, reason: &'static str) {
        let labels = UpdateLabels {
            outcome: "rejected",
            reason,
        };
        self.updates.get_or_create(&labels).inc();
    }

    /// Payload bytes received.
    pub fn received(&self, bytes: usize) {
        self.received_bytes.inc_by(bytes as u64);
    }

    /// Payload bytes published.
    pub fn sent(&self, bytes: usize) {
        self.sent_bytes.inc_by(bytes as u64);
    }

    /// Devices online and selected now.
    pub fn devices(&self, online: usize, selected: usize) {
        self.devices_online.set(online as i64);
        self.devices_selected.set(selected as i64);
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let (resident, _) = fedge_daemon::metrics::memory().unwrap_or_default();
        self.resident_bytes.set(resident);
        fedge_daemon::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_and_a_rejection_read_back_in_the_exposition() {
        let m = Metrics::new();
        m.task_published(1);
        m.task_published(1);
        m.rejected("norm");
        m.round_ended(
            &RoundReport {
                // One update as fresh as the version, one a version behind.
                staleness: vec![1, 1],
                round: 1,
                aggregated: true,
                abandoned: None,
                capped: Vec::new(),
                norm_clipped: Vec::new(),
                selected: vec!["a".into(), "b".into()],
                reported: vec!["a".into(), "b".into()],
                rejected: Default::default(),
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 1_500,
                source_val_accuracy: None,
                train_loss: None,
                params_norm: 0.0,
                aggregation: None,
                failures: Default::default(),
                privacy: None,
            },
            0.002,
        );
        m.devices(3, 2);
        m.privacy_epsilon(1.5);
        m.releases((Some(4), Some(6), 2));
        let reference = |round| fedge_wire::ReleaseRef {
            sha256: "ab".repeat(32),
            round,
        };
        m.release_event(&crate::release::ReleaseEvent::Verdict(
            fedge_wire::GateVerdict {
                candidate: reference(6),
                outcome: fedge_wire::GateOutcome::Held,
                sites: 2,
                candidate_accuracy: Some(61.5),
                serving_accuracy: Some(74.0),
                worst_class: None,
                worst_class_drop: None,
                reason: String::new(),
            },
        ));
        m.release_event(&crate::release::ReleaseEvent::RolledBack {
            to: reference(3),
            from: Some(reference(4)),
            reason: String::new(),
        });
        let text = m.encode();
        for line in [
            "fedge_release_serving_round 4",
            "fedge_release_candidate_round 6",
            "fedge_release_canary_devices 2",
            "fedge_gate_verdicts_total{outcome=\"held\"} 1",
            "fedge_gate_candidate_accuracy_points 61.5",
            "fedge_gate_serving_accuracy_points 74.0",
            "fedge_release_rollbacks_total 1",
            "fedge_rounds_opened_total 1",
            "fedge_rounds_aggregated_total 1",
            "fedge_updates_total{outcome=\"accepted\",reason=\"\"} 2",
            "fedge_updates_total{outcome=\"rejected\",reason=\"norm\"} 1",
            "fedge_devices_online 3",
            "fedge_round 1",
            "fedge_round_duration_seconds_count 1",
            "fedge_privacy_epsilon 1.5",
            "fedge_update_staleness_versions_bucket{le=\"0.0\"} 1",
            "fedge_update_staleness_versions_bucket{le=\"1.0\"} 2",
            "fedge_update_staleness_versions_count 2",
            "fedge_update_staleness_versions_sum 1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn buffered_mode_shows_its_version_buffer_and_devices_in_flight() {
        use crate::buffer::AggregationConfig;
        let machine = super::super::status::three_online;
        let m = Metrics::new();
        m.buffer(&machine(AggregationConfig::default()));
        let text = m.encode();
        for line in [
            "fedge_model_version 0",
            "fedge_buffer_size_updates 0",
            "fedge_in_flight_devices 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        m.buffer(&machine(AggregationConfig::buffered(5, 2, 3)));
        let text = m.encode();
        for line in [
            "fedge_model_version 0",
            "fedge_buffer_fill_updates 0",
            "fedge_buffer_size_updates 5",
            "fedge_in_flight_devices 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
