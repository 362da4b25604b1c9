//! `fedge-coordinator watch`: a live terminal view of a federation's topics, for operators
//! without other MQTT tooling. It reads what dashboards read (the retained coordinator and
//! device statuses, the per-round metrics) and nothing else.
//!
//! Everything a device or the broker controls (client ids, profiles, errors, rejection
//! reasons, the coordinator's strings) goes through [`sanitize`] before it reaches the
//! terminal, so a hostile device cannot send escape sequences to the operator's terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use fedge_wire::{CoordinatorStatus, EdgeStatus, Topics};

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

/// The view as text (no terminal control codes).
pub fn render(state: &WatchState, federation: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "fedge federation {}", clean(federation));
    match &state.coordinator {
        None => {
            let _ = writeln!(out, "coordinator: no status yet");
        }
        Some(s) => {
            let total = if s.total_rounds == 0 {
                "∞".to_owned()
            } else {
                s.total_rounds.to_string()
            };
            let _ = writeln!(
                out,
                "coordinator: {} ({}), round {}/{}, strategy {}, objective {}",
                clean(&s.state),
                clean(&s.phase),
                s.round,
                total,
                clean(&s.strategy),
                s.objective
            );
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
            let _ = writeln!(
                out,
                "accuracy: target {}, source validation {}; parameter norm {:.3}",
                pct(s.target_accuracy.map(f64::from)),
                pct(s.source_val_accuracy.map(f64::from)),
                s.params_norm
            );
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
        }
    }
    let _ = writeln!(
        out,
        "\nround  target  source val  reported  seconds  MB up  MB down"
    );
    for r in &state.rounds {
        let _ = writeln!(
            out,
            "{:5}  {:>6}  {:>10}  {:>4}/{:<3}  {:7.2}  {:5.2}  {:7.2}",
            r["round"].as_u64().unwrap_or(0),
            pct(r["target_accuracy"].as_f64()),
            pct(r["source_val_accuracy"].as_f64()),
            r["clients_reported"].as_u64().unwrap_or(0),
            r["clients_selected"].as_u64().unwrap_or(0),
            r["seconds"].as_f64().unwrap_or(f64::NAN),
            r["bytes_up"].as_f64().unwrap_or(0.0) / 1e6,
            r["bytes_down"].as_f64().unwrap_or(0.0) / 1e6,
        );
    }
    let _ = writeln!(
        out,
        "\ndevice                online  profile           samples  last round  last error"
    );
    for (id, d) in &state.devices {
        let _ = writeln!(
            out,
            "{:<21} {:<7} {:<17} {:>7}  {:>10}  {}",
            clean(id),
            if d.online { "yes" } else { "NO" },
            clean(&d.profile),
            d.samples,
            d.last_round,
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
            "round 3/10",
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
