//! The documents the driver publishes: the retained coordinator status (built from the machine's
//! getters, the driver's clocks and the audit trail's head) and the per-round metrics. Pure
//! functions of the machine; publishing is the driver's.

use std::time::Duration;

use fedge_wire::CoordinatorStatus;

use crate::round::{RoundReport, Rounds};
use crate::updates::norms::l2_norm;

/// What the status document needs beyond the machine: the federation's name and the
/// driver's clocks (the machine's milliseconds mapped to wall-clock times).
#[derive(Debug, Clone)]
pub struct StatusContext {
    /// Machine time now.
    pub now_ms: u64,
    /// Wall-clock time now.
    pub wall: std::time::SystemTime,
    /// Wall-clock time of the last aggregation.
    pub last_aggregation: Option<std::time::SystemTime>,
    /// Federation name.
    pub federation: String,
    /// Why the device keys file does not load, while no key is accepted.
    pub keys_error: Option<String>,
    /// The audit trail's head as last taken ([`StatusContext::follow_audit`]).
    pub audit_head: Option<fedge_wire::AuditHead>,
}

impl StatusContext {
    /// Takes the audit trail's head after the appends so far (`AuditLog::head`: O(1), the
    /// writer's own tail); true when it moved since the last call, so that the status goes
    /// out again and the broker's retained copy, dashboards and `watch` see each new head.
    pub fn follow_audit(&mut self, audit: Option<&mut crate::store::audit::AuditLog>) -> bool {
        let head = audit.and_then(crate::store::audit::AuditLog::head);
        let moved = head != self.audit_head;
        self.audit_head = head;
        moved
    }
}

