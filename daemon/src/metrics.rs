//! The HTTP side of the daemons' Prometheus metrics: one `GET /metrics` server in the
//! OpenMetrics text format, and the process memory every daemon reports. What is measured is
//! each daemon's own (the coordinator's rounds, the device's training and inference).
//!
//! Every HTTP server of fedge's daemons (this one, the device's inference endpoint and its
//! labelling page) runs the bounded accept loop [`serve_bounded`], so that what a stream of
//! clients can hold is bounded ([`ConnectionLimits`]): `max_connections` connections at once
//! (one more is answered 503 and closed at once), `header_timeout` for a request's headers and
//! for a kept-alive connection's wait for its next request (then it is closed), and
//! `connection_timeout` for a connection's whole life, whatever it does (a body trickling in,
//! an answer never read): it is then asked to close after the request in progress and closed
//! outright `grace` later. Each request carries the address its connection arrived on
//! ([`LocalAddr`], an axum extension), which tells a request from the machine itself
//! (loopback) from one over the network.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `GET /metrics` answers: the exposition, encoded at each scrape.
pub type Exposition = Arc<dyn Fn() -> String + Send + Sync>;

/// What the clients of one HTTP server may hold of it (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once (at least one); one more is answered 503 and closed.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive, and a kept-alive connection may wait
    /// for its next request, before the connection is closed.
    pub header_timeout: Duration,
    /// The longest a connection stays open, whatever it does.
    pub connection_timeout: Duration,
    /// How long requests in flight may take to finish once the server stops or their
    /// connection reached `connection_timeout`.
    pub grace: Duration,
    /// The setting that raises `max_connections`, named in the 503 answer
    /// (`"[inference] max_connections"`), when there is one.
    pub setting: Option<&'static str>,
}

impl Default for ConnectionLimits {
    /// The metrics endpoint's: 16 connections, 10 s for headers, a minute per connection
    /// (a scraper reconnects), 2 s of grace.
    fn default() -> Self {
        Self {
            max_connections: 16,
            header_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(60),
            grace: Duration::from_secs(2),
            setting: None,
        }
    }
}

/// The local address a request's connection arrived on, in every request [`serve_bounded`]
/// serves (`axum::Extension<LocalAddr>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr(pub SocketAddr);

/// The `GET /metrics` route answering `exposition`.
pub fn router(exposition: Exposition) -> axum::Router {
    use axum::routing::get;
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let text = exposition();
            async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text) }
        }),
    )
}

/// Serves `exposition` on `GET /metrics` at `addr` until the returned task is aborted, within
/// the default [`ConnectionLimits`].
pub async fn serve(
    addr: SocketAddr,
    exposition: Exposition,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "metrics for Prometheus on /metrics");
    let app = router(exposition);
    let limits = ConnectionLimits::default();
    Ok(tokio::spawn(serve_bounded(
        listener,
        app,
        limits,
        std::future::pending(),
    )))
}

/// Serves `router` on `listener` within `limits` until `stop` completes, then lets requests in
/// flight finish for `limits.grace` and closes what is left. Aborting the task running it
/// closes every connection at once.
pub async fn serve_bounded(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let (drain_tx, drain) = tokio::sync::watch::channel(false);
    let mut open = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.as_mut() => break,
        };
        while open.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait a little rather than spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: max_connections open");
            refuse_connection(&stream, &limits);
            continue;
        };
        let mut app = router.clone();
        if let Ok(local) = stream.local_addr() {
            app = app.layer(axum::Extension(LocalAddr(local)));
        }
        let service = hyper_util::service::TowerToHyperService::new(app);
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let drain = drain.clone();
        open.spawn(async move {
            let _permit = permit;
            run_connection(connection, drain, limits).await;
        });
    }
    let _ = drain_tx.send(true);
    let finished = async { while open.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.grace, finished).await.is_err() {
        tracing::debug!("connections still open at shutdown closed");
    }
    open.abort_all();
}

/// Runs one connection until it ends, the server drains or it reaches
/// `limits.connection_timeout`; in the last two cases it is asked to close after the request
/// in progress and dropped `limits.grace` later.
async fn run_connection<I, S>(
    connection: hyper::server::conn::http1::Connection<I, S>,
    mut drain: tokio::sync::watch::Receiver<bool>,
    limits: ConnectionLimits,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = drain.changed() => {}
        () = tokio::time::sleep(limits.connection_timeout) => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.grace, connection).await;
}

