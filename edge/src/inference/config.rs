//! `[inference]` in a device profile: whether and where the device answers predictions over
//! HTTP, and the endpoint's defaults.

use serde::{Deserialize, Serialize};

/// Default number of best classes in an answer.
pub const DEFAULT_TOP_K: usize = 3;
/// Default largest request body, in MiB.
pub const DEFAULT_MAX_BODY_MB: usize = 16;
/// Largest `max_body_mb` accepted.
pub const MAX_BODY_MB_LIMIT: usize = 1024;

/// The inference endpoint's settings.
///
/// The endpoint has no authentication and no TLS: anyone who can reach `listen` can ask for
/// predictions and read the model's class list. Keep it on loopback (`127.0.0.1:PORT`) unless
/// the network in front of the device is trusted, or put an authenticating proxy before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InferenceConfig {
    /// Address to listen on, `HOST:PORT` (e.g. `"127.0.0.1:8085"`); unset: no HTTP server.
    #[serde(default)]
    pub listen: Option<String>,
    /// Best classes listed in an answer when the request does not say (`?top_k=N`); at
    /// least 1.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Largest request body (the image), in MiB, 1 to 1024; a larger one is refused with 413.
    #[serde(default = "default_max_body_mb")]
    pub max_body_mb: usize,
    /// Also answer requests on `edge/<client_id>/infer/request` over the federation's broker,
    /// on `edge/<client_id>/infer/response` (JSON with the request's id), for MQTT-native
    /// applications such as Node-RED.
    #[serde(default)]
    pub mqtt: bool,
    /// Predictions answered at once over HTTP; one more is answered 503 at once, so that a
    /// stream of requests cannot queue without bound or starve the device's training. At
    /// least 1.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Seconds a request's body may take to arrive, 1 to 300; a slower one is answered 408.
    #[serde(default = "default_body_timeout_s")]
    pub body_timeout_s: u64,
    /// Connections open at once, 1 to 1024; one more is answered 503 and closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Seconds a request's headers may take to arrive, 1 to 300; a slower connection is
    /// closed.
    #[serde(default = "default_header_timeout_s")]
    pub header_timeout_s: u64,
    /// A prediction whose features lie further than this from every class the federation
    /// trained on (in within-class standard deviations; an image like the training ones
    /// measures about 1) says `"unfamiliar": true`; ≥ 0, and 0 flags none. Needs a release
    /// with the pooled summary (`feature_norm = "pooled"` or `"balanced"`).
    #[serde(default = "default_unfamiliar_distance")]
    pub unfamiliar_distance: f32,
    /// What the device serves of each release at its site: `"choose"` (the default), the
    /// release as it is unless its label-free adaptation (`prior-em`) or the site's own
    /// correction from its labelled rows is better beyond noise (docs/algorithms.md §10); or
    /// `"off"`, the release as it is. The status, the metrics and every answer name the
    /// variant served.
    #[serde(default)]
    pub adapt: fedge_wire::SiteAdapt,
}

fn default_unfamiliar_distance() -> f32 {
    crate::inference::predictor::DEFAULT_UNFAMILIAR_DISTANCE
}

fn default_max_connections() -> usize {
    16
}

fn default_header_timeout_s() -> u64 {
    10
}

fn default_max_in_flight() -> usize {
    2
}

fn default_body_timeout_s() -> u64 {
    10
}

fn default_top_k() -> usize {
    DEFAULT_TOP_K
}

fn default_max_body_mb() -> usize {
    DEFAULT_MAX_BODY_MB
}

impl Default for InferenceConfig {
    fn default() -> Self {
        Self {
            listen: None,
            top_k: DEFAULT_TOP_K,
            max_body_mb: DEFAULT_MAX_BODY_MB,
            mqtt: false,
            max_in_flight: default_max_in_flight(),
            body_timeout_s: default_body_timeout_s(),
            max_connections: default_max_connections(),
            header_timeout_s: default_header_timeout_s(),
            unfamiliar_distance: default_unfamiliar_distance(),
            adapt: fedge_wire::SiteAdapt::default(),
        }
    }
}

