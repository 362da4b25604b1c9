//! The optional embedded MQTT broker (rumqttd), for demos, tests and small sites.
//!
//! rumqttd keeps everything in memory and has no shutdown API: the broker lives until the
//! process ends. Production deployments should run mosquitto or EMQX (see README).
//! Limits are set explicitly because rumqttd's defaults are unusable (`max_connections` 0).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

/// Limits of the embedded broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerLimits {
    /// Simultaneous connections; keep it well above the number of devices (rumqttd issue
    /// #1062: a client retrying at the limit can poison the listener).
    pub max_connections: usize,
    /// Largest accepted publish payload in bytes.
    pub max_payload: usize,
    /// Unacknowledged QoS 1 messages per connection.
    pub max_inflight: usize,
}

impl Default for BrokerLimits {
    fn default() -> Self {
        Self {
            max_connections: 1_000,
            max_payload: fedge_mqtt::BROKER_MAX_PACKET,
            max_inflight: 100,
        }
    }
}

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No free port or the address is taken.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address tried.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The broker did not accept connections in time.
    #[error("embedded broker on {0} did not come up within 5 s")]
    NotReady(SocketAddr),
}

/// A running embedded broker.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedBroker {
    /// Where clients connect.
    pub addr: SocketAddr,
}

/// A free TCP port on loopback (bound and released; another process could take it first).
pub fn free_loopback_addr() -> Result<SocketAddr, BrokerError> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let listener =
        TcpListener::bind(any).map_err(|source| BrokerError::Bind { addr: any, source })?;
    listener
        .local_addr()
        .map_err(|source| BrokerError::Bind { addr: any, source })
}

/// Starts rumqttd on `addr` (port 0 picks a free loopback port) in its own threads and waits
/// until it accepts TCP connections.
pub fn start_embedded(
    addr: SocketAddr,
    limits: &BrokerLimits,
) -> Result<EmbeddedBroker, BrokerError> {
    let addr = match addr.port() {
        // Another process may take a free port before it is bound again: try a few.
        0 => {
            let mut tries = 0;
            loop {
                let free = free_loopback_addr()?;
                match TcpListener::bind(free) {
                    Ok(check) => {
                        drop(check);
                        break free;
                    }
                    Err(source) if tries == 9 => {
                        return Err(BrokerError::Bind { addr: free, source });
                    }
                    Err(_) => tries += 1,
                }
            }
        }
        _ => {
            // Fail early with a clear error when the address is taken.
            drop(TcpListener::bind(addr).map_err(|source| BrokerError::Bind { addr, source })?);
            addr
        }
    };
    let server = ServerSettings {
        name: "fedge-v4".into(),
        listen: addr,
        tls: None,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 60_000,
            max_payload_size: limits.max_payload,
            max_inflight_count: limits.max_inflight,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    let config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: limits.max_connections,
            max_outgoing_packet_count: 200,
            max_segment_size: 100 << 20,
            max_segment_count: 10,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Default::default()
    };
    std::thread::Builder::new()
        .name("fedge-broker".into())
        .spawn(move || {
            let mut broker = Broker::new(config);
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(|source| BrokerError::Bind { addr, source })?;
    let start = Instant::now();
    // Generous: on a loaded machine (a test run beside a build) the broker's threads may
    // take seconds to bind.
    while start.elapsed() < Duration::from_secs(20) {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(EmbeddedBroker { addr });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(BrokerError::NotReady(addr))
}
