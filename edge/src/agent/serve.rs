//! The driver's side of the released model: the one kept on disk is restored at start, each
//! one the machine chooses to serve (a newer one, or an older one again after a rollback) is
//! kept and installed for predictions, and prediction requests arrive over HTTP
//! (`crate::inference::http`) or MQTT (here: `edge/<id>/infer/request`, answered on
//! `edge/<id>/infer/response`).
//!
//! Predictions run on tokio's blocking pool, like training: neither waits for the other
//! beyond one backbone batch.

use std::sync::Arc;

use base64::Engine as _;
use fedge_wire::{FeatureNorm, ModelRelease, Topics};
use rumqttc::{AsyncClient, QoS};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::setup::AgentSetup;
use crate::inference::config::ListenError;
use crate::inference::{Prediction, Predictor, http, serving_log, store};
use fedge_device::site_choice::SiteServing;
use fedge_device::site_norm::FeatureStats;

/// The release kept in the device's model file, if there is one that verifies (a damaged or
/// altered file is logged and left for the next release to replace).
pub fn restore(setup: &AgentSetup) -> Option<ModelRelease> {
    let path = setup.serving.model_file.as_deref()?;
    match store::load(path) {
        // A kept release of another federation (the profile changed) is not this one's model.
        Ok(Some(release)) if release.federation != setup.federation => {
            tracing::warn!(
                client = %setup.client_id,
                path = %path.display(),
                "the kept model belongs to federation {:?}, not {:?}: ignored until a release arrives",
                release.federation,
                setup.federation
            );
            None
        }
        Ok(release) => release,
        Err(e) => {
            tracing::warn!(client = %setup.client_id, "{e}");
            None
        }
    }
}

/// Keeps `release`, which the device serves from now (a newer one, or an older one again after
/// a rollback): written to the model file (a failure is logged; the release is still used) and,
/// when the device serves predictions, installed for them.
pub fn keep(setup: &AgentSetup, release: &ModelRelease, site: Option<&FeatureStats>) {
    if let Some(path) = &setup.serving.model_file
        && let Err(e) = store::save(path, release)
    {
        tracing::warn!(client = %setup.client_id, path = %path.display(), error = %e, "released model not kept on disk");
    }
    install(setup, release, site);
}

/// Puts `release` in front of the device's backbone for predictions (when it serves any);
/// `site` is this site's feature statistics for the release
/// (`fedge_device::train::DeviceData::serving_stats`), which a normalised head standardises
/// with.
pub fn install(setup: &AgentSetup, release: &ModelRelease, site: Option<&FeatureStats>) {
    // The round of the model the device holds, whether or not it serves predictions.
    setup.serving.metrics.model_round(release.round);
    // Every switch, whether or not the device answers predictions itself: the release its
    // status names as served.
    if let Some(log) = &setup.serving.serving_log
        && let Err(e) = serving_log::record(log, release, &fedge_mqtt::now_rfc3339())
    {
        tracing::warn!(client = %setup.client_id, path = %log.display(), error = %e, "the serving log was not written");
    }
    let Some(backbone) = &setup.serving.backbone else {
        return;
    };
    // A normalised head takes this site's features standardised with the site's statistics.
    let site = site
        .filter(|_| release.feature_norm != FeatureNorm::None)
        .cloned();
    let limits = crate::inference::ImageLimits::for_memory_budget(setup.memory_budget_mb);
    let tail = setup.tail.clone();
    match Predictor::with_tail_parts(Arc::clone(backbone), release.clone(), site, tail) {
        Ok(predictor) => {
            let distance = setup.serving.inference.unfamiliar_distance;
            // The drift alarm starts over with each release, its reference the device's own
            // rows measured against the release's pooled summary.
            let reference = predictor.distances(&setup.train.features).map(|mut d| {
                d.extend(predictor.distances(&setup.val.features).unwrap_or_default());
                d
            });
            setup.serving.drift.restart(reference);
            // The release as it is until the site's variant is chosen.
            let reason = match setup.serving.inference.adapt {
                fedge_wire::SiteAdapt::Off => "release: [inference] adapt = \"off\"",
                fedge_wire::SiteAdapt::Choose => "release: the site's variant is being chosen",
            };
            let stats = predictor.site_stats().cloned();
            let predictor = match predictor.adapted(SiteServing::release(stats, reason)) {
                Ok(predictor) => predictor,
                Err(e) => {
                    tracing::warn!(client = %setup.client_id, "cannot serve the released model: {e}");
                    return;
                }
            };
            setup
                .serving
                .metrics
                .site_variant(fedge_wire::SiteVariant::Release);
            let previous = http::current(&setup.serving.predictor);
            let predictor = served_by(setup, predictor)
                .with_limits(limits)
                .with_unfamiliar_distance(distance)
                .with_drift(Arc::clone(&setup.serving.drift));
            let predictor = beside_previous(setup, predictor, previous.as_deref());
            tracing::info!(client = %setup.client_id, round = release.round, sha256 = %release.sha256_hex(), "serving the released model");
            http::install(&setup.serving.predictor, predictor);
            setup.serving.metrics.serving(&release.sha256_hex());
        }
        Err(e) => {
            tracing::warn!(client = %setup.client_id, round = release.round, "cannot serve the released model: {e}");
        }
    }
}

