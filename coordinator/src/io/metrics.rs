//! The coordinator's metrics for Prometheus: OpenMetrics text on `GET /metrics` at
//! `metrics_listen` (loopback by default in the example configuration), next to the retained
//! JSON status that MQTT dashboards read. Names and meanings are in docs/prometheus.md.
//!
//! The driver feeds it what it sees (round outputs, bytes on the wire); the machine itself
//! stays free of I/O and of metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::round::{Phase, RoundReport, Rounds};

/// A gauge of f64 values (accuracies, ε).
type Real = Gauge<f64, AtomicU64>;

/// The one series of a gauge that is absent while its value is unknown: a family of no labels,
/// empty until set (a 0 would read as a value to alerts and dashboards).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Known;

impl EncodeLabelSet for Known {
    fn encode(&self, _: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

/// An evaluation-only site, by client id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SiteLabel {
    site: String,
}

/// One of the federation's states.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// `value` as the f64 of its shortest f32 digits (0.8, not 0.800000011920929), as the status
/// JSON writes it.
fn shortest(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

/// The states `fedge_federation_state` says, one series each.
const FEDERATION_STATES: [&str; 4] = ["running", "paused", "waiting", "finished"];

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
    gate_candidate_accuracy: Family<Known, Real>,
    gate_serving_accuracy: Family<Known, Real>,
    site_accuracy: Family<SiteLabel, Real>,
    candidate_site_accuracy: Family<SiteLabel, Real>,
    /// The sites' accuracies last set in `site_accuracy` and `candidate_site_accuracy`.
    sites_shown: Mutex<[BTreeMap<String, f32>; 2]>,
    federation_state: Family<StateLabel, Gauge>,
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
            gate_candidate_accuracy: Family::default(),
            gate_serving_accuracy: Family::default(),
            site_accuracy: Family::default(),
            candidate_site_accuracy: Family::default(),
            sites_shown: Default::default(),
            federation_state: Family::default(),
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
            "The last judged candidate's mean accuracy on the evaluation-only sites, in points; absent before a judgement",
            m.gate_candidate_accuracy.clone(),
        );
        r.register(
            "gate_serving_accuracy_points",
            "The served release's mean accuracy on the same sites when the last candidate was judged; absent before a judgement",
            m.gate_serving_accuracy.clone(),
        );
        r.register(
            "site_accuracy",
            "Each evaluation-only site's accuracy (0 to 1) of the release devices serve; absent until the site scored it",
            m.site_accuracy.clone(),
        );
        r.register(
            "candidate_site_accuracy",
            "Each evaluation site's accuracy (0 to 1) of the candidate waiting for the gate; absent without one",
            m.candidate_site_accuracy.clone(),
        );
        r.register(
            "federation_state",
            "1 for the federation's state (running, paused, waiting, finished), 0 for the others",
            m.federation_state.clone(),
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

    /// What the metrics read off the machine after its outputs: the buffered aggregation's
    /// gauges, the federation's state, and the evaluation sites' accuracy of the release
    /// devices serve and of the candidate (as the status's `site_accuracy` and
    /// `candidate_accuracy` say them: a site whose score of it is unknown has no series).
    pub fn observe(&self, rounds: &Rounds) {
        self.buffered(rounds);
        let state = match rounds.phase() {
            Phase::Finished => "finished",
            _ if rounds.control().paused => "paused",
            Phase::Training => "running",
            Phase::Waiting => "waiting",
        };
        for s in FEDERATION_STATES {
            let series = self
                .federation_state
                .get_or_create(&StateLabel { state: s });
            series.set(i64::from(s == state));
        }
        let now = [
            rounds.served_site_accuracy(),
            rounds.candidate_site_accuracy(),
        ];
        let Ok(mut shown) = self.sites_shown.lock() else {
            return;
        };
        for ((family, now), shown) in [&self.site_accuracy, &self.candidate_site_accuracy]
            .into_iter()
            .zip(now)
            .zip(shown.iter_mut())
        {
            if *shown == now {
                continue;
            }
            for site in shown.keys().filter(|site| !now.contains_key(*site)) {
                family.remove(&SiteLabel { site: site.clone() });
            }
            for (site, accuracy) in &now {
                let label = SiteLabel { site: site.clone() };
                family.get_or_create(&label).set(shortest(*accuracy));
            }
            *shown = now;
        }
    }

    /// Buffered aggregation (FedBuff): the model version, the open buffer's fill and size and
    /// the devices in flight, as the status's `buffer` section says them; all 0 in synchronous
    /// mode.
    fn buffered(&self, rounds: &Rounds) {
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
                    self.gate_candidate_accuracy.get_or_create(&Known).set(c);
                    self.gate_serving_accuracy.get_or_create(&Known).set(s);
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

    /// Sample lines of `name` (its series, not its `# HELP` and `# TYPE` lines).
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let of = |l: &&str| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with([' ', '{']))
        };
        text.lines().filter(of).collect()
    }

    #[test]
    fn a_gauge_whose_value_is_unknown_is_absent_not_zero() {
        let m = Metrics::new();
        let unknown = [
            "fedge_gate_candidate_accuracy_points",
            "fedge_gate_serving_accuracy_points",
            "fedge_site_accuracy",
            "fedge_candidate_site_accuracy",
            "fedge_federation_state",
        ];
        let text = m.encode();
        for name in unknown {
            assert!(!text.contains(name), "{name} in\n{text}");
        }
        // A verdict without numbers (promoted unjudged at the timeout) says none either.
        let verdict = |accuracies: Option<(f64, f64)>| {
            crate::release::ReleaseEvent::Verdict(fedge_wire::GateVerdict {
                candidate: fedge_wire::ReleaseRef {
                    sha256: "cd".repeat(32),
                    round: 5,
                },
                outcome: fedge_wire::GateOutcome::Promoted,
                sites: 1,
                candidate_accuracy: accuracies.map(|a| a.0),
                serving_accuracy: accuracies.map(|a| a.1),
                worst_class: None,
                worst_class_drop: None,
                reason: String::new(),
            })
        };
        m.release_event(&verdict(None));
        let text = m.encode();
        assert_eq!(samples(&text, unknown[0]), [] as [&str; 0], "{text}");
        m.release_event(&verdict(Some((80.0, 79.5))));
        let text = m.encode();
        assert_eq!(samples(&text, unknown[0]), [format!("{} 80.0", unknown[0])]);
        assert_eq!(samples(&text, unknown[1]), [format!("{} 79.5", unknown[1])]);
    }

    #[test]
    fn the_served_release_s_site_accuracy_and_the_federation_s_state_read_back() {
        use super::super::status::gated::{evaluates, machine, released};
        use fedge_wire::control::Command;
        let m = Metrics::new();
        let mut rounds = machine();
        m.observe(&rounds);
        let text = m.encode();
        for (state, value) in [
            ("running", 1),
            ("paused", 0),
            ("waiting", 0),
            ("finished", 0),
        ] {
            let line = format!("fedge_federation_state{{state=\"{state}\"}} {value}");
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert_eq!(samples(&text, "fedge_site_accuracy"), [] as [&str; 0]);
        // Round 1 served and scored 80 %, round 2 a candidate scored 25.4 % and held.
        let first = released(&mut rounds, 1, 1.0);
        evaluates(&mut rounds, &first, 800, None);
        let bad = released(&mut rounds, 2, -30.0);
        evaluates(&mut rounds, &bad, 254, Some((&first, 800)));
        rounds.apply_control(&Command::Pause, 200);
        m.observe(&rounds);
        let text = m.encode();
        assert_eq!(
            samples(&text, "fedge_site_accuracy"),
            ["fedge_site_accuracy{site=\"eval\"} 0.8"]
        );
        assert_eq!(
            samples(&text, "fedge_candidate_site_accuracy"),
            ["fedge_candidate_site_accuracy{site=\"eval\"} 0.254"]
        );
        assert!(
            text.contains("fedge_federation_state{state=\"paused\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("fedge_federation_state{state=\"running\"} 0\n"),
            "{text}"
        );
        // The operator serves the candidate: its score is what devices get, and no candidate
        // waits.
        rounds.apply_control(&Command::Promote, 300);
        m.observe(&rounds);
        let text = m.encode();
        assert_eq!(
            samples(&text, "fedge_site_accuracy"),
            ["fedge_site_accuracy{site=\"eval\"} 0.254"]
        );
        assert_eq!(
            samples(&text, "fedge_candidate_site_accuracy"),
            [] as [&str; 0]
        );
    }

    #[test]
    fn buffered_mode_shows_its_version_buffer_and_devices_in_flight() {
        use crate::buffer::AggregationConfig;
        let machine = super::super::status::three_online;
        let m = Metrics::new();
        m.observe(&machine(AggregationConfig::default()));
        let text = m.encode();
        for line in [
            "fedge_model_version 0",
            "fedge_buffer_size_updates 0",
            "fedge_in_flight_devices 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        m.observe(&machine(AggregationConfig::buffered(5, 2, 3)));
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
