//! Home Assistant MQTT discovery (opt-in, `home_assistant = true`): retained sensor configs
//! under `homeassistant/sensor/fedge_<federation>/<sensor>/config`, so the coordinator's round,
//! online clients, accuracies and rejected updates appear in Home Assistant without hand
//! configuration. Every sensor reads the retained coordinator status JSON; availability comes
//! from the same topic, whose Last Will says `"state": "offline"`. Every device the coordinator
//! hears from gets a Home Assistant device of its own (`fedge_<federation>_<client>`: online,
//! last round, model round, samples, site accuracy, drift alarms, last error, read from its
//! retained status),
//! removed again when the device is revoked.

use fedge_wire::Topics;
use serde_json::json;

/// Topic prefix Home Assistant listens on by default.
pub const DISCOVERY_PREFIX: &str = "homeassistant";

/// Where Home Assistant users find help (the `origin` block's `support_url`).
pub const SUPPORT_URL: &str = env!("CARGO_PKG_REPOSITORY");

/// (key in the status JSON, sensor name, unit, state class)
const SENSORS: [(&str, &str, Option<&str>, Option<&str>); 9] = [
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
    // Buffered aggregation (the status's `buffer`); unknown in synchronous mode.
    ("model_version", "model version", None, Some("measurement")),
    ("buffer_fill", "buffer fill", None, Some("measurement")),
];

