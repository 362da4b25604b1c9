//! The device's inference endpoint (HTTP/1.1, axum):
//!
//! - `POST /v1/predict[?top_k=N]`: the body is a PNG or JPEG file's bytes, or a
//!   `multipart/form-data` form carrying one ([`super::upload`]); the answer is the prediction
//!   as JSON (`class`, `index`, `probability`, `top_k`, `logits`, `model_round`, `model_sha256`, `distance`,
//!   `unfamiliar`).
//! - `GET /v1/model`: the release in use (federation, run, round, strategy, backbone, sha256,
//!   classes, head sizes).
//! - `GET /v1/drift`: the drift alarm's state (docs/algorithms.md §9); `POST /v1/drift/readapt`:
//!   the site's command to re-adapt, as after an alarm (the next requests become the window).
//! - `GET /healthz`: `200 ok`, and whether a model is loaded.
//!
//! Errors are JSON `{"error": "..."}`: 400 for an empty body, something that is not a PNG or
//! JPEG or a bad `top_k`, 413 for a body over the limit, 422 for an image whose dimensions are
//! over the limit, 503 until the first release has been received.
//!
//! There is no authentication and no TLS: listen on loopback unless the network in front of
//! the device is trusted. What a stream of requests can take is bounded: `max_connections`
//! connections (one more is answered 503 and closed), `header_timeout_s` for a request's
//! headers and `body_timeout_s` for its body, and `max_in_flight` predictions at once over
//! HTTP and MQTT together ([`Gate`]; one more is answered 503 before its body is read), so the
//! device's training keeps its CPU. Predictions run on tokio's blocking pool, never on the
//! runtime's workers; a new release replaces the predictor atomically ([`install`]), and a
//! request already running finishes with the one it started with. At shutdown the server
//! stops accepting and gives requests in flight [`SHUTDOWN_GRACE`] to finish.

use std::io;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::config::InferenceConfig;
use super::predictor::{PredictError, Predictor};
use crate::metrics::EdgeMetrics;

/// The predictor requests use: `None` until the first release arrives; replaced whole when a
/// new one does.
pub type SharedPredictor = Arc<RwLock<Option<Arc<Predictor>>>>;

/// A shared slot holding `predictor`.
pub fn shared(predictor: Option<Predictor>) -> SharedPredictor {
    Arc::new(RwLock::new(predictor.map(Arc::new)))
}

/// Puts `predictor` in the slot; requests started before keep the previous one.
pub fn install(state: &SharedPredictor, predictor: Predictor) {
    let mut slot = state.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(Arc::new(predictor));
}

/// The predictor in the slot now.
pub fn current(state: &SharedPredictor) -> Option<Arc<Predictor>> {
    state.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// How long requests in flight may take to finish once the server is asked to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The predictions a device answers at once, over HTTP and MQTT together
/// (`[inference] max_in_flight`): one permit each.
#[derive(Debug, Clone)]
pub struct Gate {
    permits: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl Default for Gate {
    /// The default `[inference] max_in_flight`.
    fn default() -> Self {
        Self::new(InferenceConfig::default().max_in_flight)
    }
}

impl Gate {
    /// A gate letting `max` (at least one) predictions through at once.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }

    /// A permit for one prediction, held until dropped; none while `max` are in flight.
    pub fn try_enter(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.permits).try_acquire_owned().ok()
    }

    /// The answer to a request the gate turned away.
    pub fn busy_message(&self) -> String {
        format!(
            "busy: {} predictions in flight ([inference] max_in_flight); retry shortly",
            self.max
        )
    }
}

#[derive(Clone)]
struct AppState {
    predictor: SharedPredictor,
    top_k: usize,
    metrics: Option<Arc<EdgeMetrics>>,
    gate: Gate,
    body_limit: usize,
    body_timeout: Duration,
}

/// `GET /v1/model`'s answer.
#[derive(Debug, Serialize)]
struct ModelInfo<'a> {
    federation: &'a str,
    /// Hex: a 64-bit number is past what a JavaScript client reads exactly.
    run: String,
    round: u64,
    strategy: &'a str,
    backbone: &'a str,
    sha256: String,
    classes: &'a [String],
    features: usize,
    hidden: usize,
}

