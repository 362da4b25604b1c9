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
use crate::inference::http::error;

/// The page, one self-contained file (no scripts or fonts from elsewhere).
const PAGE: &str = include_str!("page.html");

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
        .with_state(app)
}

/// Serves the page on `listener` until `stop` becomes true (or its sender is dropped).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "labelling page listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })
        .await
}

fn queue_error(e: QueueError) -> Response {
    let status = match &e {
        QueueError::Unknown(_) => StatusCode::NOT_FOUND,
        QueueError::Class { .. } => StatusCode::BAD_REQUEST,
        QueueError::NothingToUndo => StatusCode::CONFLICT,
        QueueError::Io { .. } => {
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
    #[test]
    fn the_login_comparison_needs_every_byte() {
        assert!(super::same(b"fedge:pw", b"fedge:pw"));
        assert!(!super::same(b"fedge:pw", b"fedge:pX"));
        assert!(!super::same(b"fedge:pw", b"fedge:p"));
    }
}
