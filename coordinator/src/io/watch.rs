//! `fedge-coordinator watch`: a live terminal view of a federation's topics, for operators
//! without other MQTT tooling. It reads what dashboards read (the retained coordinator and
//! device statuses, the per-round metrics) and nothing else.
//!
//! Everything a device or the broker controls (client ids, profiles, errors, rejection
//! reasons, the coordinator's strings) goes through [`sanitize`] before it reaches the
//! terminal, so a hostile device cannot send escape sequences to the operator's terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use fedge_wire::{CoordinatorStatus, EdgeStatus, GateOutcome, Topics};

/// Rounds of metrics kept for the view.
const ROUNDS_SHOWN: usize = 8;

/// What the view knows.
#[derive(Debug, Clone, Default)]
pub struct WatchState {
    /// Last coordinator status.
    pub coordinator: Option<CoordinatorStatus>,
    /// Last status per device.
    pub devices: BTreeMap<String, EdgeStatus>,
    /// Last rounds' metrics, oldest first.
    pub rounds: Vec<serde_json::Value>,
}

impl WatchState {
    /// Takes one message; returns true when it concerned the federation.
    pub fn take(&mut self, topics: &Topics, topic: &str, payload: &[u8]) -> bool {
        if topic == topics.coordinator_status() {
            if let Ok(status) = serde_json::from_slice::<CoordinatorStatus>(payload) {
                self.coordinator = Some(status);
            } else if let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) {
                // The Last Will: {"state": "offline", ...}.
                let state = v["state"].as_str().unwrap_or("unknown").to_owned();
                let status = self.coordinator.get_or_insert_with(Default::default);
                status.state = state;
            }
            return true;
        }
        if topic == topics.metrics() {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) {
                self.rounds.push(v);
                let extra = self.rounds.len().saturating_sub(ROUNDS_SHOWN);
                self.rounds.drain(..extra);
            }
            return true;
        }
        if let Some(id) = topics.client_of_edge_status(topic) {
            if let Ok(status) = serde_json::from_slice::<EdgeStatus>(payload) {
                self.devices.insert(id.to_owned(), status);
            }
            return true;
        }
        false
    }
}