/// The variant of the release the device serves, when it serves one.
pub fn choice(setup: &AgentSetup) -> Option<fedge_wire::SiteChoice> {
    http::current(&setup.serving.predictor).map(|p| p.choice())
}

/// `predictor` answering beside the release it replaces (`previous`, what served until now),
/// its answers counted in the device's head watch (`fedge_wire::head_check`): a variant of the
/// same release keeps the comparison it had; a release whose head reads other features or
/// classes, or one that replaced none, is compared with nothing.
pub(super) fn beside_previous(
    setup: &AgentSetup,
    predictor: Predictor,
    previous: Option<&Predictor>,
) -> Predictor {
    let watch = Arc::clone(&setup.serving.head);
    let Some(previous) = previous else {
        watch.restart(None);
        return predictor;
    };
    let sha256 = predictor.choice().sha256;
    if previous.choice().sha256 == sha256 {
        return match previous.shadow() {
            Some(shadow) => predictor.with_shadow(Arc::clone(shadow), watch),
            None => predictor,
        };
    }
    let (new, old) = (&predictor.release().head, &previous.release().head);
    let comparable = new.tail.is_none()
        && new.features == old.features
        && predictor.release().classes == previous.release().classes;
    match previous.as_shadow().filter(|_| comparable) {
        Some(shadow) => {
            let against = shadow.sha256.clone();
            watch.restart(Some(fedge_wire::HeadCheck::new(sha256, against)));
            predictor.with_shadow(Arc::new(shadow), watch)
        }
        None => {
            watch.restart(None);
            predictor
        }
    }
}

/// `predictor` telling the site's labelling queue of every image it answers, when there is
/// one.
pub(super) fn served_by(setup: &AgentSetup, predictor: Predictor) -> Predictor {
    match &setup.serving.labelling {
        Some(labelling) => predictor.with_served(Arc::clone(&labelling.queue) as _),
        None => predictor,
    }
}

/// After a drift alarm, the features of the requests since (`window`, flat): a site whose
/// release standardises with the site's own statistics (`feature_norm = "balanced"` or
/// `"site"`) re-estimates them from the window without labels (`balanced`: labelled by the
/// head, `fedge_device::site_norm::SiteNorm::unlabelled`) and serves with them from the next
/// request on. Other releases keep their statistics. Either way the drift watch takes the
/// window as its new reference.
pub fn readapt(setup: &AgentSetup, window: Vec<f32>) {
    let Some(current) = http::current(&setup.serving.predictor) else {
        return;
    };
    let release = current.release().clone();
    let f = release.head.features;
    let rows = window.len() / f.max(1);
    let set = fedge_device::FeatureSet {
        dim: f,
        labels: vec![0; rows],
        features: window,
    };
    let norm = fedge_device::site_norm::SiteNorm {
        norm: FeatureNorm::Balanced,
        pooled: release.pooled.as_ref(),
    };
    // Only a release whose statistics are the site's own has anything to re-estimate: under
    // `pooled` every site uses the federation's, which no change at the site makes stale
    // (and re-estimating them as `balanced` lost 1.6 points on digits-sensor, BENCHMARKS.md).
    let stats = match release.feature_norm {
        FeatureNorm::Balanced => norm.unlabelled(&set, &release.head, &release.params.to_vec()),
        FeatureNorm::Site => fedge_device::site_norm::stats_of(&[&set]),
        FeatureNorm::Pooled | FeatureNorm::None => None,
    };
    let reference = |p: &Predictor| p.distances(&set.features).unwrap_or_default();
    let Some(stats) = stats else {
        tracing::info!(client = %setup.client_id, norm = release.feature_norm.name(), "drift: the release's statistics are not the site's own; serving on with them, the requests since the alarm as the new reference");
        setup.serving.drift.adapted(reference(&current), false);
        return;
    };
    let Some(backbone) = &setup.serving.backbone else {
        return;
    };
    let limits = crate::inference::ImageLimits::for_memory_budget(setup.memory_budget_mb);
    let tail = setup.tail.clone();
    let reason =
        "release: the site's statistics re-estimated from the requests after a drift alarm";
    let built =
        Predictor::with_tail_parts(Arc::clone(backbone), release, Some(stats.clone()), tail)
            .and_then(|p| p.adapted(SiteServing::release(Some(stats), reason)));
    match built {
        Ok(predictor) => {
            setup
                .serving
                .metrics
                .site_variant(fedge_wire::SiteVariant::Release);
            let predictor = served_by(setup, predictor)
                .with_limits(limits)
                .with_unfamiliar_distance(setup.serving.inference.unfamiliar_distance)
                .with_drift(Arc::clone(&setup.serving.drift));
            let predictor = beside_previous(setup, predictor, Some(&current));
            setup.serving.drift.adapted(reference(&predictor), true);
            http::install(&setup.serving.predictor, predictor);
            tracing::info!(client = %setup.client_id, requests = rows, "drift: the site's statistics re-estimated from the requests after the alarm; serving with them");
        }
        Err(e) => {
            tracing::warn!(client = %setup.client_id, "drift: cannot serve with re-estimated statistics: {e}");
            setup.serving.drift.adapted(reference(&current), false);
        }
    }
}