/// Answers a connection beyond `limits.max_connections` with a 503 as far as the socket takes
/// it without waiting, then closes it.
fn refuse_connection(stream: &tokio::net::TcpStream, limits: &ConnectionLimits) {
    let setting = limits
        .setting
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    let body = format!(
        "{{\"error\":\"busy: {} connections open{setting}; retry shortly\"}}",
        limits.max_connections
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
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

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    #[test]
    fn memory_is_read_and_the_peak_is_not_below_the_current() {
        let (now, peak) = memory().expect("Linux /proc");
        assert!(now > 100_000 && peak >= now, "{now} {peak}");
    }

    /// A metrics server on a free loopback port within `limits`, answering `text`.
    async fn start(limits: ConnectionLimits, text: String) -> (SocketAddr, AbortOnDrop) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(Arc::new(move || text.clone()));
        let server = tokio::spawn(serve_bounded(listener, app, limits, std::future::pending()));
        (addr, AbortOnDrop(server))
    }

    /// A blocking client connection (the test's thread waits on it; the server runs on the
    /// runtime's workers).
    fn connect(addr: SocketAddr) -> TcpStream {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream
    }

    /// Everything the server sends until it closes the connection (within 5 s).
    fn read_all(stream: &mut TcpStream) -> String {
        let mut all = Vec::new();
        if let Err(e) = stream.read_to_end(&mut all) {
            assert!(
                e.kind() == std::io::ErrorKind::ConnectionReset,
                "not closed within 5 s: {e}"
            );
        }
        String::from_utf8_lossy(&all).into_owned()
    }

    /// `path`'s answer on a connection of its own.
    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = connect(addr);
        // A connection refused over the cap may be reset before the request is written.
        let _ = write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        read_all(&mut stream)
    }

    fn limits(max_connections: usize, header_s: u64, connection_s: u64) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            header_timeout: Duration::from_secs(header_s),
            connection_timeout: Duration::from_secs(connection_s),
            grace: Duration::from_millis(500),
            setting: None,
        }
    }

    /// Idle connections up to the cap are held; one more is answered 503 and closed at once;
    /// the idle ones, one of them halfway through its headers, are closed at the header
    /// timeout, and a scrape is served again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_cap_are_refused_and_silent_ones_closed() {
        let (addr, _server) = start(limits(2, 1, 30), "up 1\n".into()).await;
        let mut silent = connect(addr);
        let mut partial = connect(addr);
        partial
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let busy = read_all(&mut connect(addr));
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        assert!(busy.contains("busy: 2 connections open"), "{busy}");
        let started = Instant::now();
        for stream in [&mut silent, &mut partial] {
            let closed = read_all(stream);
            assert!(!closed.contains("200 OK"), "{closed}");
        }
        assert!(started.elapsed() < Duration::from_secs(4));
        let ok = get(addr, "/metrics");
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.ends_with("up 1\n"),
            "{ok}"
        );
    }

    /// A client that asks for a large exposition and never reads it holds its connection
    /// (the header timeout does not run while the answer is written) only until the
    /// connection timeout: then the one connection allowed is free again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_never_read_frees_its_connection_at_the_connection_timeout() {
        let big = "x".repeat(64 << 20);
        let (addr, _server) = start(limits(1, 30, 1), big).await;
        let mut stalled = connect(addr);
        stalled
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let busy = read_all(&mut connect(addr));
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        let deadline = Instant::now() + Duration::from_secs(5);
        let served = loop {
            let answer = get(addr, "/nothing");
            if answer.starts_with("HTTP/1.1 404") || Instant::now() > deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(served.starts_with("HTTP/1.1 404"), "{served}");
        drop(stalled);
    }

    /// Each request carries the address its connection arrived on; an HTTP/1.0 request
    /// without `Host` (a container's health check) is served and its connection closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_carry_their_local_address_and_http_1_0_is_served() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app =
            router(Arc::new(|| "up 1\n".to_owned())).route(
                "/local",
                axum::routing::get(
                    |axum::Extension(local): axum::Extension<LocalAddr>| async move {
                        local.0.to_string()
                    },
                ),
            );
        let _server = AbortOnDrop(tokio::spawn(serve_bounded(
            listener,
            app,
            limits(4, 5, 30),
            std::future::pending(),
        )));
        assert!(get(addr, "/local").ends_with(&format!("\r\n\r\n{addr}")));
        let mut old = connect(addr);
        old.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let answer = read_all(&mut old);
        assert!(
            answer.starts_with("HTTP/1.0 200") && answer.ends_with("up 1\n"),
            "{answer}"
        );
    }
}
