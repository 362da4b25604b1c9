//! MQTT topic names under `fedge/<federation>/`.

use crate::error::DecodeError;

/// Longest federation name and client id, in bytes.
const MAX_NAME_BYTES: usize = 64;

/// Topic builder for one federation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    root: String,
}

impl Topics {
    /// Topics of federation `name` (validated: non-empty, no `/`, `+`, `#` or NUL).
    ///
    /// The name is also at most 64 bytes long; an invalid name is [`DecodeError::Malformed`].
    pub fn new(federation: &str) -> Result<Self, crate::DecodeError> {
        let valid = (1..=MAX_NAME_BYTES).contains(&federation.len())
            && !federation.contains(['/', '+', '#', '\0']);
        if !valid {
            return Err(DecodeError::Malformed(format!(
                "invalid federation name {federation:?}: 1 to {MAX_NAME_BYTES} bytes without \
                 '/', '+', '#' or NUL"
            )));
        }
        Ok(Self {
            root: format!("fedge/{federation}"),
        })
    }

    /// The federation's name.
    pub fn federation(&self) -> &str {
        &self.root["fedge/".len()..]
    }

    /// `fedge/<f>/round/task` (binary, retained).
    pub fn round_task(&self) -> String {
        format!("{}/round/task", self.root)
    }

    /// `fedge/<f>/model/current` (binary `ModelRelease`, retained; chunk `i` of a large one on
    /// `model/current/<i>`).
    pub fn model_current(&self) -> String {
        format!("{}/model/current", self.root)
    }

    /// `fedge/<f>/model/candidate` (binary `ModelRelease`, retained, chunked as
    /// `model/current`): an aggregate waiting for the evaluation gate, which evaluation-only
    /// devices score and nobody serves.
    pub fn model_candidate(&self) -> String {
        format!("{}/model/candidate", self.root)
    }

    /// `fedge/<f>/model/serving` (JSON `ServingPointer`, sealed with the device keys
    /// when the federation has keys, retained): which release each device serves.
    pub fn model_serving(&self) -> String {
        format!("{}/model/serving", self.root)
    }

    /// `fedge/<f>/edge/<client>/update` (binary, QoS 1).
    pub fn update(&self, client: &str) -> String {
        format!("{}/edge/{client}/update", self.root)
    }

    /// `fedge/<f>/edge/+/update`.
    pub fn update_filter(&self) -> String {
        self.update("+")
    }

    /// `fedge/<f>/coordinator/status` (JSON, retained).
    pub fn coordinator_status(&self) -> String {
        format!("{}/coordinator/status", self.root)
    }

    /// `fedge/<f>/coordinator/control` (JSON operator commands, tagged with the operator key;
    /// not retained).
    pub fn control(&self) -> String {
        format!("{}/coordinator/control", self.root)
    }

    /// `fedge/<f>/metrics` (JSON, one message per round).
    pub fn metrics(&self) -> String {
        format!("{}/metrics", self.root)
    }

    /// `fedge/<f>/edge/<client>/status` (JSON, retained, Last Will).
    pub fn edge_status(&self, client: &str) -> String {
        format!("{}/edge/{client}/status", self.root)
    }

    /// `fedge/<f>/edge/+/status`.
    pub fn edge_status_filter(&self) -> String {
        self.edge_status("+")
    }

    /// `fedge/<f>/edge/<client>/infer/request` (JSON prediction requests to a device that
    /// takes them, `[inference] mqtt = true`).
    pub fn infer_request(&self, client: &str) -> String {
        format!("{}/edge/{client}/infer/request", self.root)
    }

    /// `fedge/<f>/edge/<client>/infer/response` (JSON, the answers to `infer/request`).
    pub fn infer_response(&self, client: &str) -> String {
        format!("{}/edge/{client}/infer/response", self.root)
    }

    /// `fedge/<f>/edge/<client>/enrol/request` (JSON, `fedge-edge enroll`'s request for a key,
    /// tagged with its one-time token; not retained).
    pub fn enrol_request(&self, client: &str) -> String {
        format!("{}/edge/{client}/enrol/request", self.root)
    }

    /// `fedge/<f>/edge/+/enrol/request`.
    pub fn enrol_request_filter(&self) -> String {
        self.enrol_request("+")
    }

    /// `fedge/<f>/edge/<client>/enrol/response` (JSON, the coordinator's answer: the key
    /// sealed for the device, or why not; not retained).
    pub fn enrol_response(&self, client: &str) -> String {
        format!("{}/edge/{client}/enrol/response", self.root)
    }

