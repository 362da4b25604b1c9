//! Home Assistant MQTT discovery (opt-in, `home_assistant = true`): retained sensor configs
//! under `homeassistant/sensor/fedge_<federation>/<sensor>/config`, so the coordinator's round,
//! online clients, accuracies and rejected updates appear in Home Assistant without hand
//! configuration. Every sensor reads the retained coordinator status JSON; availability comes
//! from the same topic, whose Last Will says `"state": "offline"`.

use fedge_wire::Topics;
use serde_json::json;

/// Topic prefix Home Assistant listens on by default.
pub const DISCOVERY_PREFIX: &str = "homeassistant";

/// Where Home Assistant users find help (the `origin` block's `support_url`).
pub const SUPPORT_URL: &str = env!("CARGO_PKG_REPOSITORY");

/// (key in the status JSON, sensor name, unit, state class)
const SENSORS: [(&str, &str, Option<&str>, Option<&str>); 7] = [
    ("state", "state", None, None),
    ("round", "round", None, Some("measurement")),
    (
        "clients_online",
        "clients online",
        None,
        Some("measurement"),
    ),
    (
        "clients_reported",
        "clients reported",
        None,
        Some("measurement"),
    ),
    (
        "target_accuracy",
        "target accuracy",
        Some("%"),
        Some("measurement"),
    ),
    (
        "source_val_accuracy",
        "source validation accuracy",
        Some("%"),
        Some("measurement"),
    ),
    (
        "rejected_total",
        "rejected updates",
        None,
        Some("total_increasing"),
    ),
];

/// A federation name as a Home Assistant object id (`[a-zA-Z0-9_-]`).
fn object_id(federation: &str) -> String {
    federation
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A Home Assistant entity id's object part: lower-case letters, digits and `_` only.
fn entity_slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The retained discovery messages: (topic, JSON payload).
///
/// Each names its entity with `default_entity_id` (`sensor.<slug>`, which replaced the
/// deprecated `object_id`) and its publisher with an `origin` block.
pub fn discovery_messages(topics: &Topics, federation: &str) -> Vec<(String, String)> {
    let node = format!("fedge_{}", object_id(federation));
    let status = topics.coordinator_status();
    SENSORS
        .iter()
        .map(|(key, name, unit, class)| {
            let accuracy = *unit == Some("%");
            let template = if accuracy {
                format!("{{{{ (value_json.{key} * 100) | round(1) if value_json.{key} is number else none }}}}")
            } else {
                format!("{{{{ value_json.{key} }}}}")
            };
            let mut config = json!({
                "name": name,
                "unique_id": format!("{node}_{key}"),
                "default_entity_id": format!("sensor.{}", entity_slug(&format!("{node}_{key}"))),
                "state_topic": status,
                "value_template": template,
                "availability_topic": status,
                "availability_template":
                    "{{ 'offline' if value_json.state == 'offline' else 'online' }}",
                "json_attributes_topic": status,
                "device": {
                    "identifiers": [node],
                    "name": format!("fedge coordinator {federation}"),
                    "manufacturer": "fedge",
                    "model": "fedge-coordinator",
                    "sw_version": env!("CARGO_PKG_VERSION"),
                },
                "origin": {
                    "name": "fedge",
                    "sw_version": env!("CARGO_PKG_VERSION"),
                    "support_url": SUPPORT_URL,
                },
            });
            if let Some(map) = config.as_object_mut() {
                if let Some(unit) = unit {
                    map.insert("unit_of_measurement".into(), json!(unit));
                }
                if let Some(class) = class {
                    map.insert("state_class".into(), json!(class));
                }
            }
            (
                format!("{DISCOVERY_PREFIX}/sensor/{node}/{key}/config"),
                config.to_string(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_configs_have_the_documented_shape() {
        let topics = Topics::new("plant-7").unwrap();
        let messages = discovery_messages(&topics, "plant-7");
        assert_eq!(messages.len(), SENSORS.len());
        let mut ids = std::collections::BTreeSet::new();
        for (topic, payload) in &messages {
            let parts: Vec<&str> = topic.split('/').collect();
            assert_eq!(parts[0], "homeassistant");
            assert_eq!(parts[1], "sensor");
            assert_eq!(parts[2], "fedge_plant-7");
            assert_eq!(parts[4], "config");
            let v: serde_json::Value = serde_json::from_str(payload).unwrap();
            let id = v["unique_id"].as_str().unwrap();
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            );
            assert!(ids.insert(id.to_owned()), "unique ids: {id}");
            assert_eq!(v["state_topic"], "fedge/plant-7/coordinator/status");
            assert_eq!(v["availability_topic"], v["state_topic"]);
            assert!(v["value_template"].as_str().unwrap().contains(parts[3]));
            assert_eq!(v["device"]["identifiers"][0], "fedge_plant-7");
            assert!(v.get("object_id").is_none(), "deprecated key: {payload}");
            let entity = v["default_entity_id"].as_str().unwrap();
            assert_eq!(entity, format!("sensor.fedge_plant_7_{}", parts[3]));
            assert!(
                entity["sensor.".len()..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{entity}"
            );
            assert_eq!(v["origin"]["name"], "fedge");
            assert_eq!(v["origin"]["sw_version"], env!("CARGO_PKG_VERSION"));
            assert!(
                v["origin"]["support_url"]
                    .as_str()
                    .unwrap()
                    .starts_with("https://")
            );
        }
    }
}
