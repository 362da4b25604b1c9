//! Predictions on the device: the inference endpoint over real HTTP (ureq, a blocking client
//! on the test's thread, the server on a runtime of its own) must answer exactly what
//! `Predictor::predict_bytes` answers. (`fedge-edge predict` is tested in `edge/tests/`, where
//! cargo builds the binary for the test.)

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use fedge_edge::inference::http::{SharedPredictor, current, install, serve, shared};
use fedge_edge::inference::{Prediction, Predictor};
use fedge_models::{Backbone, HeadConfig};
use fedge_wire::{ModelRelease, TensorF32};
use serde_json::Value;

use crate::common;

pub(crate) fn backbone() -> Arc<Backbone> {
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    Arc::new(fedge_edge::features::load_backbone(&card).unwrap().0)
}

fn release(round: u64) -> ModelRelease {
    let head = HeadConfig::new(512, 10).with_hidden(16);
    let params = head.init_flat(round);
    ModelRelease {
        pooled: None,
        federation: "demo".into(),
        run: 3,
        round,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| format!("digit-{k}")).collect(),
        backbone: "digits-conv".into(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    }
}

/// Digit `index` of the built-in set as an 8-bit grayscale PNG.
fn digit_png(index: usize) -> Vec<u8> {
    let set = fedge_edge::data::digits_domains(&[0.0], 1).remove(0).data;
    png_of(&set.images[index * 64..(index + 1) * 64], set.raw_max)
}

/// Checks a JSON prediction against the predictor's own, logits within 1e-6.
fn assert_same(json: &Value, expected: &Prediction) {
    assert_eq!(json["class"], expected.class.as_str(), "{json}");
    assert_eq!(json["index"], expected.index, "{json}");
    assert_eq!(json["model_round"], expected.model_round, "{json}");
    let logits: Vec<f64> = json["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(logits.len(), expected.logits.len());
    for (got, want) in logits.iter().zip(&expected.logits) {
        assert!((got - f64::from(*want)).abs() <= 1e-6, "{json}");
    }
    let top: Vec<&str> = json["top_k"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["class"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = expected.top_k.iter().map(|s| s.class.as_str()).collect();
    assert_eq!(top, want);
}

/// The endpoint on a loopback port, on a runtime of its own.
pub(crate) struct Server {
    runtime: tokio::runtime::Runtime,
    pub(crate) base: String,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub(crate) fn start(state: SharedPredictor) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = runtime.spawn(serve(listener, state, stopped));
        Self {
            runtime,
            base,
            stop,
            task,
        }
    }

    /// Stops the server; it must end promptly and cleanly.
    pub(crate) fn stop(self) {
        self.stop.send(true).unwrap();
        let ended = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), self.task).await });
        ended.expect("the server stops").unwrap().unwrap();
    }
}