    /// The client id in an enrolment request topic of this federation, if `topic` is one.
    pub fn client_of_enrol_request<'a>(&self, topic: &'a str) -> Option<&'a str> {
        self.client_of_edge_topic(topic, "enrol/request")
    }

    /// `fedge/<f>/backbone/current` (JSON `{"name", "sha256"}`, retained): the backbone the
    /// federation trains on, which `fedge-coordinator publish-backbone` distributes.
    pub fn backbone_current(&self) -> String {
        format!("{}/backbone/current", self.root)
    }

    /// `fedge/<f>/backbone/<sha256>` (a `BackboneObject` frame, retained; chunk `i` on
    /// `…/<sha256>/<i>` when larger than the packet limit).
    pub fn backbone(&self, sha256_hex: &str) -> String {
        format!("{}/backbone/{sha256_hex}", self.root)
    }

    /// The client id in an update topic of this federation, if `topic` is one.
    pub fn client_of_update<'a>(&self, topic: &'a str) -> Option<&'a str> {
        self.client_of_edge_topic(topic, "update")
    }

    /// The client id in an edge status topic of this federation, if `topic` is one.
    pub fn client_of_edge_status<'a>(&self, topic: &'a str) -> Option<&'a str> {
        self.client_of_edge_topic(topic, "status")
    }

    /// The valid client id `c` when `topic` is exactly `fedge/<f>/edge/<c>/<leaf>`.
    fn client_of_edge_topic<'a>(&self, topic: &'a str, leaf: &str) -> Option<&'a str> {
        let client = topic
            .strip_prefix(self.root.as_str())?
            .strip_prefix("/edge/")?
            .strip_suffix(leaf)?
            .strip_suffix('/')?;
        valid_client_id(client).then_some(client)
    }
}

/// True when `id` is usable as one topic level and a client id (1..=64 bytes of
/// `[A-Za-z0-9_.-]`).
pub fn valid_client_id(id: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn topics() -> Topics {
        Topics::new("lab").unwrap()
    }

    #[test]
    fn builders_produce_the_documented_names() {
        let t = topics();
        assert_eq!(t.round_task(), "fedge/lab/round/task");
        assert_eq!(t.update("cam-01"), "fedge/lab/edge/cam-01/update");
        assert_eq!(t.update_filter(), "fedge/lab/edge/+/update");
        assert_eq!(t.coordinator_status(), "fedge/lab/coordinator/status");
        assert_eq!(t.metrics(), "fedge/lab/metrics");
        assert_eq!(t.edge_status("pi_3"), "fedge/lab/edge/pi_3/status");
        assert_eq!(t.edge_status_filter(), "fedge/lab/edge/+/status");
    }

    #[test]
    fn federation_names_are_validated() {
        assert!(Topics::new("a").is_ok());
        assert!(Topics::new("my federation é").is_ok());
        assert!(Topics::new(&"x".repeat(64)).is_ok());
        for bad in ["", "a/b", "a+", "#", "a\0b", &"x".repeat(65)] {
            assert!(
                matches!(Topics::new(bad), Err(DecodeError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn client_ids_are_validated() {
        assert!(valid_client_id("cam-01"));
        assert!(valid_client_id("A.b_C-9"));
        assert!(valid_client_id(&"x".repeat(64)));
        for bad in ["", "+", "#", "a/b", "a b", "é", "a\0", &"x".repeat(65)] {
            assert!(!valid_client_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_parsers_read_the_client_of_their_own_topics() {
        let t = topics();
        assert_eq!(t.client_of_update(&t.update("cam-01")), Some("cam-01"));
        assert_eq!(
            t.client_of_edge_status(&t.edge_status("cam-01")),
            Some("cam-01")
        );
        assert_eq!(t.client_of_update(&t.edge_status("cam-01")), None);
        assert_eq!(t.client_of_edge_status(&t.update("cam-01")), None);
    }

    #[test]
    fn the_parsers_refuse_anything_else() {
        let t = topics();
        for topic in [
            "",
            "fedge/lab/edge//update",
            "fedge/lab/edge/+/update",
            "fedge/lab/edge/#",
            "fedge/lab/edge/a/b/update",
            "fedge/lab/edge/cam-01/update/",
            "fedge/lab/edge/cam-01/updates",
            "fedge/lab/edge/cam-01update",
            "fedge/lab/edge/cam-01/update/x",
            "/fedge/lab/edge/cam-01/update",
            "fedge/lab2/edge/cam-01/update",
            "fedge/la/edge/cam-01/update",
            "fedge/other/edge/cam-01/update",
            "fedge/lab/round/task",
            "fedge/lab/edgecam-01/update",
            "fedge/lab/edge/cam 01/update",
        ] {
            assert_eq!(t.client_of_update(topic), None, "{topic:?}");
            assert_eq!(
                t.client_of_edge_status(&topic.replace("update", "status")),
                None
            );
        }
        let long = t.update(&"x".repeat(65));
        assert_eq!(t.client_of_update(&long), None);
    }

    #[test]
    fn a_federation_whose_name_prefixes_another_does_not_match_it() {
        let short = Topics::new("lab").unwrap();
        let long = Topics::new("lab-2").unwrap();
        assert_eq!(short.client_of_update(&long.update("a")), None);
        assert_eq!(long.client_of_update(&short.update("a")), None);
    }

    proptest! {
        #[test]
        fn parsing_a_built_topic_gives_the_client_back(client in "[A-Za-z0-9_.-]{1,64}") {
            let t = topics();
            let update = t.update(&client);
            let status = t.edge_status(&client);
            prop_assert_eq!(t.client_of_update(&update), Some(client.as_str()));
            prop_assert_eq!(t.client_of_edge_status(&status), Some(client.as_str()));
        }

        #[test]
        fn parsing_arbitrary_topics_never_panics(topic in "\\PC{0,80}") {
            let t = topics();
            if let Some(client) = t.client_of_update(&topic) {
                prop_assert!(valid_client_id(client));
                prop_assert_eq!(t.update(client), topic.clone());
            }
            let _ = t.client_of_edge_status(&topic);
        }
    }
}