/// Binds `[inference] listen` and serves the HTTP endpoint until `stop`; `Ok(None)` when the
/// profile asks for no server.
pub async fn start_http(
    setup: &AgentSetup,
    stop: watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<()>>, ListenError> {
    let config = setup.serving.inference.clone();
    let Some(listener) = config.bind().await? else {
        return Ok(None);
    };
    let predictor = setup.serving.predictor.clone();
    let client = setup.client_id.clone();
    let metrics = Some(Arc::clone(&setup.serving.metrics));
    let gate = setup.serving.gate.clone();
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = http::serve_with(listener, predictor, &config, metrics, gate, stop).await {
            tracing::error!(client = %client, error = %e, "the inference endpoint stopped");
        }
    })))
}

/// Binds `[labelling] listen` and serves the labelling page until `stop`; `Ok(None)` when the
/// profile keeps no queue.
pub async fn start_labelling(
    setup: &AgentSetup,
    stop: watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<()>>, crate::labelling::config::ListenError> {
    let Some(labelling) = &setup.serving.labelling else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(labelling.listen.as_str())
        .await
        .map_err(|source| crate::labelling::config::ListenError {
            listen: labelling.listen.clone(),
            source,
        })?;
    let router = crate::labelling::http::router(
        Arc::clone(&labelling.queue),
        setup.serving.predictor.clone(),
        labelling.login.clone(),
    );
    let client = setup.client_id.clone();
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = crate::labelling::http::serve(listener, router, stop).await {
            tracing::error!(client = %client, error = %e, "the labelling page stopped");
        }
    })))
}

/// The topic MQTT prediction requests arrive on, when the device takes them.
pub fn request_topic(setup: &AgentSetup, topics: &Topics) -> Option<String> {
    setup
        .serving
        .inference
        .mqtt
        .then(|| topics.infer_request(&setup.client_id))
}

/// A request on `edge/<id>/infer/request`: a JSON object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    /// Echoed in the response, so the asker can match them.
    #[serde(default)]
    id: serde_json::Value,
    /// The PNG or JPEG file, base64 (standard alphabet, padded or not).
    image: String,
    /// Best classes to list; `[inference] top_k` when absent.
    #[serde(default)]
    top_k: Option<usize>,
}

