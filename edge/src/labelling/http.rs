//! The labelling page and its JSON API (axum), on `[labelling] listen`:
//!
//! - `GET /`: the page (one input at a time, the model's guesses, one key or one tap per
//!   class, undo, skip, what is left);
//! - `GET /api/queue`: `{"classes": [...], "counts": {"left", "labelled", "too_large"},
//!   "items": [{"id", "pick", "uncertainty", "guesses", "model_round", "received"}]}`, most
//!   uncertain first (ids are hex);
//! - `GET /api/items/{id}/image`: the input's file;
//! - `POST /api/items/{id}/label` with `{"class": "<one of classes>"}`: the image goes into the
//!   site folder under that class (`{"file": "<class>/label-<id>.png", "left": n}`);
//! - `POST /api/items/{id}/skip`: out of the queue without a label;
//! - `POST /api/undo`: the newest label taken back (`{"id", "class"}`; 409 when none).
//!
//! Errors are JSON `{"error": "..."}` (400 a class outside the federation's, 404 an unknown
//! input, 503 before the first release names the classes). With a password, every request
//! needs HTTP Basic with `[labelling] user` and it (401 otherwise).
//!
//! Only the page itself can use the API, not another web page the labeller has open
//! ([`SiteGuard`], as the inference endpoint's): on loopback a request must name the device
//! in its `Host` (an IP address, `localhost` or the machine's host name: a DNS-rebinding
//! page's own name is answered 403; over the network the page asks for a password, which such
//! a page does not have), and a POST must be JSON (`Content-Type: application/json`, which no
//! HTML form and no no-cors `fetch` can send; 415 otherwise) and carry no `Origin` (or
//! `Sec-Fetch-Site`) of another site (403). The page sends `{}` with skip and undo; with curl,
//! add `-H 'content-type: application/json'`. Answers may not be embedded by other sites
//! (`Cross-Origin-Resource-Policy: same-origin`), nor the page framed.
//!
//! Connections are bounded as the inference endpoint's are ([`LIMITS`]).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::queue::{Item, LabelQueue, QueueError};
use crate::inference::SharedPredictor;
use crate::web_guard::{SiteGuard, error};
use fedge_daemon::metrics::ConnectionLimits;

/// The page, one self-contained file (no scripts or fonts from elsewhere).
const PAGE: &str = include_str!("page.html");

/// The page's bounds on connections: 16 at once (a browser opens up to six), 10 s for a
/// request's headers and between requests, two minutes per connection.
pub const LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 16,
    header_timeout: std::time::Duration::from_secs(10),
    connection_timeout: std::time::Duration::from_secs(120),
    grace: crate::inference::http::SHUTDOWN_GRACE,
    setting: None,
};

#[derive(Clone)]
struct App {
    queue: Arc<LabelQueue>,
    predictor: SharedPredictor,
    /// `user:password` as the Basic scheme carries it, when a login is required.
    login: Option<Arc<Vec<u8>>>,
}

/// An input as the API shows it (the id in hex: JavaScript reads no 64-bit integer exactly).
#[derive(Serialize)]
struct ItemView {
    id: String,
    pick: &'static str,
    uncertainty: f32,
    guesses: Vec<super::queue::Guess>,
    model_round: u64,
    received: String,
}

impl From<Item> for ItemView {
    fn from(item: Item) -> Self {
        Self {
            id: format!("{:x}", item.id),
            pick: item.pick.name(),
            uncertainty: item.uncertainty,
            guesses: item.guesses,
            model_round: item.model_round,
            received: item.received,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelBody {
    class: String,
}

/// The page's routes over `queue`; the class list comes from the release in `predictor`;
/// `login` is `(user, password)` when the page requires one.
pub fn router(
    queue: Arc<LabelQueue>,
    predictor: SharedPredictor,
    login: Option<(String, String)>,
) -> Router {
    let app = App {
        queue,
        predictor,
        login: login.map(|(u, p)| Arc::new(format!("{u}:{p}").into_bytes())),
    };
    Router::new()
        .route("/", get(page))
        .route("/api/queue", get(list))
        .route("/api/items/{id}/image", get(image))
        .route("/api/items/{id}/label", post(label))
        .route("/api/items/{id}/skip", post(skip))
        .route("/api/undo", post(undo))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            require_login,
        ))
        .layer(axum::middleware::from_fn_with_state(
            SiteGuard::new(&[], true),
            crate::web_guard::guard,
        ))
        .layer(axum::middleware::map_response(same_origin_only))
        .with_state(app)
}

/// Serves the page on `listener` within [`LIMITS`] until `stop` becomes true (or its sender
/// is dropped).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    serve_with(listener, router, LIMITS, stop).await
}

/// [`serve`] within `limits`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "labelling page listening");
    }
    let stopped = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    };
    fedge_daemon::metrics::serve_bounded(listener, router, limits, stopped).await;
    Ok(())
}

/// Every answer: not to be embedded by another site (an `<img>` of a queued input on another
/// page), nor read as another type than it says.
async fn same_origin_only(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        "cross-origin-resource-policy",
        header::HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    response
}