/// The endpoint's routes over `state`, with `config`'s default `top_k` and body limit and
/// `gate`'s bound on predictions in flight. Predictions are counted in `metrics` when given.
pub fn router(
    state: SharedPredictor,
    config: &InferenceConfig,
    metrics: Option<Arc<EdgeMetrics>>,
    gate: Gate,
) -> Router {
    let app = AppState {
        predictor: state,
        top_k: config.top_k.max(1),
        metrics,
        gate,
        body_limit: config.max_body_bytes(),
        body_timeout: Duration::from_secs(config.body_timeout_s.max(1)),
    };
    Router::new()
        .route(
            "/v1/predict",
            post(predict).layer(axum::middleware::from_fn_with_state(
                config.max_body_bytes(),
                refuse_declared_oversize,
            )),
        )
        .route("/v1/model", get(model))
        .route("/v1/drift", get(drift))
        .route("/v1/drift/readapt", post(readapt))
        .route("/healthz", get(healthz))
        .with_state(app)
}

/// Serves the endpoint on `listener` with the default settings until `stop` becomes true (or
/// its sender is dropped), then lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: SharedPredictor,
    stop: tokio::sync::watch::Receiver<bool>,
) -> io::Result<()> {
    let config = InferenceConfig::default();
    let gate = Gate::new(config.max_in_flight);
    serve_with(listener, state, &config, None, gate, stop).await
}

/// [`serve`] with `config`'s settings (`listen` is the caller's) and `gate` (shared with MQTT
/// requests), counting predictions in `metrics` when given.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: SharedPredictor,
    config: &InferenceConfig,
    metrics: Option<Arc<EdgeMetrics>>,
    gate: Gate,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "inference endpoint listening");
    }
    let app = router(state, config, metrics, gate);
    let connections = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(config.header_timeout_s.max(1)));
    let (drain_tx, drain) = tokio::sync::watch::channel(false);
    let mut open = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // A dropped sender stops the server too: nothing could stop it later.
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        while open.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait a little rather than spin.
                tracing::warn!(error = %e, "inference endpoint cannot accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: [inference] max_connections open");
            refuse_connection(&stream, config.max_connections);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let mut drain = drain.clone();
        open.spawn(async move {
            let _permit = permit;
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = drain.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    let _ = drain_tx.send(true);
    let finished = async { while open.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, finished)
        .await
        .is_err()
    {
        tracing::debug!("inference connections still open at shutdown closed");
    }
    open.abort_all();
    Ok(())
}

/// Answers a connection beyond `max_connections` with a 503 as far as the socket takes it
/// without waiting, then closes it.
fn refuse_connection(stream: &tokio::net::TcpStream, max_connections: usize) {
    let body = format!(
        "{{\"error\":\"busy: {max_connections} connections open ([inference] max_connections); \
         retry shortly\"}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// `{"error": message}` with `status`: every JSON error the device's endpoints answer.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    (
        status,
        Json(Body {
            error: message.into(),
        }),
    )
        .into_response()
}

fn no_model() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no model has been received yet: the device serves predictions once the coordinator \
         has released a head (after the first aggregated round)",
    )
}

/// `top_k` from the query string, or `default`.
fn top_k_of(query: Option<&str>, default: usize) -> Result<usize, String> {
    let mut top_k = default;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "top_k" {
            top_k = match value.parse::<usize>() {
                Ok(k) if k >= 1 => k,
                _ => return Err(format!("top_k={value:?}: give a whole number, 1 or more")),
            };
        }
    }
    Ok(top_k)
}

/// The 413 answer.
fn too_large() -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "the body is larger than the endpoint's limit ([inference] max_body_mb): send a smaller \
         image",
    )
}