impl Default for StatusContext {
    fn default() -> Self {
        Self {
            now_ms: 0,
            wall: std::time::SystemTime::now(),
            last_aggregation: None,
            federation: String::new(),
            keys_error: None,
            audit_head: None,
        }
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The retained status document.
pub fn status_at(
    rounds: &Rounds,
    target_accuracy: Option<f32>,
    context: &StatusContext,
) -> CoordinatorStatus {
    let rejected = rounds
        .rejected_total()
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let deadline = rounds
        .deadline_ms()
        .map(|ms| rfc3339(context.wall + Duration::from_millis(ms.saturating_sub(context.now_ms))));
    let privacy = rounds.privacy_spent();
    // The current run: its first round and the rounds aggregated before it (`ctl new-run`);
    // `total_rounds` counts aggregated rounds over every run.
    let (first_round, before) = rounds.control().run_start;
    let total = rounds.config().rounds;
    let mut status = CoordinatorStatus {
        federation: context.federation.clone(),
        run: format!("{:016x}", rounds.config().run),
        state: rounds.phase().name().into(),
        phase: rounds.phase_detail().into(),
        deadline,
        last_aggregation: context.last_aggregation.map(rfc3339),
        objective: rounds.config().train.objective,
        round: rounds.round(),
        total_rounds: rounds.config().rounds,
        strategy: rounds.strategy_name().into(),
        solver: rounds.strategy_solver().map(str::to_owned),
        momentum_norm: rounds
            .last_report()
            .and_then(|r| r.aggregation.as_ref())
            .and_then(|a| a.momentum_norm),
        clients_online: rounds.online().len() as u32,
        clients_selected: rounds.selected() as u32,
        clients_reported: rounds.reported() as u32,
        rejected_total: rounds.rejected_total().values().sum(),
        rejected_updates: rejected,
        target_accuracy,
        // What users get: the release served's scores, the candidate's beside them.
        site_accuracy: rounds.served_site_accuracy(),
        candidate_accuracy: rounds.candidate_site_accuracy(),
        control_refused: rounds.control().refused.clone(),
        last_command: rounds.control().last_command.clone(),
        release: rounds.releases().status(&|ms| {
            rfc3339(context.wall + Duration::from_millis(ms.saturating_sub(context.now_ms)))
        }),
        paused: rounds.control().paused,
        waiting_for: rounds.waiting_reason(),
        resting: rounds.resting(),
        runs: rounds.control().runs.clone(),
        aggregated_rounds: Some(rounds.aggregated_rounds()),
        run_first_round: Some(first_round),
        run_aggregated: Some(rounds.aggregated_rounds().saturating_sub(before)),
        run_rounds: (total > 0).then(|| total.saturating_sub(before)),
        banned: rounds.control().banned.iter().cloned().collect(),
        protocol: Some(rounds.downlink_version()),
        device_protocols: (rounds.device_protocols().into_iter())
            .map(|(v, n)| (v.to_string(), n))
            .collect(),
        previous_protocol_accepted: rounds.previous_protocol_accepted(),
        backbone_sha256: (rounds.config().backbone_sha256).map(|d| fedge_wire::hex::encode(&d)),
        source_val_accuracy: rounds.last_report().and_then(|r| r.source_val_accuracy),
        params_norm: l2_norm(rounds.params()),
        updated_at: rfc3339(context.wall),
        privacy: privacy.map(|_| crate::strategy::PrivacyMode::Central.name().to_owned()),
        epsilon: privacy.map(|p| p.epsilon),
        delta: privacy.map(|p| p.delta),
        target_epsilon: privacy.and_then(|p| p.target_epsilon),
        privacy_budget_exhausted: privacy.is_some_and(|p| p.exhausted),
        keys_error: context.keys_error.clone(),
        audit_head: context.audit_head.clone(),
        buffer: None,
    };
    if buffered(rounds) {
        let config = &rounds.config().aggregation;
        let stale = crate::round::Rejection::Stale.name();
        status.buffer = Some(fedge_wire::BufferStatus {
            version: rounds.aggregated_rounds(),
            fill: rounds.reported() as u64,
            size: config.buffer_size as u64,
            in_flight: rounds.in_flight().len() as u32,
            concurrency: config.concurrency as u64,
            max_staleness: config.max_staleness,
            staleness: rounds.staleness_histogram().to_vec(),
            stale: rounds.rejected_total().get(stale).copied().unwrap_or(0),
        });
    }
    status
}

/// Whether the machine aggregates buffered (FedBuff): `[aggregation] mode = "buffered"`, except
/// at a site aggregator, which always runs rounds.
pub fn buffered(rounds: &Rounds) -> bool {
    rounds.config().aggregation.is_buffered() && rounds.config().relay.is_none()
}

/// The per-round metrics document.
pub fn metrics_json(
    report: &RoundReport,
    target_accuracy: Option<f32>,
    strategy: &str,
    site_accuracy: &std::collections::BTreeMap<String, f32>,
) -> serde_json::Value {
    let mut metrics = serde_json::json!({
        "round": report.round,
        "strategy": strategy,
        "aggregated": report.aggregated,
        "target_accuracy": target_accuracy,
        "source_val_accuracy": report.source_val_accuracy,
        "train_loss": report.train_loss,
        "clients_selected": report.selected.len(),
        "clients_reported": report.reported.len(),
        "rejected": report.rejected.values().sum::<u64>(),
        "rejected_by_reason": report.rejected,
        "abandoned": report.abandoned,
        "capped": report.capped.len(),
        // Each delta the norm guard scaled down, with the bound it was held to: max_norm_ratio ×
        // the median norm of the round's other updates.
        "norm_clipped": report.norm_clipped.iter().map(|c| serde_json::json!({
            "client": c.client,
            "norm": c.norm,
            "bound": c.bound,
        })).collect::<Vec<_>>(),
        "bytes_up": report.bytes_up,
        "bytes_down": report.bytes_down,
        "seconds": report.duration_ms as f64 / 1000.0,
        "params_norm": report.params_norm,
        "time": fedge_mqtt::now_rfc3339(),
    });
    // Central DP: ε spent after this round at δ, and whether the budget finished the federation.
    if let (Some(spent), Some(map)) = (report.privacy, metrics.as_object_mut()) {
        map.insert("epsilon".into(), serde_json::json!(spent.epsilon));
        map.insert(
            "epsilon_amplified".into(),
            serde_json::json!(spent.amplified_epsilon),
        );
        map.insert(
            "most_selected_rounds".into(),
            serde_json::json!(spent.most_selected),
        );
        map.insert("delta".into(), serde_json::json!(spent.delta));
        if let Some(target) = spent.target_epsilon {
            map.insert("target_epsilon".into(), serde_json::json!(target));
        }
        if spent.exhausted {
            map.insert("privacy_budget_exhausted".into(), true.into());
        }
    }
    // Buffered: the version's updates by staleness (index: versions behind).
    if let (false, Some(map)) = (report.staleness.is_empty(), metrics.as_object_mut()) {
        map.insert("staleness".into(), serde_json::json!(report.staleness));
    }
    // What evaluation-only sites said of the latest model each scored.
    if let (false, Some(map)) = (site_accuracy.is_empty(), metrics.as_object_mut()) {
        map.insert("site_accuracy".into(), serde_json::json!(site_accuracy));
    }
    // Devices read their own entry to report a rejected update in their status.
    if let (false, Some(map)) = (report.failures.is_empty(), metrics.as_object_mut()) {
        map.insert("failures".into(), serde_json::json!(report.failures));
    }
    // FedOMG's Γ per client, its objective and λ, the momentum norm: flat keys next to the rest.
    if let (Some(aggregation), Some(map)) = (&report.aggregation, metrics.as_object_mut())
        && let Ok(serde_json::Value::Object(extra)) = serde_json::to_value(aggregation)
    {
        map.extend(extra);
        // Under central DP the exact count of clipped deltas is data about the devices that
        // no noise covers: kept for the round's report, never published.
        if report.privacy.is_some() {
            map.remove("dp_clipped");
        }
    }
    bound_metrics(&mut metrics, MAX_METRICS_BYTES);
    metrics
}

/// Largest metrics document: well inside the smallest packet limit fedge publishes with, so
/// that a round of thousands of clients never yields a message the broker or the client
/// refuses (rumqttc would retry it forever).
pub const MAX_METRICS_BYTES: usize = 64 * 1024;

/// Halves the per-client maps (`failures`, FedOMG's `gamma`) until the document fits in
/// `limit` bytes; `<key>_omitted` then says how many entries were left out (the largest Γ and
/// the first failures in client order are kept).
fn bound_metrics(metrics: &mut serde_json::Value, limit: usize) {
    let size = |m: &serde_json::Value| serde_json::to_vec(m).map_or(0, |v| v.len());
    while size(metrics) > limit {
        let Some(map) = metrics.as_object_mut() else {
            return;
        };
        let mut shrunk = false;
        for key in ["failures", "gamma"] {
            let Some(serde_json::Value::Object(entries)) = map.get_mut(key) else {
                continue;
            };
            if entries.is_empty() {
                continue;
            }
            let mut kept: Vec<(String, serde_json::Value)> =
                std::mem::take(entries).into_iter().collect();
            if key == "gamma" {
                let weight = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
                kept.sort_by(|a, b| weight(&b.1).total_cmp(&weight(&a.1)));
            }
            let omitted = kept.len() - kept.len() / 2;
            kept.truncate(kept.len() / 2);
            entries.extend(kept);
            let counter = format!("{key}_omitted");
            let before = map
                .get(&counter)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            map.insert(counter, (before + omitted as u64).into());
            shrunk = true;
        }
        if !shrunk {
            return;
        }
    }
}

/// A machine of a 4-parameter head aggregating as `aggregation`, three devices online (its
/// first round or version open): what the status and metrics tests read.
#[cfg(test)]
pub(super) fn three_online(aggregation: crate::buffer::AggregationConfig) -> Rounds {
    let config = crate::round::RoundConfig {
        rounds: 0,
        min_clients: 3,
        aggregation,
        ..Default::default()
    };
    let mut rounds = Rounds::new(config, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
    for client in ["d1", "d2", "d3"] {
        rounds.handle_client_status(client, true, 0);
    }
    rounds
}

/// A gated machine whose evaluation site scores the release served and a candidate: what the
/// status and metrics tests read.
#[cfg(test)]
pub(super) mod gated {
    use crate::round::{Output, Rounds};

    /// A gated machine of a 6-parameter head, trainers `a` and `b` online, and `eval` the
    /// evaluation site the gate listens to.
    pub fn machine() -> Rounds {
        let config = crate::round::RoundConfig {
            rounds: 0,
            min_clients: 2,
            min_updates: 2,
            classes: vec!["ok".into(), "scratch".into()],
            head: Some(fedge_wire::HeadConfig::new(1, 2).with_hidden(1)),
            ..Default::default()
        };
        let mut rounds = Rounds::new(config, Box::new(crate::strategy::FedAvg), vec![0.0; 6]);
        rounds.set_release_config(crate::release::ReleaseConfig {
            mode: crate::release::ReleaseMode::Gated,
            evaluators: vec!["eval".into()],
            ..Default::default()
        });
        for client in ["a", "b"] {
            rounds.handle_client_status(client, true, 0);
        }
        rounds
    }

    /// `a` and `b` send `step` for `round`; the release or candidate it made.
    pub fn released(rounds: &mut Rounds, round: u64, step: f32) -> fedge_wire::ModelRelease {
        use fedge_wire::{ClientUpdate, Message, TensorF32};
        for client in ["a", "b"] {
            let update = ClientUpdate {
                features: None,
                run: 0,
                round,
                client_id: client.into(),
                seq: round,
                num_samples: 10,
                delta: TensorF32::from_slice(&[step; 6]),
                metrics: Default::default(),
                class_stats: None,
                prototypes: None,
            };
            let frame = fedge_wire::encode(&Message::ClientUpdate(update));
            rounds.handle_packet(client, &frame, round * 10);
        }
        let mut made = None;
        while let Some(output) = rounds.poll_output() {
            if let Output::Release(r) | Output::Candidate(r) = output {
                made = Some(*r);
            }
        }
        made.expect("a release or a candidate")
    }

    /// `eval` says it got `right` of 1000 images right with `scored`, paired against the
    /// release `served` it got `served_right` right with.
    pub fn evaluates(
        rounds: &mut Rounds,
        scored: &fedge_wire::ModelRelease,
        right: u32,
        served: Option<(&fedge_wire::ModelRelease, u32)>,
    ) {
        let status = fedge_wire::EdgeStatus {
            client_id: "eval".into(),
            online: true,
            role: fedge_wire::Role::Evaluate,
            evaluation: Some(fedge_wire::SiteEvaluation {
                model_round: scored.round,
                accuracy: right as f32 / 1000.0,
                class_accuracy: Vec::new(),
                samples: 1000,
            }),
            evaluated: Some(scored.sha256_hex()),
            paired: served.map(|(served, served_right)| fedge_wire::PairedScore {
                against: served.sha256_hex(),
                samples: 1000,
                gained: right.saturating_sub(served_right),
                lost: served_right.saturating_sub(right),
            }),
            ..Default::default()
        };
        rounds.handle_edge_status("eval", &status, 100);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::AggregationReport;

    /// An update of `client` to `round` (a small delta).
    fn update(client: &str, round: u64) -> Vec<u8> {
        update_in(client, round, 0)
    }

    /// An update of `client` to `round` of `run`.
    fn update_in(client: &str, round: u64, run: u64) -> Vec<u8> {
        use fedge_wire::{ClientUpdate, LocalMetrics, Message, TensorF32};
        fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
            features: None,
            run,
            round,
            client_id: client.into(),
            seq: round,
            num_samples: 10,
            delta: TensorF32::from_slice(&[0.1, -0.2, 0.3, 0.0]),
            metrics: LocalMetrics {
                val_accuracy: 0.5,
                val_samples: 10,
                ..LocalMetrics::default()
            },
            class_stats: None,
            prototypes: None,
        }))
    }

    #[test]
    fn the_buffer_section_appears_in_buffered_mode_only() {
        use crate::buffer::AggregationConfig;
        let machine = three_online;
        let context = StatusContext::default();
        let synchronous = status_at(&machine(AggregationConfig::default()), None, &context);
        assert_eq!(synchronous.buffer, None);
        let json = serde_json::to_string(&synchronous).unwrap();
        assert!(!json.contains("buffer"), "{json}");

        let mut rounds = machine(AggregationConfig::buffered(2, 0, 0));
        let buffer = status_at(&rounds, None, &context).buffer.unwrap();
        assert_eq!(
            (buffer.version, buffer.fill, buffer.size, buffer.in_flight),
            (0, 0, 2, 3)
        );
        assert_eq!((buffer.concurrency, buffer.max_staleness), (0, 0));
        rounds.handle_packet("d1", &update("d1", 1), 10);
        let buffer = status_at(&rounds, None, &context).buffer.unwrap();
        assert_eq!((buffer.version, buffer.fill, buffer.in_flight), (0, 1, 2));
        // The second update publishes version 1; d3's task is now a version behind.
        rounds.handle_packet("d2", &update("d2", 1), 20);
        rounds.handle_packet("d3", &update("d3", 1), 30);
        let status = status_at(&rounds, None, &context);
        let buffer = status.buffer.clone().unwrap();
        assert_eq!((buffer.version, buffer.fill), (1, 0));
        assert_eq!((buffer.staleness, buffer.stale), (vec![2], 1));
        assert_eq!(status.rejected_updates["stale"], 1);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["buffer"]["size"], 2, "{json}");
    }