/// The answer on `edge/<id>/infer/response`: the request's id and the prediction, or an error.
#[derive(Debug, Serialize)]
struct Response {
    id: serde_json::Value,
    #[serde(flatten)]
    answer: Answer,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Answer {
    Prediction(Prediction),
    Error { error: String },
}

/// Answers an MQTT prediction request on the blocking pool; every request gets a response,
/// an error one for a request that is not JSON, carries no image, or arrives before any model.
pub fn answer_mqtt(setup: &AgentSetup, topics: &Topics, client: &AsyncClient, payload: &[u8]) {
    let topic = topics.infer_response(&setup.client_id);
    let default_top_k = setup.serving.inference.top_k;
    let max_bytes = setup.serving.inference.max_body_bytes();
    let predictor = http::current(&setup.serving.predictor);
    let client = client.clone();
    let metrics = Arc::clone(&setup.serving.metrics);
    // Bounded with the HTTP endpoint's predictions: one more is answered busy at once,
    // before its image is decoded.
    let Some(permit) = setup.serving.gate.try_enter() else {
        let busy = Response {
            id: payload_id(payload),
            answer: Answer::Error {
                error: setup.serving.gate.busy_message(),
            },
        };
        metrics.prediction("mqtt", false, 0.0);
        let body = serde_json::to_vec(&busy).unwrap_or_default();
        let _ = client.try_publish(topic, QoS::AtLeastOnce, false, body);
        return;
    };
    let request = payload_request(payload, max_bytes);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let started = std::time::Instant::now();
        let response = respond(request, predictor, default_top_k);
        let ok = matches!(response.answer, Answer::Prediction(_));
        metrics.prediction("mqtt", ok, started.elapsed().as_secs_f64());
        let body = serde_json::to_vec(&response).unwrap_or_default();
        let _ = client.try_publish(topic, QoS::AtLeastOnce, false, body);
    });
}

/// The `id` of a request, when it can be read (null otherwise).
fn payload_id(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v.get("id").cloned())
        .unwrap_or_default()
}

/// The request in a payload, or the error to answer with (and the id, when it could be read).
fn payload_request(
    payload: &[u8],
    max_bytes: usize,
) -> Result<Request, (serde_json::Value, String)> {
    // The base64 text is 4/3 of the image.
    if payload.len() > max_bytes.saturating_mul(4) / 3 + 1024 {
        return Err((
            serde_json::Value::Null,
            "the request is larger than the device's limit ([inference] max_body_mb): send a \
             smaller image"
                .into(),
        ));
    }
    serde_json::from_slice::<Request>(payload).map_err(|e| {
        (
            payload_id(payload),
            format!(
                "not a prediction request ({e}): send JSON {{\"id\": ..., \"image\": \
                 \"<base64 PNG or JPEG>\", \"top_k\": 3}}"
            ),
        )
    })
}

fn respond(
    request: Result<Request, (serde_json::Value, String)>,
    predictor: Option<Arc<Predictor>>,
    default_top_k: usize,
) -> Response {
    let (id, error) = match request {
        Err((id, error)) => (id, error),
        Ok(request) => {
            let answer = predict(&request, predictor, default_top_k);
            return Response {
                id: request.id,
                answer: match answer {
                    Ok(prediction) => Answer::Prediction(prediction),
                    Err(error) => Answer::Error { error },
                },
            };
        }
    };
    Response {
        id,
        answer: Answer::Error { error },
    }
}

fn predict(
    request: &Request,
    predictor: Option<Arc<Predictor>>,
    default_top_k: usize,
) -> Result<Prediction, String> {
    let predictor = predictor.ok_or(
        "no model has been received yet: the device answers once the coordinator has released \
         a head (after the first aggregated round)",
    )?;
    let top_k = match request.top_k {
        Some(0) => return Err("top_k must be 1 or more".into()),
        Some(k) => k,
        None => default_top_k,
    };
    let image = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(request.image.trim_end_matches('='))
        .map_err(|e| format!("image is not base64 ({e}): encode the PNG or JPEG file's bytes"))?;
    predictor
        .predict_bytes(&image, top_k)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_get_an_error_with_their_id() {
        let answer = |payload: &str| {
            let response = respond(payload_request(payload.as_bytes(), 1 << 20), None, 3);
            serde_json::to_value(&response).unwrap()
        };
        let r = answer("{\"id\": 7, \"image\": \"aGk=\"}");
        assert_eq!(r["id"], 7);
        assert!(r["error"].as_str().unwrap().contains("no model"), "{r}");
        let r = answer("{\"id\": \"a\", \"picture\": 1}");
        assert_eq!(r["id"], "a");
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .contains("not a prediction request")
        );
        let r = answer("garbage");
        assert_eq!(r["id"], serde_json::Value::Null);
        let big = format!("{{\"id\": 1, \"image\": \"{}\"}}", "A".repeat(2 << 20));
        assert!(
            answer(&big)["error"]
                .as_str()
                .unwrap()
                .contains("max_body_mb")
        );
    }
}