/// A request whose declared length is over `limit` is answered 413 before its body is read
/// (nor "100 Continue" sent); a body without a declared length is cut at the limit as it is
/// read.
async fn refuse_declared_oversize(
    State(limit): State<usize>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = (request.headers().get(axum::http::header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => too_large(),
        _ => next.run(request).await,
    }
}

async fn predict(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    // Taken before the body is read: a slow sender holds a permit, never more than
    // max_in_flight of them.
    let Some(_permit) = app.gate.try_enter() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, app.gate.busy_message());
    };
    let body: Bytes =
        match tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, app.body_limit))
            .await
        {
            Ok(Ok(body)) => body,
            Ok(Err(_)) => return too_large(),
            Err(_) => {
                return error(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the body did not arrive within {} s ([inference] body_timeout_s)",
                        app.body_timeout.as_secs()
                    ),
                );
            }
        };
    let body = match super::upload::image_of(&headers, body).await {
        Ok(image) => image,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let top_k = match top_k_of(query.as_deref(), app.top_k) {
        Ok(k) => k,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let Some(predictor) = current(&app.predictor) else {
        return no_model();
    };
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || predictor.predict_bytes(&body, top_k)).await;
    if let Some(metrics) = &app.metrics {
        let ok = matches!(answer, Ok(Ok(_)));
        metrics.prediction("http", ok, started.elapsed().as_secs_f64());
    }
    match answer {
        Ok(Ok(prediction)) => {
            tracing::debug!(
                class = %prediction.class,
                round = prediction.model_round,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "prediction"
            );
            Json(prediction).into_response()
        }
        Ok(Err(e)) => {
            let status = match e {
                PredictError::Empty | PredictError::NotAnImage(_) => StatusCode::BAD_REQUEST,
                PredictError::TooLarge { .. } | PredictError::Depth { .. } => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                PredictError::Read { .. } | PredictError::Backbone(_) => {
                    tracing::warn!(error = %e, "prediction failed");
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            };
            error(status, e.to_string())
        }
        Err(join) => {
            tracing::error!(error = %join, "prediction task failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the prediction failed inside the device; see its log",
            )
        }
    }
}

async fn model(State(app): State<AppState>) -> Response {
    let Some(predictor) = current(&app.predictor) else {
        return no_model();
    };
    let release = predictor.release();
    Json(ModelInfo {
        federation: &release.federation,
        run: format!("{:016x}", release.run),
        round: release.round,
        strategy: &release.strategy,
        backbone: &release.backbone,
        sha256: release.sha256_hex(),
        classes: &release.classes,
        features: release.head.features,
        hidden: release.head.hidden,
    })
    .into_response()
}

/// The drift alarm on what the device serves, as its status says it (404 when the release in
/// use carries no pooled summary, so nothing is watched).
async fn drift(State(app): State<AppState>) -> Response {
    let Some(predictor) = current(&app.predictor) else {
        return no_model();
    };
    match predictor.drift().and_then(|watch| watch.snapshot()) {
        Some(status) => Json(status).into_response(),
        None => no_watch(),
    }
}

/// The site's own command to re-adapt, as after an alarm: the next requests become the
/// window the site re-estimates its statistics from (202), unless one is being gathered (409).
async fn readapt(State(app): State<AppState>) -> Response {
    let Some(predictor) = current(&app.predictor) else {
        return no_model();
    };
    let Some(watch) = predictor.drift().filter(|w| w.snapshot().is_some()) else {
        return no_watch();
    };
    match watch.start_window() {
        true => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "collecting": super::drift::RECENT_REQUESTS })),
        )
            .into_response(),
        false => error(
            StatusCode::CONFLICT,
            "a window of requests is being gathered already (after an alarm or a command)",
        ),
    }
}

fn no_watch() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no drift watch: the model in use carries no pooled feature summary \
         (feature_norm = \"none\")",
    )
}