/// The status field a buffered-aggregation sensor reads inside `buffer`.
fn buffer_field(key: &str) -> Option<&'static str> {
    match key {
        "model_version" => Some("version"),
        "buffer_fill" => Some("fill"),
        _ => None,
    }
}

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
            let template = match (accuracy, buffer_field(key)) {
                (true, _) => format!("{{{{ (value_json.{key} * 100) | round(1) if value_json.{key} is number else none }}}}"),
                // Named after the sensor's key, unknown when the coordinator runs rounds.
                (false, Some(field)) => format!(
                    "{{% set {key} = value_json.buffer.{field} if value_json.buffer is defined else none %}}{{{{ {key} }}}}"
                ),
                (false, None) => format!("{{{{ value_json.{key} }}}}"),
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

/// A device's sensors: (key, component, name, value template, unit, state class). Each reads
/// the device's own retained status.
const DEVICE_SENSORS: [DeviceSensor; 8] = [
    (
        "online",
        "binary_sensor",
        "online",
        "{{ 'ON' if value_json.online else 'OFF' }}",
        None,
        None,
    ),
    (
        "last_round",
        "sensor",
        "last round trained",
        "{{ value_json.last_round }}",
        None,
        Some("measurement"),
    ),
    (
        "model_round",
        "sensor",
        "model round served",
        "{{ value_json.model_round if value_json.model_round is defined else none }}",
        None,
        Some("measurement"),
    ),
    (
        "samples",
        "sensor",
        "samples",
        "{{ value_json.samples }}",
        None,
        Some("measurement"),
    ),
    (
        "site_accuracy",
        "sensor",
        "site accuracy",
        "{{ (value_json.evaluation.accuracy * 100) | round(1) if value_json.evaluation is defined else none }}",
        Some("%"),
        Some("measurement"),
    ),
    (
        "drift_alarms",
        "sensor",
        "drift alarms",
        "{{ value_json.drift.alarms if value_json.drift is defined else 0 }}",
        None,
        Some("total_increasing"),
    ),
    (
        "labels_waiting",
        "sensor",
        "images waiting for a label",
        "{{ value_json.labelling.waiting if value_json.labelling is defined else none }}",
        None,
        Some("measurement"),
    ),
    (
        "last_error",
        "sensor",
        "last error",
        "{{ value_json.last_error[:250] if value_json.last_error else 'none' }}",
        None,
        None,
    ),
];

/// (key, component, name, value template, unit, state class)
type DeviceSensor = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

/// The discovery topics of `client`'s entities (also what a revoke clears, with empty retained
/// messages): under the federation's node id, like the coordinator's, so that one ACL line
/// (`homeassistant/+/fedge_<f>/#`) covers them all; the `device` block groups them.
pub fn device_discovery_topics(federation: &str, client: &str) -> Vec<String> {
    let (node, client) = (object_id(federation), object_id(client));
    DEVICE_SENSORS
        .iter()
        .map(|(key, component, ..)| {
            format!("{DISCOVERY_PREFIX}/{component}/fedge_{node}/{client}_{key}/config")
        })
        .collect()
}

/// A device's Home Assistant node id: the federation's and the client's (object-id safe).
fn device_node(federation: &str, client: &str) -> String {
    format!("fedge_{}_{}", object_id(federation), object_id(client))
}

/// The retained discovery messages of one device's entities (online, last round trained,
/// model round served, samples, site accuracy for an evaluation-only site, drift alarms, last
/// error), shown
/// in Home Assistant as a device of its own, linked to the coordinator's.
pub fn device_discovery_messages(
    topics: &Topics,
    federation: &str,
    client: &str,
) -> Vec<(String, String)> {
    let node = device_node(federation, client);
    let status = topics.edge_status(client);
    let topics_out = device_discovery_topics(federation, client);
    DEVICE_SENSORS
        .iter()
        .zip(topics_out)
        .map(|((key, component, name, template, unit, class), topic)| {
            let mut config = json!({
                "name": name,
                "unique_id": format!("{node}_{key}"),
                "default_entity_id": format!("{component}.{}", entity_slug(&format!("{node}_{key}"))),
                "state_topic": status,
                "value_template": template,
                // A device's status stays retained when it goes: availability is the
                // coordinator's, and `online` says whether the device is there.
                "availability_topic": topics.coordinator_status(),
                "availability_template":
                    "{{ 'offline' if value_json.state == 'offline' else 'online' }}",
                "device": {
                    "identifiers": [node],
                    "name": format!("fedge device {client}"),
                    "manufacturer": "fedge",
                    "model": "fedge-edge",
                    "via_device": format!("fedge_{}", object_id(federation)),
                },
                "origin": {
                    "name": "fedge",
                    "sw_version": env!("CARGO_PKG_VERSION"),
                    "support_url": SUPPORT_URL,
                },
            });
            if let Some(map) = config.as_object_mut() {
                if *component == "binary_sensor" {
                    map.insert("device_class".into(), json!("connectivity"));
                }
                if let Some(unit) = unit {
                    map.insert("unit_of_measurement".into(), json!(unit));
                }
                if let Some(class) = class {
                    map.insert("state_class".into(), json!(class));
                }
            }
            (topic, config.to_string())
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

    #[test]
    fn each_device_gets_entities_of_its_own_linked_to_the_coordinator() {
        let topics = Topics::new("plant-7").unwrap();
        let messages = device_discovery_messages(&topics, "plant-7", "cam.01");
        assert_eq!(messages.len(), DEVICE_SENSORS.len());
        let cleared = device_discovery_topics("plant-7", "cam.01");
        let mut ids = std::collections::BTreeSet::new();
        for ((topic, payload), clear) in messages.iter().zip(&cleared) {
            assert_eq!(topic, clear);
            let parts: Vec<&str> = topic.split('/').collect();
            assert_eq!(parts[2], "fedge_plant-7", "{topic}");
            let key = parts[3].strip_prefix("cam_01_").expect(topic);
            let v: serde_json::Value = serde_json::from_str(payload).unwrap();
            assert!(ids.insert(v["unique_id"].as_str().unwrap().to_owned()));
            assert_eq!(v["state_topic"], "fedge/plant-7/edge/cam.01/status");
            assert_eq!(v["device"]["via_device"], "fedge_plant-7");
            assert_eq!(v["device"]["identifiers"][0], "fedge_plant-7_cam_01");
            let entity = v["default_entity_id"].as_str().unwrap();
            assert_eq!(entity, format!("{}.fedge_plant_7_cam_01_{key}", parts[1]));
        }
        let online = &messages[0];
        assert!(online.0.starts_with("homeassistant/binary_sensor/"));
        let accuracy: serde_json::Value = serde_json::from_str(&messages[4].1).unwrap();
        assert_eq!(accuracy["unit_of_measurement"], "%");
        assert!(
            accuracy["value_template"]
                .as_str()
                .unwrap()
                .contains("evaluation.accuracy")
        );
    }
}