/// An `[inference]` section that cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidInference {
    /// `top_k = 0`.
    #[error("[inference] top_k must be at least 1")]
    TopK,
    /// `max_body_mb` out of range.
    #[error("[inference] max_body_mb = {0}: give 1 to {MAX_BODY_MB_LIMIT} (MiB)")]
    MaxBody(usize),
    /// `max_in_flight = 0`.
    #[error("[inference] max_in_flight must be at least 1 (2 by default)")]
    MaxInFlight,
    /// `body_timeout_s` out of range.
    #[error("[inference] body_timeout_s = {0}: give 1 to 300 (seconds)")]
    BodyTimeout(u64),
    /// `max_connections` out of range.
    #[error("[inference] max_connections = {0}: give 1 to 1024 (16 by default)")]
    MaxConnections(usize),
    /// `header_timeout_s` out of range.
    #[error("[inference] header_timeout_s = {0}: give 1 to 300 (seconds)")]
    HeaderTimeout(u64),
    /// `unfamiliar_distance` negative or not finite.
    #[error(
        "[inference] unfamiliar_distance = {0}: give 0 (off) or a positive number (3 by default)"
    )]
    UnfamiliarDistance(f32),
    /// `listen` is not `HOST:PORT`.
    #[error("[inference] listen = {0:?}: give HOST:PORT, e.g. \"127.0.0.1:8085\"")]
    Listen(String),
}

impl InferenceConfig {
    /// Checks the values without touching the network (`listen` must end in `:PORT`).
    pub fn check(&self) -> Result<(), InvalidInference> {
        if self.top_k == 0 {
            return Err(InvalidInference::TopK);
        }
        if !(1..=MAX_BODY_MB_LIMIT).contains(&self.max_body_mb) {
            return Err(InvalidInference::MaxBody(self.max_body_mb));
        }
        if self.max_in_flight == 0 {
            return Err(InvalidInference::MaxInFlight);
        }
        if !(self.unfamiliar_distance.is_finite() && self.unfamiliar_distance >= 0.0) {
            return Err(InvalidInference::UnfamiliarDistance(
                self.unfamiliar_distance,
            ));
        }
        if !(1..=300).contains(&self.body_timeout_s) {
            return Err(InvalidInference::BodyTimeout(self.body_timeout_s));
        }
        if !(1..=1024).contains(&self.max_connections) {
            return Err(InvalidInference::MaxConnections(self.max_connections));
        }
        if !(1..=300).contains(&self.header_timeout_s) {
            return Err(InvalidInference::HeaderTimeout(self.header_timeout_s));
        }
        if let Some(listen) = &self.listen {
            let port = listen
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(InvalidInference::Listen(listen.clone()));
            }
        }
        Ok(())
    }

    /// Whether the device answers predictions at all (over HTTP or MQTT), and so keeps its
    /// backbone in memory after the feature cache is built.
    pub fn serves(&self) -> bool {
        self.listen.is_some() || self.mqtt
    }

    /// The body limit in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_mb.saturating_mul(1 << 20)
    }

    /// Binds `listen`, or returns `None` when the profile asks for no server.
    pub async fn bind(&self) -> Result<Option<tokio::net::TcpListener>, ListenError> {
        let Some(addr) = &self.listen else {
            return Ok(None);
        };
        tokio::net::TcpListener::bind(addr.as_str())
            .await
            .map(Some)
            .map_err(|source| ListenError {
                listen: addr.clone(),
                source,
            })
    }
}

/// `[inference] listen` could not be bound.
#[derive(Debug, thiserror::Error)]
#[error(
    "[inference] listen = {listen:?}: cannot listen there ({source}); pick a free port, or \
     stop what uses it"
)]
pub struct ListenError {
    /// The address asked for.
    pub listen: String,
    /// Why.
    pub source: std::io::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        let config: InferenceConfig = toml::from_str("").unwrap();
        assert_eq!(config, InferenceConfig::default());
        assert_eq!(config.check(), Ok(()));
        assert_eq!(config.max_body_bytes(), 16 << 20);
        let config: InferenceConfig =
            toml::from_str("listen = \"127.0.0.1:8085\"\ntop_k = 5").unwrap();
        assert_eq!(config.check(), Ok(()));
        assert!(toml::from_str::<InferenceConfig>("port = 1").is_err());
        let bad = |text: &str| toml::from_str::<InferenceConfig>(text).unwrap().check();
        assert_eq!(bad("top_k = 0"), Err(InvalidInference::TopK));
        assert_eq!(bad("max_body_mb = 0"), Err(InvalidInference::MaxBody(0)));
        for listen in ["8085", ":8085", "host:port", "[::1]"] {
            assert!(
                matches!(
                    bad(&format!("listen = {listen:?}")),
                    Err(InvalidInference::Listen(_))
                ),
                "{listen}"
            );
        }
        assert_eq!(bad("listen = \"[::1]:8085\""), Ok(()));
    }
}