    #[test]
    fn after_a_new_run_the_status_counts_the_run_s_rounds_as_total_rounds_does() {
        use fedge_wire::control::Command;
        let config = crate::round::RoundConfig {
            rounds: 1,
            min_clients: 3,
            min_updates: 3,
            round_timeout_ms: 1_000,
            ..Default::default()
        };
        let mut rounds = Rounds::new(config, Box::new(crate::strategy::FedAvg), vec![0.0; 4]);
        for client in ["d1", "d2", "d3"] {
            rounds.handle_client_status(client, true, 0);
        }
        // Round 1 is abandoned (no quorum twice), round 2 aggregates: the run is over.
        rounds.handle_timeout(10_000);
        rounds.handle_timeout(100_000);
        let aggregate = |rounds: &mut Rounds, round: u64, now: u64| {
            let run = rounds.config().run;
            for client in ["d1", "d2", "d3"] {
                rounds.handle_packet(client, &update_in(client, round, run), now);
            }
        };
        aggregate(&mut rounds, 2, 100_010);
        let context = StatusContext::default();
        let status = status_at(&rounds, None, &context);
        assert_eq!((status.state.as_str(), status.round), ("finished", 2));
        assert_eq!(
            (status.aggregated_rounds, status.total_rounds),
            (Some(1), 1)
        );
        // A new run of 2 rounds: `total_rounds` counts aggregated rounds over every run.
        rounds.apply_control(&Command::NewRun { rounds: 2 }, 100_020);
        aggregate(&mut rounds, 3, 100_030);
        let status = status_at(&rounds, None, &context);
        assert_eq!((status.round, status.total_rounds), (4, 3), "{status:?}");
        assert_eq!(status.aggregated_rounds, Some(2));
        assert_eq!(status.run_first_round, Some(3));
        assert_eq!(
            (status.run_aggregated, status.run_rounds),
            (Some(1), Some(2))
        );
        assert_eq!(status.runs.len(), 1);
    }

