//! The HTTP side of the daemons' Prometheus metrics: one `GET /metrics` server in the
//! OpenMetrics text format, and the process memory every daemon reports. What is measured is
//! each daemon's own (the coordinator's rounds, the device's training and inference).

use std::net::SocketAddr;
use std::sync::Arc;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `GET /metrics` answers: the exposition, encoded at each scrape.
pub type Exposition = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `exposition` on `GET /metrics` at `addr` until the returned task is aborted.
pub async fn serve(
    addr: SocketAddr,
    exposition: Exposition,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let text = exposition();
            async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text) }
        }),
    );
    tracing::info!(%addr, "metrics for Prometheus on /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics server stopped");
        }
    }))
}

/// `registry`'s metrics in the OpenMetrics text format.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Aborts a spawned task when dropped (a metrics server ends with its daemon's loop).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The process's resident memory and its peak, in bytes, from `/proc/self/status` (`VmRSS`,
/// `VmHWM`; Linux, `None` elsewhere).
pub fn memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    Some((kib("VmRSS:")? * 1024, kib("VmHWM:")? * 1024))
}

/// `metrics_listen` as a configuration gives it: `host:port` with an IP address or a name the
/// machine resolves (`"localhost:9465"`), its first address; `None` when unset.
pub fn deserialize_listen<'de, D>(deserializer: D) -> Result<Option<std::net::SocketAddr>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize;
    let text: Option<String> = Option::deserialize(deserializer)?;
    text.map(|t| resolve_listen(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// The first address `text` (`host:port`) resolves to, or what to write instead.
pub fn resolve_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let hint = "give host:port, e.g. \"127.0.0.1:9464\" or \"localhost:9464\"";
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?}: {e}; {hint}"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{text:?} resolves to no address; {hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_and_the_peak_is_not_below_the_current() {
        let (now, peak) = memory().expect("Linux /proc");
        assert!(now > 100_000 && peak >= now, "{now} {peak}");
    }
}