async fn healthz(State(app): State<AppState>) -> Response {
    let body = match current(&app.predictor) {
        Some(predictor) => format!("ok\nmodel: round {}\n", predictor.release().round),
        None => "ok\nmodel: none received yet\n".to_owned(),
    };
    (StatusCode::OK, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_comes_from_the_query_or_the_default() {
        assert_eq!(top_k_of(None, 3), Ok(3));
        assert_eq!(top_k_of(Some(""), 3), Ok(3));
        assert_eq!(top_k_of(Some("top_k=5"), 3), Ok(5));
        assert_eq!(top_k_of(Some("x=1&top_k=1"), 3), Ok(1));
        assert!(top_k_of(Some("top_k=0"), 3).is_err());
        assert!(top_k_of(Some("top_k=-1"), 3).is_err());
        assert!(top_k_of(Some("top_k"), 3).is_err());
    }

    /// A request whose body trickles in holds the one permit: the next is answered 503 at once
    /// and names the setting; the trickling one is answered 408 at its timeout, and the permit
    /// is free again.
    #[tokio::test]
    async fn predictions_in_flight_are_bounded_and_a_slow_body_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config = InferenceConfig {
            max_in_flight: 1,
            body_timeout_s: 1,
            ..InferenceConfig::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let gate = Gate::new(config.max_in_flight);
        let server = tokio::spawn(async move {
            serve_with(listener, shared(None), &config, None, gate, stop).await
        });
        async fn answer(stream: &mut tokio::net::TcpStream) -> String {
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("an answer within 5 s")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }
        let request = |length: usize| {
            format!("POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n")
        };
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(request(100).as_bytes()).await.unwrap();
        slow.write_all(&[0u8; 10]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(format!("{}abc", request(3)).as_bytes())
            .await
            .unwrap();
        let busy = answer(&mut next).await;
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        assert!(busy.contains("max_in_flight"), "{busy}");
        let timed_out = answer(&mut slow).await;
        assert!(timed_out.starts_with("HTTP/1.1 408"), "{timed_out}");
        let mut again = tokio::net::TcpStream::connect(addr).await.unwrap();
        again
            .write_all(format!("{}abc", request(3)).as_bytes())
            .await
            .unwrap();
        let free = answer(&mut again).await;
        // The permit is back: no model yet, not busy.
        assert!(
            free.contains("no model") && !free.contains("max_in_flight"),
            "{free}"
        );
        stop_tx.send(true).unwrap();
        drop((slow, next, again));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    }

    /// A connection that sends no request holds the one connection allowed: the next is
    /// answered 503 and closed at once; the idle one is closed at the header timeout, and a
    /// new connection is served.
    #[tokio::test]
    async fn connections_are_capped_and_a_silent_one_is_closed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config = InferenceConfig {
            max_connections: 1,
            header_timeout_s: 1,
            ..InferenceConfig::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let gate = Gate::new(config.max_in_flight);
        let server = tokio::spawn(async move {
            serve_with(listener, shared(None), &config, None, gate, stop).await
        });
        async fn read_all(stream: &mut tokio::net::TcpStream) -> String {
            let mut all = Vec::new();
            let read = stream.read_to_end(&mut all);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read)
                .await
                .expect("closed within 5 s");
            String::from_utf8_lossy(&all).into_owned()
        }
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
        let busy = read_all(&mut refused).await;
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        assert!(busy.contains("max_connections"), "{busy}");
        let started = Instant::now();
        let closed = read_all(&mut silent).await;
        assert!(closed.is_empty() || closed.contains("408"), "{closed}");
        assert!(started.elapsed() < std::time::Duration::from_secs(4));
        let mut served = tokio::net::TcpStream::connect(addr).await.unwrap();
        served
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let ok = read_all(&mut served).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        stop_tx.send(true).unwrap();
        let stopped = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
        assert!(stopped.is_ok(), "the server did not stop");
    }
}