pub(crate) fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Status and body of a request.
pub(crate) fn answer(
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> (u16, String) {
    let mut response = response.unwrap();
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap();
    (status, body)
}

pub(crate) fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn the_endpoint_answers_what_the_predictor_answers() {
    let state = shared(None);
    let server = Server::start(Arc::clone(&state));
    let http = client();
    let url = |path: &str| format!("{}{path}", server.base);
    let post = |path: &str, body: &[u8]| answer(http.post(url(path)).send(body));
    let png = digit_png(0);

    // Before any release: alive, but no model.
    let (status, body) = answer(http.get(url("/healthz")).call());
    assert_eq!(status, 200);
    assert!(body.starts_with("ok") && body.contains("none"), "{body}");
    for (status, body) in [
        answer(http.get(url("/v1/model")).call()),
        post("/v1/predict", &png),
    ] {
        assert_eq!(status, 503, "{body}");
        assert!(json(&body)["error"].as_str().unwrap().contains("no model"));
    }

    let backbone = backbone();
    let direct = Predictor::new(Arc::clone(&backbone), release(4), None).unwrap();
    install(
        &state,
        Predictor::new(Arc::clone(&backbone), release(4), None).unwrap(),
    );
    let (status, body) = answer(http.get(url("/healthz")).call());
    assert_eq!((status, body.contains("round 4")), (200, true), "{body}");
    let (status, body) = answer(http.get(url("/v1/model")).call());
    assert_eq!(status, 200, "{body}");
    let model = json(&body);
    assert_eq!(model["round"], 4);
    assert_eq!(model["federation"], "demo");
    // Hex: the 64-bit run is past JavaScript's safe integers.
    assert_eq!(model["run"], format!("{:016x}", release(4).run));
    assert_eq!(model["backbone"], "digits-conv");
    assert_eq!(model["sha256"], release(4).sha256_hex());
    assert_eq!(model["classes"].as_array().unwrap().len(), 10);

    // Real digits: the same class, top classes and logits as in process.
    for index in [0, 1, 2, 7] {
        let png = digit_png(index);
        let (status, body) = post("/v1/predict", &png);
        assert_eq!(status, 200, "{body}");
        assert_same(&json(&body), &direct.predict_bytes(&png, 3).unwrap());
    }
    let (status, body) = post("/v1/predict?top_k=1", &png);
    assert_eq!(status, 200);
    assert_same(&json(&body), &direct.predict_bytes(&png, 1).unwrap());
    let (_, body) = post("/v1/predict?top_k=50", &png);
    assert_eq!(json(&body)["top_k"].as_array().unwrap().len(), 10);
    // The same image as a form upload, as curl sends one (-F), and as an HTML form would.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &png).unwrap();
    let form = |field: &str| {
        let part = format!("{field}=@{}", file.path().display());
        let out = std::process::Command::new("curl")
            .args(["-s", "-F", "note=from a form", "-F", &part])
            .arg(url("/v1/predict?top_k=1"))
            .output()
            .expect("curl (apt-get install curl)");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_same(
        &json(&form("image")),
        &direct.predict_bytes(&png, 1).unwrap(),
    );
    assert_same(
        &json(&form("upload")),
        &direct.predict_bytes(&png, 1).unwrap(),
    );

    // Bad requests say what to send.
    for (path, body, status, says) in [
        (
            "/v1/predict",
            &b"GIF89a, not really"[..],
            400,
            "PNG or JPEG",
        ),
        ("/v1/predict", &png[..png.len() / 2], 400, "PNG or JPEG"),
        ("/v1/predict", &[][..], 400, "empty"),
        ("/v1/predict?top_k=0", &png[..], 400, "top_k"),
    ] {
        let (got, answer) = post(path, body);
        assert_eq!(got, status, "{answer}");
        assert!(
            json(&answer)["error"].as_str().unwrap().contains(says),
            "{answer}"
        );
    }
    let mut wide = Cursor::new(Vec::new());
    image::GrayImage::new(9000, 2)
        .write_to(&mut wide, image::ImageFormat::Png)
        .unwrap();
    let (status, body) = post("/v1/predict", wide.get_ref());
    assert_eq!(status, 422, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("9000x2"));
    // Over the default 16 MiB: refused on its length, before the body is sent. Asked over a
    // bare connection that announces the length and waits for "100 Continue" as long as it
    // takes: an HTTP client that starts sending after a short wait (ureq on a loaded machine)
    // finds the connection closed after the 413 went out and never reads it.
    let (status, body) = {
        use std::io::{Read, Write};
        let addr = server.base.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let head = format!(
            "POST /v1/predict HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
             application/octet-stream\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\
             Connection: close\r\n\r\n",
            17u64 << 20
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        // Until the server closes the connection (or the timeout, with what arrived).
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).to_string();
        let status: u16 = (text.split_whitespace().nth(1))
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
        let json_body = match (text.find('{'), text.rfind('}')) {
            (Some(start), Some(end)) => text[start..=end].to_owned(),
            _ => text.clone(),
        };
        (status, json_body)
    };
    assert_eq!(status, 413, "{body}");
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("max_body_mb")
    );

    // A new release replaces the model for the next request.
    install(
        &state,
        Predictor::new(Arc::clone(&backbone), release(5), None).unwrap(),
    );
    let (_, body) = answer(http.get(url("/v1/model")).call());
    assert_eq!(json(&body)["round"], 5);
    let (_, body) = post("/v1/predict", &png);
    assert_eq!(json(&body)["model_round"], 5);
    assert_eq!(json(&body)["model_sha256"], release(5).sha256_hex());

    server.stop();
}

/// An 8-bit grayscale PNG of one 8×8 image on the raw scale `max`.
pub(crate) fn png_of(raw: &[f32], max: f32) -> Vec<u8> {
    let pixels = raw
        .iter()
        .map(|v| (v * 255.0 / max).round().clamp(0.0, 255.0) as u8)
        .collect();
    let mut out = Cursor::new(Vec::new());
    image::GrayImage::from_raw(8, 8, pixels)
        .unwrap()
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

/// The drift alarm behind the endpoint: a deployed clean site whose reference is half of its
/// images serves the other half over HTTP without an alarm, then the same images through a
/// blurred sensor, and the alarm comes within a few dozen requests, counted in the metrics.
#[test]
fn requests_through_a_new_sensor_raise_the_drift_alarm() {
    use fedge::datasets::SENSORS;
    let backbone = backbone();
    let all = fedge_edge::data::load_digits();
    let mut parts = all.partition(SENSORS.len(), 3);
    let deployed = parts.pop().unwrap();
    let features = |set: &fedge_edge::data::ImageSet| {
        backbone
            .features_of(&set.images, (1, 8, 8), set.raw_max, 64)
            .unwrap()
    };
    // The federation: five sites, each through its own sensor.
    let (mut rows, mut labels) = (Vec::new(), Vec::new());
    for (i, (part, sensor)) in parts.iter().zip(&SENSORS).enumerate() {
        rows.extend(features(&sensor.apply(part, i as u64)));
        labels.extend_from_slice(&part.labels);
    }
    let pooled = fedge_wire::FeatureSummary::of_rows(512, 10, rows.chunks_exact(512), &labels);
    let pooled = pooled.unwrap();
    let site_stats = pooled.balanced_stats();
    let release = ModelRelease {
        pooled: Some(pooled),
        feature_norm: fedge_wire::FeatureNorm::Pooled,
        ..release(4)
    };
    let metrics = Arc::new(fedge_edge::metrics::EdgeMetrics::default());
    let watch = Arc::new(fedge_edge::inference::DriftWatch::new(Some(Arc::clone(
        &metrics,
    ))));
    let predictor = Predictor::new(Arc::clone(&backbone), release, site_stats).unwrap();
    let (reference, served) = deployed.split(0.5, 3);
    watch.restart(predictor.distances(&features(&SENSORS[0].apply(&reference, 9))));
    let state = shared(None);
    install(&state, predictor.with_drift(Arc::clone(&watch)));
    let server = Server::start(Arc::clone(&state));
    let http = client();
    let url = format!("{}/v1/predict", server.base);
    let post = |png: Vec<u8>| {
        let (status, body) = answer(http.post(&url).send(&png[..]));
        assert_eq!(status, 200, "{body}");
        json(&body)
    };
    let clean = SENSORS[0].apply(&served, 9);
    for raw in clean.images.chunks_exact(64) {
        let p = post(png_of(raw, clean.raw_max));
        assert!(p["distance"].as_f64().unwrap() > 0.0, "{p}");
    }
    let quiet = watch.snapshot().unwrap();
    assert_eq!(quiet.alarms, 0, "{quiet:?}");
    assert_eq!(quiet.requests as usize, clean.len());
    let blurred = SENSORS.iter().find(|s| s.name == "blurred").unwrap();
    let shifted = blurred.apply(&served, 9);
    let caught = (shifted.images.chunks_exact(64))
        .position(|raw| {
            post(png_of(raw, shifted.raw_max));
            watch.snapshot().unwrap().alarms > 0
        })
        .expect("the alarm within the site's images");
    assert!(caught < 50, "alarm after {} requests", caught + 1);
    // The requests after the alarm are kept for the site to re-estimate its statistics from,
    // without another alarm meanwhile.
    let mut sent = 0;
    let window = loop {
        if let Some(window) = watch.take_window() {
            break window;
        }
        let raw = shifted
            .images
            .chunks_exact(64)
            .nth(sent % shifted.len())
            .unwrap();
        post(png_of(raw, shifted.raw_max));
        sent += 1;
        assert!(sent <= 300, "no window after {sent} requests");
    };
    let recent = fedge_edge::inference::drift::RECENT_REQUESTS;
    assert_eq!((sent, window.len()), (recent, recent * 512));
    assert_eq!(watch.snapshot().unwrap().alarms, 1);
    let exposition = metrics.encode();
    assert!(
        exposition.contains("fedge_edge_drift_alarms_total 1"),
        "{exposition}"
    );
    server.stop();
}

/// After an alarm, the window of requests since it: a `balanced` release is served with
/// statistics re-estimated from it, a `pooled` one keeps the federation's; either way the
/// drift watch keeps the site's own rows as its reference (a camera that stays changed stays
/// drifted until the site says the change is its new normal).
#[test]
fn after_an_alarm_a_site_re_estimates_only_statistics_that_are_its_own() {
    use fedge::datasets::SENSORS;
    use fedge_edge::agent::serve;
    let dir = tempfile::tempdir().unwrap();
    let setup = common::serving_setup(dir.path());
    let backbone = setup.serving.backbone.clone().expect("kept to serve");
    let pooled = fedge_device::site_norm::summary_of(&setup.train, 10).unwrap();
    // The site's window after a switch to the blurred sensor: 256 requests' raw features.
    let blurred = SENSORS.iter().find(|s| s.name == "blurred").unwrap();
    let digits = fedge_edge::data::load_digits();
    let shifted = blurred.apply(&digits.subset(&(0..256).collect::<Vec<_>>()), 1);
    let window = backbone
        .features_of(&shifted.images, (1, 8, 8), shifted.raw_max, 64)
        .unwrap();
    for (norm, re_estimated) in [
        (fedge_wire::FeatureNorm::Balanced, true),
        (fedge_wire::FeatureNorm::Pooled, false),
    ] {
        let release = ModelRelease {
            pooled: Some(pooled.clone()),
            feature_norm: norm,
            ..release(4)
        };
        let stats = fedge_device::site_norm::release_stats(&release, &setup.train, &setup.val);
        serve::install(&setup, &release, stats.as_ref());
        let before = current(&setup.serving.predictor).unwrap();
        serve::readapt(&setup, window.clone());
        let after = current(&setup.serving.predictor).unwrap();
        let drift = setup.serving.drift.snapshot().unwrap();
        assert_eq!(
            drift.reference as usize,
            (setup.train.len() + setup.val.len()).min(fedge_device::drift::MAX_REFERENCE),
            "{norm:?}: the reference stays the site's own rows"
        );
        assert_eq!(drift.adaptations, u64::from(re_estimated), "{norm:?}");
        let moved = after.site_stats().unwrap().mean != before.site_stats().unwrap().mean;
        assert_eq!(moved, re_estimated, "{norm:?}");
        assert_eq!(after.release().round, 4);
    }
}

/// The site's own command to re-adapt and the drift state, over HTTP: `POST /v1/drift/readapt`
/// makes the next requests the window, as an alarm does; `GET /v1/drift` says where the watch
/// stands; a release without a pooled summary has no watch to ask.
#[test]
fn the_drift_watch_answers_over_http_and_takes_the_site_s_command_to_re_adapt() {
    let backbone = backbone();
    let digits = fedge_edge::data::load_digits();
    let features = backbone
        .features_of(&digits.images, (1, 8, 8), digits.raw_max, 64)
        .unwrap();
    let pooled =
        fedge_wire::FeatureSummary::of_rows(512, 10, features.chunks_exact(512), &digits.labels);
    let watched = ModelRelease {
        pooled,
        feature_norm: fedge_wire::FeatureNorm::Pooled,
        ..release(4)
    };
    let stats = watched.pooled.as_ref().unwrap().balanced_stats();
    let watch = Arc::new(fedge_edge::inference::DriftWatch::new(None));
    let predictor = Predictor::new(Arc::clone(&backbone), watched, stats).unwrap();
    watch.restart(predictor.distances(&features));
    let state = shared(None);
    install(&state, predictor.with_drift(Arc::clone(&watch)));
    let server = Server::start(Arc::clone(&state));
    let http = client();
    let url = |path: &str| format!("{}{path}", server.base);
    let (status, body) = answer(http.get(url("/v1/drift")).call());
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["requests"], 0);
    assert_eq!(json(&body)["reference"], 1797);
    let (status, body) = answer(http.post(url("/v1/drift/readapt")).send_empty());
    assert_eq!(status, 202, "{body}");
    let (status, _) = answer(http.post(url("/v1/drift/readapt")).send_empty());
    assert_eq!(status, 409, "one window at a time");
    let recent = fedge_edge::inference::drift::RECENT_REQUESTS;
    for index in 0..recent {
        assert!(
            watch.take_window().is_none(),
            "not before {recent} requests"
        );
        let (status, body) = answer(http.post(url("/v1/predict")).send(&digit_png(index)[..]));
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(watch.take_window().map(|w| w.len()), Some(recent * 512));
    let (_, body) = answer(http.get(url("/v1/drift")).call());
    assert_eq!(json(&body)["requests"], recent);
    // The site's command makes the window its new normal: the reference once re-estimated.
    assert_eq!(json(&body)["reference"], 1797);
    watch.adapted(vec![1.0; recent], true);
    let (_, body) = answer(http.get(url("/v1/drift")).call());
    assert_eq!(json(&body)["reference"], recent);
    // A release without a pooled summary: nothing watched.
    install(&state, Predictor::new(backbone, release(5), None).unwrap());
    let (status, body) = answer(http.get(url("/v1/drift")).call());
    assert_eq!(status, 404, "{body}");
    server.stop();
}

/// Serves release 4 on `served` over HTTP and checks each digit's answer against `reference`'s
/// predictor in process: the same class and top classes, logits within `tolerance` (another
/// engine's features, e.g. ONNX Runtime's against tract's).
pub(crate) fn serve_and_compare(served: Arc<Backbone>, reference: Arc<Backbone>, tolerance: f64) {
    let state = shared(None);
    let server = Server::start(Arc::clone(&state));
    install(&state, Predictor::new(served, release(4), None).unwrap());
    let direct = Predictor::new(reference, release(4), None).unwrap();
    let http = client();
    for index in [0, 1, 2, 7, 9] {
        let png = digit_png(index);
        let (status, body) = answer(
            http.post(format!("{}/v1/predict", server.base))
                .send(&png[..]),
        );
        assert_eq!(status, 200, "{body}");
        let got = json(&body);
        let want = direct.predict_bytes(&png, 3).unwrap();
        assert_eq!(got["class"], want.class.as_str(), "{body}");
        let logits = got["logits"].as_array().unwrap();
        assert_eq!(logits.len(), want.logits.len());
        for (got, want) in logits.iter().zip(&want.logits) {
            let diff = (got.as_f64().unwrap() - f64::from(*want)).abs();
            assert!(diff <= tolerance, "logit off by {diff}: {body}");
        }
    }
    server.stop();
}