fn queue_error(e: QueueError) -> Response {
    let status = match &e {
        QueueError::Unknown(_) => StatusCode::NOT_FOUND,
        QueueError::Class { .. } | QueueError::ClassName(_) => StatusCode::BAD_REQUEST,
        QueueError::NothingToUndo => StatusCode::CONFLICT,
        QueueError::Io { .. } | QueueError::Unsafe { .. } => {
            tracing::warn!(error = %e, "labelling queue");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    error(status, e.to_string())
}

/// Constant-time equality of two byte strings of the same length.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_login(
    State(app): State<App>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(login) = &app.login else {
        return next.run(request).await;
    };
    use base64::Engine as _;
    let given = (request.headers().get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        });
    match given {
        Some(given) if same(&given, login) => next.run(request).await,
        _ => {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"fedge labelling\""),
            );
            let mut answer = error(
                StatusCode::UNAUTHORIZED,
                "log in with [labelling] user and the password in [labelling] password_file",
            );
            answer.headers_mut().extend(headers);
            answer
        }
    }
}

fn classes(app: &App) -> Option<Vec<String>> {
    crate::inference::http::current(&app.predictor).map(|p| p.release().classes.clone())
}

/// The input an id in a URL names, or the 404 to answer.
fn parse_id(id: &str) -> Result<u64, Box<Response>> {
    u64::from_str_radix(id, 16).map_err(|_| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            format!("no input {id:?} in the queue"),
        ))
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Not in another site's frame, where its buttons could be clicked unseen.
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        PAGE,
    )
        .into_response()
}

async fn list(State(app): State<App>) -> Response {
    let queue = Arc::clone(&app.queue);
    let Some((items, counts)) = blocking(move || (queue.pending(), queue.counts())).await else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the queue could not be read",
        );
    };
    Json(serde_json::json!({
        "classes": classes(&app).unwrap_or_default(),
        "counts": counts,
        "items": items.into_iter().map(ItemView::from).collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn image(State(app): State<App>, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(answer) => return *answer,
    };
    let queue = Arc::clone(&app.queue);
    match blocking(move || queue.image(id)).await {
        Some(Ok((bytes, kind))) => (
            [
                (header::CONTENT_TYPE, kind),
                (header::CACHE_CONTROL, "private, max-age=3600"),
            ],
            bytes,
        )
            .into_response(),
        Some(Err(e)) => queue_error(e),
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the image could not be read",
        ),
    }
}

async fn label(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Result<Json<LabelBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(answer) => return *answer,
    };
    let Ok(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "send JSON {\"class\": \"<one of the federation's classes>\"}",
        );
    };
    let Some(classes) = classes(&app) else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no model yet: the federation's classes come with its first release",
        );
    };
    let queue = Arc::clone(&app.queue);
    let site = queue.settings().site.clone();
    let done = blocking(move || {
        let file = queue.label(id, &body.class, &classes)?;
        Ok::<_, QueueError>((file, queue.counts()))
    })
    .await;
    match done {
        Some(Ok((file, counts))) => {
            let shown = file.strip_prefix(&site).unwrap_or(&file).to_owned();
            tracing::info!(input = %format!("{id:x}"), file = %shown.display(), "labelled");
            Json(serde_json::json!({ "file": shown, "left": counts.left })).into_response()
        }
        Some(Err(e)) => queue_error(e),
        None => error(StatusCode::INTERNAL_SERVER_ERROR, "the label was not saved"),
    }
}

async fn skip(State(app): State<App>, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(answer) => return *answer,
    };
    let queue = Arc::clone(&app.queue);
    match blocking(move || queue.skip(id).map(|()| queue.counts())).await {
        Some(Ok(counts)) => Json(serde_json::json!({ "left": counts.left })).into_response(),
        Some(Err(e)) => queue_error(e),
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the input was not skipped",
        ),
    }
}