    #[test]
    fn site_accuracy_is_the_served_release_s_and_a_held_candidate_s_is_apart() {
        use super::gated::{evaluates, machine, released};
        let mut rounds = machine();
        let first = released(&mut rounds, 1, 1.0);
        evaluates(&mut rounds, &first, 800, None);
        let bad = released(&mut rounds, 2, -30.0);
        evaluates(&mut rounds, &bad, 254, Some((&first, 800)));
        let status = status_at(&rounds, None, &StatusContext::default());
        let release = status.release.clone().unwrap();
        assert_eq!(release.gate.unwrap().outcome, fedge_wire::GateOutcome::Held);
        assert_eq!(release.serving.unwrap().round, 1);
        assert_eq!(release.candidate.unwrap().round, 2);
        // Devices serve round 1, which the site scored 80 %; the held candidate's 25.4 % is
        // said apart.
        assert_eq!(status.site_accuracy, [("eval".to_owned(), 0.8)].into());
        assert_eq!(
            status.candidate_accuracy,
            [("eval".to_owned(), 0.254)].into()
        );
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.contains(r#""site_accuracy":{"eval":0.8}"#), "{json}");
        assert!(
            json.contains(r#""candidate_accuracy":{"eval":0.254}"#),
            "{json}"
        );
    }

    #[test]
    fn the_status_carries_the_audit_head_after_each_append() {
        use crate::store::audit::{AuditLog, Event, FILE_NAME, verify};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let rounds = three_online(Default::default());
        let mut context = StatusContext::default();
        // No trail, or no line yet: no head, and no member in the JSON.
        assert!(!context.follow_audit(None));
        let mut audit = AuditLog::new(&path);
        assert!(!context.follow_audit(Some(&mut audit)));
        let json = serde_json::to_value(status_at(&rounds, None, &context)).unwrap();
        assert!(json.get("audit_head").is_none(), "{json}");
        for seq in 1..=2 {
            let event = Event::Revoked {
                client: format!("cam-{seq}"),
            };
            assert!(audit.record("coordinator", event));
            assert!(context.follow_audit(Some(&mut audit)), "the head moved");
            let json = serde_json::to_value(status_at(&rounds, None, &context)).unwrap();
            let head = verify(&path).unwrap().head().unwrap();
            assert_eq!(head.seq, seq);
            assert_eq!(
                json["audit_head"],
                serde_json::json!({"seq": seq, "sha256": head.sha256}),
                "{json}"
            );
        }
        assert!(!context.follow_audit(Some(&mut audit)), "no new line");
    }

    #[test]
    fn metrics_carry_gamma_objective_and_momentum_as_flat_keys() {
        let report = RoundReport {
            staleness: Vec::new(),
            round: 3,
            aggregated: true,
            abandoned: None,
            capped: Vec::new(),
            norm_clipped: Vec::new(),
            selected: vec!["a".into(), "b".into(), "c".into()],
            reported: vec!["a".into(), "b".into()],
            failures: [("c".to_string(), "bad_tag".to_string())].into(),
            rejected: Default::default(),
            bytes_up: 10,
            bytes_down: 20,
            duration_ms: 1500,
            source_val_accuracy: Some(0.5),
            train_loss: None,
            params_norm: 1.0,
            aggregation: Some(AggregationReport {
                gamma: [("a".to_string(), 0.25), ("b".to_string(), 0.75)].into(),
                objective: Some(0.8),
                lambda: Some(0.3),
                solver: Some("reference".into()),
                solver_evaluations: Some(21),
                momentum_norm: Some(2.0),
                ..AggregationReport::default()
            }),
            privacy: None,
        };
        let m = metrics_json(
            &report,
            Some(0.6),
            "fedomg+momentum",
            &[("site-75".to_owned(), 0.5)].into(),
        );
        assert_eq!(m["gamma"]["b"], 0.75);
        assert_eq!(m["fedomg_objective"], 0.8);
        assert_eq!(m["solver"], "reference");
        assert_eq!(m["momentum_norm"], 2.0);
        assert_eq!(m["round"], 3);
        assert_eq!(m["seconds"], 1.5);
        assert_eq!(m["failures"]["c"], "bad_tag");
        assert!(m.get("epsilon").is_none());
    }

    #[test]
    fn metrics_carry_the_privacy_spent() {
        let report = RoundReport {
            staleness: Vec::new(),
            round: 4,
            aggregated: true,
            abandoned: None,
            capped: Vec::new(),
            norm_clipped: Vec::new(),
            selected: vec!["a".into()],
            reported: vec!["a".into()],
            failures: Default::default(),
            rejected: Default::default(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 10,
            source_val_accuracy: None,
            train_loss: None,
            params_norm: 1.0,
            aggregation: Some(AggregationReport {
                dp_clipped: Some(1),
                dp_expected: Some(2.5),
                ..AggregationReport::default()
            }),
            privacy: Some(crate::round::PrivacySpent {
                epsilon: 1.25,
                amplified_epsilon: 0.5,
                most_selected: 3,
                delta: 1e-5,
                target_epsilon: Some(2.0),
                rounds: 4,
                exhausted: true,
            }),
        };
        let m = metrics_json(&report, None, "dp-fedavg", &Default::default());
        assert_eq!(m["epsilon"], 1.25);
        assert_eq!(m["epsilon_amplified"], 0.5);
        assert_eq!(m["most_selected_rounds"], 3);
        assert_eq!(m["delta"], 1e-5);
        assert_eq!(m["target_epsilon"], 2.0);
        assert_eq!(m["privacy_budget_exhausted"], true);
        assert!(
            m.get("dp_clipped").is_none(),
            "an exact count under central DP: {m}"
        );
        assert_eq!(m["dp_expected"], 2.5);
    }
}