/// `text` with every control character (C0, DEL, C1: escape sequences, carriage returns,
/// bells, newlines) replaced by `?`, cut to `max` characters (with `…`), for one cell of the
/// view.
pub fn sanitize(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Longest text shown for one field.
const FIELD_CHARS: usize = 120;

fn clean(text: &str) -> String {
    sanitize(text, FIELD_CHARS)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// A staleness histogram as `s:count` pairs (`-` before the first version).
fn staleness(histogram: &[u64]) -> String {
    let pairs: Vec<String> = (histogram.iter().enumerate())
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{s}:{n}"))
        .collect();
    if pairs.is_empty() {
        "-".into()
    } else {
        pairs.join(" ")
    }
}

/// The first 12 hex digits of a release's SHA-256, as the status counts devices by them.
fn short(sha256: &str) -> String {
    clean(sha256.get(..12).unwrap_or(sha256))
}

/// `n` or `∞` for 0 (unbounded).
fn bound(n: u64) -> String {
    if n == 0 { "∞".into() } else { n.to_string() }
}

/// The mean of some accuracies, if any.
fn mean<'a>(values: impl IntoIterator<Item = &'a f32>) -> Option<f64> {
    let values: Vec<f64> = values.into_iter().map(|v| f64::from(*v)).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Most names listed in one line of the view.
const NAMES_SHOWN: usize = 8;

/// `site 61.0%, …` for the first [`NAMES_SHOWN`] sites, and how many more.
fn by_site(accuracy: &BTreeMap<String, f32>) -> String {
    let mut parts: Vec<String> = (accuracy.iter().take(NAMES_SHOWN))
        .map(|(site, a)| format!("{} {}", clean(site), pct(Some(f64::from(*a)))))
        .collect();
    if accuracy.len() > NAMES_SHOWN {
        parts.push(format!("{} more", accuracy.len() - NAMES_SHOWN));
    }
    parts.join(", ")
}

/// Where the current run stands: the status's own figures, or for an older coordinator what
/// the ended runs imply.
struct RunView {
    /// The run's number, counting from 1.
    number: usize,
    /// The round within the run (0 before its first opened).
    round: u64,
    /// Rounds it aggregated, when the status says.
    aggregated: Option<u64>,
    /// Rounds it aggregates in all (0: unbounded).
    length: u64,
}

fn run_view(s: &CoordinatorStatus) -> RunView {
    let before_runs = (s.runs.iter()).fold(0u64, |n, r| n.saturating_add(r.aggregated));
    let aggregated_total = s.aggregated_rounds.or(s.buffer.as_ref().map(|b| b.version));
    let before = match (aggregated_total, s.run_aggregated) {
        (Some(total), Some(run)) => total.saturating_sub(run),
        _ => before_runs,
    };
    let first = (s.run_first_round)
        .or(s.runs.last().map(|r| r.last_round.saturating_add(1)))
        .unwrap_or(1);
    let length = match (s.total_rounds, s.run_rounds) {
        (0, _) => 0,
        (_, Some(n)) => n,
        (total, None) => total.saturating_sub(before),
    };
    RunView {
        number: s.runs.len() + 1,
        round: s.round.saturating_add(1).saturating_sub(first),
        aggregated: s
            .run_aggregated
            .or(aggregated_total.map(|t| t.saturating_sub(before))),
        length,
    }
}

/// The coordinator's line: state, the run, the round within it and the rounds it aggregated
/// against its length (as `total_rounds` counts: aggregated rounds), and over every run once
/// there were several.
fn coordinator_line(out: &mut String, s: &CoordinatorStatus) {
    let run = run_view(s);
    let mut line = format!("coordinator: {} ({})", clean(&s.state), clean(&s.phase));
    if !s.run.is_empty() {
        let _ = write!(line, ", run {} ({})", run.number, clean(&s.run));
    }
    let _ = write!(line, ", round {}", run.round);
    match run.aggregated {
        Some(done) => {
            let _ = write!(line, ", aggregated {done}/{}", bound(run.length));
        }
        None => {
            let _ = write!(line, ", {} rounds to aggregate", bound(run.length));
        }
    }
    if run.number > 1 {
        let total = bound(s.total_rounds);
        let all = match s.aggregated_rounds {
            Some(done) => format!("{done}/{total} aggregated"),
            None => format!("{total} rounds to aggregate"),
        };
        let _ = write!(
            line,
            " (federation round {}, {all} over every run)",
            s.round
        );
    }
    let _ = writeln!(
        out,
        "{line}, strategy {}, objective {}",
        clean(&s.strategy),
        s.objective
    );
}

/// The accuracy line: the coordinator's own target, else what the evaluation sites say of the
/// release served; the candidate's apart.
fn accuracy_line(out: &mut String, s: &CoordinatorStatus) {
    let sites = mean(s.site_accuracy.values());
    let target = s.target_accuracy.map(f64::from).or(sites);
    let mut line = format!("accuracy: target {}", pct(target));
    if !s.site_accuracy.is_empty() {
        let _ = write!(
            line,
            " (release served, by site: {})",
            by_site(&s.site_accuracy)
        );
    }
    if !s.candidate_accuracy.is_empty() {
        let _ = write!(
            line,
            ", candidate {} (by site: {})",
            pct(mean(s.candidate_accuracy.values())),
            by_site(&s.candidate_accuracy)
        );
    }
    let _ = writeln!(
        out,
        "{line}; source validation {}; parameter norm {:.3}",
        pct(s.source_val_accuracy.map(f64::from)),
        s.params_norm
    );
}

/// The release served, the candidate and the stage; the gate's last verdict; the canary's
/// progress.
fn release_lines(out: &mut String, s: &CoordinatorStatus, devices: &BTreeMap<String, EdgeStatus>) {
    let Some(r) = &s.release else {
        return;
    };
    let named = |r: &fedge_wire::ReleaseRef| format!("round {} ({})", r.round, short(&r.sha256));
    let held = (r.gate.as_ref()).is_some_and(|g| g.outcome == GateOutcome::Held);
    let stage = if r.canary.is_some() {
        "canary"
    } else if r.pinned {
        "pinned by a rollback (ctl promote lets releases through)"
    } else if r.candidate.is_some() && held {
        "candidate held"
    } else if r.candidate.is_some() {
        "candidate at the gate"
    } else {
        "served by every device"
    };
    let mut line = format!(
        "release: {}, serving {}",
        clean(&r.mode),
        r.serving.as_ref().map_or("nothing yet".into(), named)
    );
    if let Some(c) = &r.candidate {
        let _ = write!(line, ", candidate {}", named(c));
    }
    let _ = write!(line, "; stage: {stage}");
    if !r.devices.is_empty() {
        let counts: Vec<String> = (r.devices.iter().take(NAMES_SHOWN))
            .map(|(sha, n)| format!("{} ×{n}", short(sha)))
            .collect();
        let _ = write!(line, "; devices {}", counts.join(", "));
    }
    let _ = writeln!(out, "{line}");
    if let Some(g) = &r.gate {
        let outcome = match g.outcome {
            GateOutcome::Waiting => "waiting",
            GateOutcome::Promoted => "promoted",
            GateOutcome::Held => "held",
        };
        let points = match (g.candidate_accuracy, g.serving_accuracy) {
            (Some(c), Some(v)) => format!(", {c:.1} against {v:.1} points on {} site(s)", g.sites),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "gate: {outcome} {}{points}: {}",
            named(&g.candidate),
            clean(&g.reason)
        );
    }
    if let Some(c) = &r.canary {
        let serving = r.devices.get(&short(&c.sha256)).copied().unwrap_or(0);
        let alarmed = (devices.values())
            .filter(|d| d.online && d.serving.as_deref() == Some(c.sha256.as_str()))
            .filter(|d| d.drift.as_ref().is_some_and(|a| a.alarms > 0))
            .count();
        let _ = writeln!(
            out,
            "canary: {} served by {serving} of {} canary device(s) until {}; {alarmed} of them alarmed",
            named(c),
            r.canary_devices,
            clean(r.canary_until.as_deref().unwrap_or("-"))
        );
    }
}

/// The drift alarms devices report about what they serve.
fn drift_line(out: &mut String, devices: &BTreeMap<String, EdgeStatus>) {
    let watching: Vec<(&String, &fedge_wire::DriftStatus)> = (devices.iter())
        .filter_map(|(id, d)| Some((id, d.drift.as_ref()?)))
        .collect();
    if watching.is_empty() {
        return;
    }
    let alarmed: Vec<String> = (watching.iter())
        .filter(|(_, d)| d.alarms > 0)
        .map(|(id, d)| {
            let last = d
                .last_alarm
                .as_deref()
                .map_or(String::new(), |t| format!(", last {}", clean(t)));
            format!("{} {} alarm(s){last}", clean(id), d.alarms)
        })
        .collect();
    if alarmed.is_empty() {
        let _ = writeln!(
            out,
            "drift: no alarm on {} device(s) watching",
            watching.len()
        );
        return;
    }
    let mut names = alarmed
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>();
    if alarmed.len() > NAMES_SHOWN {
        names.push(format!("{} more", alarmed.len() - NAMES_SHOWN));
    }
    let _ = writeln!(
        out,
        "drift: {} of {} device(s) watching alarmed: {}",
        alarmed.len(),
        watching.len(),
        names.join("; ")
    );
}

/// One row of the rounds table from a metrics document (`target`: the coordinator's own, else
/// the mean of the evaluation sites').
fn round_row(out: &mut String, r: &serde_json::Value) {
    let sites: Vec<f32> = (r["site_accuracy"].as_object().into_iter().flatten())
        .filter_map(|(_, a)| a.as_f64().map(|a| a as f32))
        .collect();
    let target = r["target_accuracy"].as_f64().or(mean(&sites));
    let _ = writeln!(
        out,
        "{:5}  {:>6}  {:>10}  {:>4}/{:<3}  {:7.2}  {:5.2}  {:7.2}",
        r["round"].as_u64().unwrap_or(0),
        pct(target),
        pct(r["source_val_accuracy"].as_f64()),
        r["clients_reported"].as_u64().unwrap_or(0),
        r["clients_selected"].as_u64().unwrap_or(0),
        r["seconds"].as_f64().unwrap_or(f64::NAN),
        r["bytes_up"].as_f64().unwrap_or(0.0) / 1e6,
        r["bytes_down"].as_f64().unwrap_or(0.0) / 1e6,
    );
}

/// The last round the status speaks of when no metrics came while watching (metrics are not
/// retained): the round that closed last, with the accuracies the status holds.
fn status_row(out: &mut String, s: &CoordinatorStatus) {
    let closed = if s.state == "training" {
        s.round.saturating_sub(1)
    } else {
        s.round
    };
    if closed == 0 {
        return;
    }
    let target = s
        .target_accuracy
        .map(f64::from)
        .or(mean(s.site_accuracy.values()));
    let _ = writeln!(
        out,
        "{closed:5}  {:>6}  {:>10}  {:>8}  {:>7}  {:>5}  {:>7}   (from the status: no round ended while watching)",
        pct(target),
        pct(s.source_val_accuracy.map(f64::from)),
        "-",
        "-",
        "-",
        "-",
    );
}

/// The view as text (no terminal control codes).
pub fn render(state: &WatchState, federation: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "fedge federation {}", clean(federation));
    match &state.coordinator {
        None => {
            let _ = writeln!(out, "coordinator: no status yet");
        }
        Some(s) => {
            coordinator_line(&mut out, s);
            let _ = writeln!(
                out,
                "clients: {} online, {} selected, {} reported; deadline {}; last aggregation {}",
                s.clients_online,
                s.clients_selected,
                s.clients_reported,
                clean(s.deadline.as_deref().unwrap_or("-")),
                clean(s.last_aggregation.as_deref().unwrap_or("-")),
            );
            if let Some(b) = &s.buffer {
                let _ = writeln!(
                    out,
                    "buffered: version {} · buffer {}/{} · in flight {} · stale {} · staleness {}",
                    b.version,
                    b.fill,
                    b.size,
                    b.in_flight,
                    b.stale,
                    staleness(&b.staleness)
                );
            }
            accuracy_line(&mut out, s);
            let reasons: Vec<String> = s
                .rejected_updates
                .iter()
                .map(|(k, v)| format!("{} {v}", clean(k)))
                .collect();
            let _ = writeln!(
                out,
                "rejected updates: {}{}",
                s.rejected_total,
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reasons.join(", "))
                }
            );
            let runs: Vec<String> = (s.runs.iter().rev().take(3).rev())
                .map(|r| {
                    format!(
                        "{} rounds {}–{} ({} aggregated)",
                        clean(&r.run),
                        r.first_round,
                        r.last_round,
                        r.aggregated
                    )
                })
                .collect();
            if !runs.is_empty() {
                let _ = writeln!(out, "earlier runs: {}", runs.join("; "));
            }
            release_lines(&mut out, s, &state.devices);
        }
    }
    drift_line(&mut out, &state.devices);
    let _ = writeln!(
        out,
        "\nround  target  source val  reported  seconds  MB up  MB down"
    );
    for r in &state.rounds {
        round_row(&mut out, r);
    }
    if let (true, Some(s)) = (state.rounds.is_empty(), &state.coordinator) {
        status_row(&mut out, s);
    }
    let _ = writeln!(
        out,
        "\ndevice                online  profile           samples  last round  serving       drift  last error"
    );
    for (id, d) in &state.devices {
        let serving = (d.serving.as_deref().map(short))
            .or(d.model_round.map(|r| format!("round {r}")))
            .unwrap_or_else(|| "-".into());
        let drift = d
            .drift
            .as_ref()
            .map_or("-".into(), |d| d.alarms.to_string());
        let _ = writeln!(
            out,
            "{:<21} {:<7} {:<17} {:>7}  {:>10}  {:<12}  {:>5}  {}",
            clean(id),
            if d.online { "yes" } else { "NO" },
            clean(&d.profile),
            d.samples,
            d.last_round,
            serving,
            drift,
            clean(&d.last_error)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_shows_status_rounds_and_devices_and_the_last_will() {
        let topics = Topics::new("plant").unwrap();
        let mut state = WatchState::default();
        let status = CoordinatorStatus {
            state: "training".into(),
            phase: "collecting".into(),
            round: 3,
            total_rounds: 10,
            strategy: "fedomg".into(),
            objective: fedge_wire::Objective::FedDim,
            clients_online: 2,
            rejected_updates: [("bad_tag".to_string(), 2)].into(),
            rejected_total: 2,
            target_accuracy: Some(0.5),
            ..Default::default()
        };
        assert!(state.take(
            &topics,
            &topics.coordinator_status(),
            &serde_json::to_vec(&status).unwrap()
        ));
        let metrics = br#"{"round": 2, "target_accuracy": 0.41, "clients_reported": 2, "clients_selected": 2, "seconds": 1.5, "bytes_up": 2000000, "bytes_down": 1000000}"#;
        assert!(state.take(&topics, &topics.metrics(), metrics));
        let device = EdgeStatus {
            client_id: "cam-1".into(),
            online: false,
            last_error: "round 2: bad_tag".into(),
            ..Default::default()
        };
        assert!(state.take(
            &topics,
            &topics.edge_status("cam-1"),
            &serde_json::to_vec(&device).unwrap()
        ));
        assert!(!state.take(&topics, "other/topic", b"{}"));
        let text = render(&state, "plant");
        assert!(!text.contains("buffered"), "synchronous: {text}");
        let buffered = br#"{"state":"training","round":8,"total_rounds":0,"strategy":"fedavg","clients_online":5,"clients_selected":5,"clients_reported":3,"rejected_updates":{"stale":1},"rejected_total":1,"target_accuracy":null,"source_val_accuracy":null,"params_norm":1.0,"updated_at":"x","buffer":{"version":7,"fill":3,"size":10,"in_flight":4,"concurrency":0,"max_staleness":4,"staleness":[40,0,22],"stale":1}}"#;
        state.take(&topics, &topics.coordinator_status(), buffered);
        let view = render(&state, "plant");
        assert!(
            view.contains(
                "buffered: version 7 · buffer 3/10 · in flight 4 · stale 1 · staleness 0:40 2:22"
            ),
            "{view}"
        );
        state.take(
            &topics,
            &topics.coordinator_status(),
            &serde_json::to_vec(&status).unwrap(),
        );
        for needle in [
            "round 3, 10 rounds to aggregate",
            "fedomg",
            "bad_tag 2",
            "41.0%",
            "cam-1",
            "NO",
            "round 2: bad_tag",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        state.take(
            &topics,
            &topics.coordinator_status(),
            br#"{"state":"offline","updated_at":"x"}"#,
        );
        assert!(render(&state, "plant").contains("coordinator: offline"));
    }

    /// The view of `status` (JSON), with no metrics and no device.
    fn view_of(status: &str) -> String {
        let topics = Topics::new("plant").unwrap();
        let mut state = WatchState::default();
        assert!(state.take(&topics, &topics.coordinator_status(), status.as_bytes()));
        render(&state, "plant")
    }

    #[test]
    fn after_a_new_run_the_view_counts_the_run_s_rounds_as_its_length_does() {
        // Run 1 ended at round 23 with 20 rounds aggregated (3 abandoned); `new-run 4` made the
        // total 24 aggregated rounds; round 27 is open with 3 of the run's 4 aggregated.
        let status = r#"{"state":"training","phase":"collecting","run":"00000000000000ff","round":27,"total_rounds":24,"strategy":"fedavg","clients_online":3,"clients_selected":3,"clients_reported":1,"rejected_updates":{},"rejected_total":0,"target_accuracy":null,"source_val_accuracy":null,"params_norm":1.0,"updated_at":"x","runs":[{"run":"00000000000000aa","first_round":1,"last_round":23,"aggregated":20}],"aggregated_rounds":23,"run_first_round":24,"run_aggregated":3,"run_rounds":4}"#;
        let view = view_of(status);
        assert!(
            view.contains(
                "run 2 (00000000000000ff), round 4, aggregated 3/4 (federation round 27, \
                 23/24 aggregated over every run)"
            ),
            "{view}"
        );
        assert!(!view.contains("27/24"), "{view}");
        assert!(
            view.contains("earlier runs: 00000000000000aa rounds 1–23 (20 aggregated)"),
            "{view}"
        );
        // An older coordinator's status, without the run's figures: what its runs imply.
        let older: serde_json::Value = serde_json::from_str(status).unwrap();
        let mut older = older.as_object().unwrap().clone();
        for key in [
            "aggregated_rounds",
            "run_first_round",
            "run_aggregated",
            "run_rounds",
        ] {
            older.remove(key);
        }
        let view = view_of(&serde_json::Value::Object(older.clone()).to_string());
        assert!(
            view.contains(
                "round 4, 4 rounds to aggregate (federation round 27, 24 rounds to aggregate \
                 over every run)"
            ),
            "{view}"
        );
        assert!(!view.contains("27/24"), "{view}");
        // Numbers at their limits (whoever may write the status topic) do not overflow.
        older.insert("round".into(), u64::MAX.into());
        older.insert("total_rounds".into(), u64::MAX.into());
        older["runs"][0]["last_round"] = u64::MAX.into();
        older["runs"][0]["aggregated"] = u64::MAX.into();
        let view = view_of(&serde_json::Value::Object(older).to_string());
        assert!(view.contains("coordinator: training"), "{view}");
    }

    #[test]
    fn without_metrics_the_rounds_table_shows_the_round_the_status_holds() {
        // What `watch --once` sees: the retained status only (metrics are not retained); the
        // coordinator has no evaluation set, an evaluation site scores the release served.
        let view = view_of(
            r#"{"state":"training","phase":"collecting","round":5,"total_rounds":10,"strategy":"fedavg","clients_online":3,"clients_selected":3,"clients_reported":0,"rejected_updates":{},"rejected_total":0,"target_accuracy":null,"site_accuracy":{"unseen":0.61},"source_val_accuracy":0.7,"params_norm":1.0,"updated_at":"x","aggregated_rounds":4,"run_first_round":1,"run_aggregated":4,"run_rounds":10}"#,
        );
        let table = view.split("round  target").nth(1).unwrap();
        let row = table.lines().nth(1).unwrap();
        assert!(row.starts_with("    4   61.0%       70.0%"), "{view}");
        assert!(
            view.contains("accuracy: target 61.0% (release served, by site: unseen 61.0%)"),
            "{view}"
        );
        assert!(view.contains("round 5, aggregated 4/10"), "{view}");
        // A metrics document that came while watching takes the row's place, its target the
        // sites' mean when the coordinator has none.
        let topics = Topics::new("plant").unwrap();
        let mut state = WatchState::default();
        let metrics = br#"{"round": 6, "target_accuracy": null, "site_accuracy": {"a": 0.5, "b": 0.7}, "clients_reported": 3, "clients_selected": 3, "seconds": 1.0, "bytes_up": 0, "bytes_down": 0}"#;
        state.take(&topics, &topics.metrics(), metrics);
        let view = render(&state, "plant");
        assert!(view.contains("    6   60.0%"), "{view}");
    }

    #[test]
    fn the_view_shows_the_release_the_gate_the_canary_and_the_drift_alarms() {
        let (served, candidate, canary) = ("7f".repeat(32), "cb".repeat(32), "ca".repeat(32));
        let status = serde_json::json!({
            "state": "training", "phase": "collecting", "round": 15, "total_rounds": 0,
            "strategy": "fedavg", "clients_online": 5, "clients_selected": 3,
            "clients_reported": 0, "rejected_updates": {}, "rejected_total": 0,
            "target_accuracy": null, "source_val_accuracy": null, "params_norm": 1.0,
            "updated_at": "x",
            "site_accuracy": {"unseen": 0.61}, "candidate_accuracy": {"unseen": 0.254},
            "release": {
                "mode": "gated",
                "serving": {"sha256": served, "round": 12},
                "candidate": {"sha256": candidate, "round": 14},
                "canary": {"sha256": canary, "round": 13},
                "canary_devices": 3, "canary_until": "2026-11-23T10:00:00.000Z",
                "pinned": false,
                "gate": {
                    "candidate": {"sha256": candidate, "round": 14}, "outcome": "held",
                    "sites": 1, "candidate_accuracy": 25.4, "serving_accuracy": 61.0,
                    "reason": "worse at 1 of 1 site(s)"
                },
                "devices": {"7f7f7f7f7f7f": 3, "cacacacacaca": 2}
            }
        });
        let topics = Topics::new("plant").unwrap();
        let mut state = WatchState::default();
        state.take(
            &topics,
            &topics.coordinator_status(),
            status.to_string().as_bytes(),
        );
        let drift = |alarms| fedge_wire::DriftStatus {
            level: 0.5,
            alarms,
            last_alarm: (alarms > 0).then(|| "2026-11-23T09:58:00.000Z".into()),
            requests: 100,
            reference: 50,
            adaptations: 0,
            last_adapted: None,
        };
        for (id, sha, alarms) in [
            ("cam-1", &canary, 3),
            ("cam-2", &canary, 0),
            ("cam-3", &served, 0),
        ] {
            let device = EdgeStatus {
                client_id: id.into(),
                online: true,
                serving: Some(sha.clone()),
                drift: Some(drift(alarms)),
                ..Default::default()
            };
            let json = serde_json::to_vec(&device).unwrap();
            state.take(&topics, &topics.edge_status(id), &json);
        }
        let view = render(&state, "plant");
        for needle in [
            "accuracy: target 61.0% (release served, by site: unseen 61.0%), candidate 25.4% \
             (by site: unseen 25.4%)",
            "release: gated, serving round 12 (7f7f7f7f7f7f), candidate round 14 \
             (cbcbcbcbcbcb); stage: canary; devices 7f7f7f7f7f7f ×3, cacacacacaca ×2",
            "gate: held round 14 (cbcbcbcbcbcb), 25.4 against 61.0 points on 1 site(s): worse \
             at 1 of 1 site(s)",
            "canary: round 13 (cacacacacaca) served by 2 of 3 canary device(s) until \
             2026-11-23T10:00:00.000Z; 1 of them alarmed",
            "drift: 1 of 3 device(s) watching alarmed: cam-1 3 alarm(s), last \
             2026-11-23T09:58:00.000Z",
            "round 15, ∞ rounds to aggregate",
        ] {
            let needle = needle.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(view.contains(&needle), "{needle:?} missing from\n{view}");
        }
        let cam1 = view.lines().find(|l| l.starts_with("cam-1")).unwrap();
        assert!(
            cam1.contains("cacacacacaca") && cam1.contains("    3"),
            "{cam1}"
        );
    }

    #[test]
    fn device_controlled_strings_reach_the_terminal_without_control_characters() {
        assert_eq!(
            sanitize("cam\x1b[2J\x07\r\n\u{9b}31m", 50),
            "cam?[2J????31m"
        );
        assert_eq!(sanitize("abcdef", 3), "abc…");
        assert_eq!(sanitize("é ü ∞", 10), "é ü ∞");
        let topics = Topics::new("plant").unwrap();
        let mut state = WatchState::default();
        let hostile = "\x1b[2J\x1b]0;pwned\x07";
        let device = EdgeStatus {
            client_id: "cam-1".into(),
            profile: hostile.into(),
            last_error: format!("round 2: {hostile}"),
            ..Default::default()
        };
        state.take(
            &topics,
            &topics.edge_status("cam-1"),
            &serde_json::to_vec(&device).unwrap(),
        );
        let status = CoordinatorStatus {
            state: hostile.into(),
            phase: hostile.into(),
            strategy: hostile.into(),
            deadline: Some(hostile.into()),
            rejected_updates: [(hostile.to_string(), 1)].into(),
            ..Default::default()
        };
        state.take(
            &topics,
            &topics.coordinator_status(),
            &serde_json::to_vec(&status).unwrap(),
        );
        let text = render(&state, "plant\x1b[31m");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "control characters in\n{text:?}"
        );
        assert!(text.contains("?[2J?]0;pwned?"), "{text}");
        // The Last Will path takes any JSON string too.
        state.take(
            &topics,
            &topics.coordinator_status(),
            br#"{"state":"\u001b[2Joffline"}"#,
        );
        assert!(render(&state, "plant").contains("coordinator: ?[2Joffline"));
    }
}
