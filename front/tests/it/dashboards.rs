//! The dashboard topics as an operator's tools see them: a short federation over mosquitto,
//! read with `mosquitto_sub` (the real client, not ours); every document is checked against
//! the JSON Schemas in docs/schemas and for consistency; the examples in docs/ parse, match
//! the schemas and name only topics that exist.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fedge::demo::DemoOptions;
use serde_json::Value;

use crate::common;

fn docs() -> PathBuf {
    common::repo_root().join("docs")
}

fn schema(name: &str) -> Value {
    let path = docs().join("schemas").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The subset of JSON Schema the documented schemas use: type (with nullable unions),
/// required, properties, additionalProperties, enum, minimum.
fn validate(value: &Value, schema: &Value, at: &str, errors: &mut Vec<String>) {
    let type_ok = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_u64() || value.is_i64(),
        "number" => value.is_number(),
        "null" => value.is_null(),
        _ => false,
    };
    match &schema["type"] {
        Value::String(t) if !type_ok(t) => errors.push(format!("{at}: not a {t}: {value}")),
        Value::Array(ts) if !ts.iter().any(|t| type_ok(t.as_str().unwrap_or(""))) => {
            errors.push(format!("{at}: none of {ts:?}: {value}"))
        }
        _ => {}
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        errors.push(format!("{at}: {value} not in {options:?}"));
    }
    if let (Some(min), Some(v)) = (schema["minimum"].as_f64(), value.as_f64())
        && v < min
    {
        errors.push(format!("{at}: {v} below {min}"));
    }
    let Some(object) = value.as_object() else {
        return;
    };
    for key in schema["required"].as_array().into_iter().flatten() {
        let key = key.as_str().unwrap();
        if !object.contains_key(key) {
            errors.push(format!("{at}: missing {key}"));
        }
    }
    for (key, v) in object {
        if let Some(sub) = schema["properties"].get(key) {
            validate(v, sub, &format!("{at}.{key}"), errors);
        } else if schema["additionalProperties"].is_object() {
            validate(
                v,
                &schema["additionalProperties"],
                &format!("{at}.{key}"),
                errors,
            );
        } else if schema["properties"].is_object() {
            errors.push(format!("{at}: undocumented field {key}"));
        }
    }
}

fn check(value: &Value, schema_name: &str, what: &str) {
    let mut errors = Vec::new();
    validate(value, &schema(schema_name), what, &mut errors);
    assert!(
        errors.is_empty(),
        "{what} against {schema_name}: {errors:#?}"
    );
}

/// Topics and filters the documented tree has (`<x>` is one level).
fn topic_exists(topic: &str) -> bool {
    let parts: Vec<&str> = topic.split('/').collect();
    let level = |s: &str| !s.is_empty() && (s == "+" || !s.contains(['+', '#']));
    match parts.as_slice() {
        ["fedge", f, "coordinator", "status" | "control"] | ["fedge", f, "metrics"] => level(f),
        ["fedge", f, "#"] => level(f),
        ["fedge", f, "edge", c, "status" | "update"] => level(f) && level(c),
        [
            "fedge",
            f,
            "edge",
            c,
            "infer" | "enrol",
            "request" | "response",
        ] => level(f) && level(c),
        ["fedge", f, "round", "task"] | ["fedge", f, "round", "#"] => level(f),
        ["fedge", f, "round", "task", i] => level(f) && level(i),
        ["fedge", f, "model", "current" | "candidate" | "serving"] | ["fedge", f, "model", "#"] => {
            level(f)
        }
        ["fedge", f, "model", "current" | "candidate", i] => level(f) && level(i),
        ["fedge", f, "backbone", "current"] => level(f),
        ["fedge", f, "backbone", sha] => level(f) && level(sha),
        ["fedge", f, "backbone", sha, i] => level(f) && level(sha) && level(i),
        ["homeassistant", "#"] => true,
        [
            "homeassistant",
            "sensor" | "binary_sensor",
            node,
            key,
            "config",
        ] => level(node) && level(key),
        _ => false,
    }
}

fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[test]
fn every_example_in_docs_parses_matches_its_schema_and_names_real_topics() {
    let mut json_files = Vec::new();
    for dir in [docs(), docs().join("schemas")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                json_files.push(path);
            }
        }
    }
    assert!(json_files.len() >= 6, "{json_files:?}");
    for path in &json_files {
        let value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut found = Vec::new();
        strings(&value, &mut found);
        for s in found
            .iter()
            .filter(|s| s.starts_with("fedge/") || s.starts_with("homeassistant/"))
        {
            assert!(
                topic_exists(s),
                "{} names a topic that does not exist: {s}",
                path.display()
            );
        }
    }
    // The JSON examples of docs/mqtt-topics.md, in order: status, metrics, a training device,
    // an evaluation-only device, a serving pointer, a prediction request and its response, an
    // operator command,
    // an enrolment request and its response, discovery.
    let text = std::fs::read_to_string(docs().join("mqtt-topics.md")).unwrap();
    let blocks: Vec<Value> = text
        .split("```json")
        .skip(1)
        .map(|b| serde_json::from_str(b.split("```").next().unwrap()).unwrap())
        .collect();
    let schemas = [
        "coordinator-status.schema.json",
        "metrics.schema.json",
        "edge-status.schema.json",
        "edge-status.schema.json",
        "serving-pointer.schema.json",
        "infer-request.schema.json",
        "infer-response.schema.json",
        "control.schema.json",
        "enrol-request.schema.json",
        "enrol-response.schema.json",
        "ha-discovery.schema.json",
    ];
    assert_eq!(blocks.len(), schemas.len());
    for (block, name) in blocks.iter().zip(schemas) {
        check(block, name, "docs/mqtt-topics.md example");
    }
    for topic in text
        .split('`')
        // A span ending in `/` is a prefix, not a topic.
        .filter(|s| !s.ends_with('/'))
        .filter(|s| s.starts_with("fedge/") || s.starts_with("homeassistant/"))
    {
        let topic = topic.split_whitespace().next().unwrap();
        let generic = topic
            .replace("<f>", "f")
            .replace("<client>", "c")
            .replace("<i>", "0");
        let generic = generic.replace("<federation>", "f").replace("<key>", "k");
        let generic = generic.replace("fedge_f", "fedge_x");
        assert!(topic_exists(&generic), "docs/mqtt-topics.md names {topic}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federation_s_topics_read_with_mosquitto_sub_match_the_schemas_and_agree() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port().to_string();
    let sub = |extra: &[&str]| {
        Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-v", "-q", "1"])
            .args([
                "-t",
                "fedge/dash/coordinator/status",
                "-t",
                "fedge/dash/metrics",
            ])
            .args(["-t", "fedge/dash/edge/+/status", "-t", "homeassistant/#"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub (apt-get install mosquitto-clients)")
    };
    let live = sub(&[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let options = DemoOptions {
        home_assistant: true,
        strategy: fedge_coordinator::strategy::StrategyConfig {
            strategy: fedge_coordinator::strategy::StrategyKind::Fedomg,
            ..Default::default()
        },
        ..common::demo_options(Some(mosquitto.broker()), "dash")
    };
    let result = common::run_demo(&options).await;
    assert_eq!(result.rounds.len(), 3);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut live = live;
    let _ = live.kill();
    let live = live.wait_with_output().unwrap();
    // What a tool connecting now sees: the retained documents only.
    let retained = sub(&["--retained-only", "-W", "3"])
        .wait_with_output()
        .unwrap();

    let parse = |bytes: &[u8]| -> Vec<(String, Value)> {
        String::from_utf8_lossy(bytes)
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(t, p)| {
                (
                    t.to_owned(),
                    serde_json::from_str(p).unwrap_or_else(|e| panic!("{t}: {e}: {p}")),
                )
            })
            .collect()
    };
    let live = parse(&live.stdout);
    let retained = parse(&retained.stdout);

    let mut metrics_rounds = Vec::new();
    let mut status_rounds = Vec::new();
    for (topic, value) in &live {
        match topic.as_str() {
            "fedge/dash/metrics" => {
                check(value, "metrics.schema.json", topic);
                metrics_rounds.push(value["round"].as_u64().unwrap());
                assert!(value["clients_reported"].as_u64() <= value["clients_selected"].as_u64());
                let gamma: f64 = value["gamma"]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|g| g.as_f64().unwrap())
                    .sum();
                assert!((gamma - 1.0).abs() < 1e-6, "Γ sums to {gamma}");
            }
            "fedge/dash/coordinator/status" => {
                check(value, "coordinator-status.schema.json", topic);
                status_rounds.push(value["round"].as_u64().unwrap());
                assert!(value["clients_reported"].as_u64() <= value["clients_selected"].as_u64());
                assert_eq!(value["federation"], "dash");
            }
            t if t.starts_with("fedge/dash/edge/") => check(value, "edge-status.schema.json", t),
            t if t.starts_with("homeassistant/") => check(value, "ha-discovery.schema.json", t),
            other => panic!("unexpected topic {other}"),
        }
    }
    assert_eq!(metrics_rounds, [1, 2, 3]);
    assert!(
        status_rounds.windows(2).all(|w| w[0] <= w[1]),
        "{status_rounds:?}"
    );

    let find = |topic: &str| {
        retained
            .iter()
            .find(|(t, _)| t == topic)
            .map(|(_, v)| v.clone())
    };
    let status = find("fedge/dash/coordinator/status").expect("retained coordinator status");
    assert_eq!(
        (status["state"].as_str(), status["round"].as_u64()),
        (Some("finished"), Some(3))
    );
    let (trainers, unseen): (Vec<_>, Vec<_>) = retained
        .iter()
        .filter(|(t, _)| t.starts_with("fedge/dash/edge/"))
        .partition(|(_, d)| d["role"] == "train");
    // The held-out domain's evaluation-only agent scored the last release, as the demo says.
    let [(topic, site)] = unseen.as_slice() else {
        panic!("{unseen:?}");
    };
    assert_eq!(topic, "fedge/dash/edge/unseen-rot75/status");
    assert_eq!(site["evaluation"]["model_round"], 3);
    let last = result.final_target_accuracy.unwrap();
    let scored = site["evaluation"]["accuracy"].as_f64().unwrap();
    assert_eq!(
        scored as f32, last,
        "the JSON carries the f32's shortest digits"
    );
    assert_eq!(trainers.len(), 3);
    for (topic, device) in trainers {
        assert_eq!(device["online"], false, "{topic}: agents stopped");
        assert_eq!(device["last_round"], 3, "{topic}");
        assert_eq!(device["last_error"], "", "{topic}");
    }
    let discovery: Vec<_> = retained
        .iter()
        .filter(|(t, _)| t.starts_with("homeassistant/"))
        .collect();
    // The coordinator's 9 sensors (2 of them buffered aggregation's, unknown in rounds), and
    // 8 entities for each of the 3 devices and the evaluation-only site, each read from the
    // topic its node names.
    assert_eq!(discovery.len(), 9 + 4 * 8, "{discovery:?}");
    let mut ids = std::collections::BTreeSet::new();
    let mut by_state = std::collections::BTreeMap::<String, usize>::new();
    for (topic, config) in discovery {
        assert!(topic_exists(topic), "{topic}");
        assert!(ids.insert(config["unique_id"].as_str().unwrap().to_owned()));
        *by_state
            .entry(config["state_topic"].as_str().unwrap().to_owned())
            .or_default() += 1;
        assert_eq!(
            config["availability_topic"],
            "fedge/dash/coordinator/status"
        );
    }
    let mut expected =
        std::collections::BTreeMap::from([("fedge/dash/coordinator/status".to_owned(), 9)]);
    for (topic, _) in retained
        .iter()
        .filter(|(t, _)| t.starts_with("fedge/dash/edge/"))
    {
        expected.insert(topic.clone(), 8);
    }
    assert_eq!(by_state, expected);
    let site = "homeassistant/sensor/fedge_dash/unseen-rot75_site_accuracy/config";
    assert!(
        find(site).is_some(),
        "the evaluation-only site's accuracy entity"
    );
}