async fn undo(State(app): State<App>) -> Response {
    let queue = Arc::clone(&app.queue);
    match blocking(move || queue.undo()).await {
        Some(Ok(given)) => Json(serde_json::json!({
            "id": format!("{:x}", given.item.id),
            "class": given.class,
        }))
        .into_response(),
        Some(Err(e)) => queue_error(e),
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the label was not undone",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::http::tests::{answer, client};
    use crate::labelling::QueueSettings;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    #[test]
    fn the_login_comparison_needs_every_byte() {
        assert!(super::same(b"fedge:pw", b"fedge:pw"));
        assert!(!super::same(b"fedge:pw", b"fedge:pX"));
        assert!(!super::same(b"fedge:pw", b"fedge:p"));
    }

    /// The page on a free loopback port over a queue holding one input (id 0), without a
    /// model or a login; it stops when dropped.
    struct Page {
        addr: std::net::SocketAddr,
        queue: Arc<LabelQueue>,
        _stop: tokio::sync::watch::Sender<bool>,
        _dir: tempfile::TempDir,
    }

    impl Page {
        async fn start(limits: ConnectionLimits) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let queue = LabelQueue::open(QueueSettings {
                dir: dir.path().join("queue"),
                site: dir.path().join("site"),
                capacity: 4,
                random_share: 0.0,
                max_bytes: 1 << 20,
            })
            .unwrap();
            let classes = ["bolt".to_owned(), "nut".to_owned()];
            let prediction = crate::inference::Prediction {
                class: "bolt".into(),
                index: 0,
                probability: 0.5,
                top_k: Vec::new(),
                logits: vec![1.0, 0.9],
                model_round: 1,
                model_sha256: String::new(),
                distance: None,
                unfamiliar: None,
                variant: fedge_wire::SiteVariant::Release,
            };
            assert!(
                queue
                    .offer(b"\x89PNG\r\n\x1a\n", &prediction, &classes)
                    .unwrap()
            );
            let queue = Arc::new(queue);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            let app = router(
                Arc::clone(&queue),
                crate::inference::http::shared(None),
                None,
            );
            tokio::spawn(serve_with(listener, app, limits, stop));
            Self {
                addr,
                queue,
                _stop: stop_tx,
                _dir: dir,
            }
        }

        fn url(&self, path: &str) -> String {
            format!("http://{}{path}", self.addr)
        }
    }

    /// DNS rebinding and cross-site requests: a page under another name cannot read the queue
    /// or its images; a POST that is not JSON (an HTML form, a no-cors `fetch`) or that comes
    /// from another origin changes nothing; the page's own requests (JSON, its own origin)
    /// are served, and the page says what the API needs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_page_itself_can_use_the_api() {
        let page = Page::start(LIMITS).await;
        let http = client();
        let rebound = format!("rebind.example:{}", page.addr.port());
        for path in ["/api/queue", "/api/items/0/image", "/"] {
            let (status, body) = answer(http.get(page.url(path)).header("host", &rebound).call());
            assert_eq!(status, 403, "{path}: {body}");
            assert!(body.contains("DNS-rebinding"), "{body}");
        }
        let response = http.get(page.url("/api/queue")).call().unwrap();
        let corp = response.headers().get("cross-origin-resource-policy");
        assert_eq!(corp.and_then(|v| v.to_str().ok()), Some("same-origin"));
        let (status, body) = answer(Ok(response));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"left\":1"), "{body}");

        let skip = page.url("/api/items/0/skip");
        let (status, body) = answer(http.post(&skip).send_empty());
        assert_eq!(status, 415, "{body}");
        assert!(body.contains("application/json"), "{body}");
        let (status, _) = answer(
            http.post(&skip)
                .header("content-type", "text/plain")
                .send("{}"),
        );
        assert_eq!(status, 415);
        let json = |request: ureq::RequestBuilder<ureq::typestate::WithBody>| {
            answer(
                request
                    .header("content-type", "application/json")
                    .send("{}"),
            )
        };
        let cross = [
            ("origin", "http://attacker.example"),
            ("origin", "null"),
            ("sec-fetch-site", "cross-site"),
        ];
        for (name, value) in cross {
            let (status, body) = json(http.post(&skip).header(name, value));
            assert_eq!(status, 403, "{name}: {value}: {body}");
            let (status, _) = json(http.post(page.url("/api/undo")).header(name, value));
            assert_eq!(status, 403);
        }
        assert_eq!(page.queue.counts().left, 1, "nothing was skipped");

        // The page's own requests.
        let (status, body) = json(http.post(page.url("/api/undo")));
        assert_eq!(
            (status, body.contains("nothing to undo")),
            (409, true),
            "{body}"
        );
        let (status, body) = json(
            http.post(&skip)
                .header("origin", format!("http://{}", page.addr))
                .header("sec-fetch-site", "same-origin"),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(page.queue.counts().left, 0);

        let response = http.get(page.url("/")).call().unwrap();
        let framing = response.headers().get("x-frame-options");
        assert_eq!(framing.and_then(|v| v.to_str().ok()), Some("DENY"));
        let (_, html) = answer(Ok(response));
        assert!(
            html.contains("if (body === undefined && method !== \"GET\") body = {};")
                && html.contains("init.headers[\"content-type\"] = \"application/json\";"),
            "the page sends every POST as JSON"
        );
    }

    /// Connections to the page are capped and a silent one is closed at the header timeout;
    /// the page is then served again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_caps_connections_and_closes_silent_ones() {
        let limits = ConnectionLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(1),
            ..LIMITS
        };
        let page = Page::start(limits).await;
        let connect = || {
            let stream = std::net::TcpStream::connect(page.addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            stream
        };
        let read_all = |mut stream: std::net::TcpStream| {
            let mut all = Vec::new();
            if let Err(e) = stream.read_to_end(&mut all) {
                assert_eq!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset,
                    "not closed: {e}"
                );
            }
            String::from_utf8_lossy(&all).into_owned()
        };
        let mut silent = connect();
        silent.write_all(b"GET /api/queue HTTP/1.1\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let busy = read_all(connect());
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        let started = Instant::now();
        assert!(!read_all(silent).contains("200 OK"));
        assert!(started.elapsed() < Duration::from_secs(4));
        let (status, body) = answer(client().get(page.url("/api/queue")).call());
        assert_eq!(status, 200, "{body}");
    }
}
