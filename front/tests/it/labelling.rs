//! A site labels what its model was unsure of, and trains on it: the `fedge-coordinator` and
//! two `fedge-edge` agents over mosquitto (as in `use_model.rs`); site-b serves predictions
//! and keeps a labelling queue. After the first run, twelve images the federation has not seen
//! are sent to site-b's endpoint; in headless Chromium a person labels three on the page (a
//! key, Enter for the top guess, a click), undoes one (back on screen at once), and the site
//! folder holds the two labels under their classes. A second run's first rescan finds exactly
//! those two images and site-b trains on them. All the while, everything the broker carries
//! is captured: no image file crosses it. The page alone, over a queue of three, shows what
//! undo does at once.

use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use fantoccini::Locator;
use serde_json::Value;

use crate::common::browser::Browser;
use crate::common::capture::{Capture, Message};
use crate::common::{self, KillOnDrop};
use crate::use_model::{edge_binary, write_site};

const FEDERATION: &str = "labels";

fn write_coordinator(dir: &Path, port: u16, state: &str, rounds: u64) -> PathBuf {
    let classes: String = (0..10).map(|k| format!("{k}\n")).collect();
    std::fs::write(dir.join("classes.txt"), classes).unwrap();
    let config = format!(
        "federation = \"{FEDERATION}\"\nrounds = {rounds}\nmin_clients = 2\nmin_updates = 2\n\
         round_timeout_s = 60\nstate_dir = \"{state}\"\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [head]\nfeatures = 512\nhidden = 16\nclasses = 10\n\n\
         [model]\nclasses_file = \"classes.txt\"\nbackbone = \"digits-conv\"\n\n\
         [train]\nlocal_epochs = 3\nfeature_norm = \"site\"\n"
    );
    let path = dir.join(format!("{state}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

fn write_device(dir: &Path, id: &str, port: u16, tail: &str) -> PathBuf {
    let profile = format!(
        "client_id = \"{id}\"\nfederation = \"{FEDERATION}\"\nhidden = 16\nseed = 1\n\
         cache_dir = \"cache-{id}\"\nbackbone = {:?}\n\n\
         [broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [data]\nkind = \"imagefolder\"\nroot = \"{id}\"\nrescan = true\n\n{tail}",
        common::repo_root().join("models/assets/digits-conv.toml")
    );
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(&path, profile).unwrap();
    path
}

fn spawn(binary: &Path, config: &Path) -> KillOnDrop {
    crate::use_model::spawn(binary, &["run", "--config"], config)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn get_json(agent: &ureq::Agent, url: &str) -> Option<Value> {
    let mut response = agent.get(url).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()
}

/// Waits until `check` holds, polling every 200 ms, or fails after `within` saying `what`.
async fn until<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < end, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The labelled images in the site folder: `<class>/label-*.png`.
fn labelled(site: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = (std::fs::read_dir(site).unwrap().flatten())
        .filter(|e| e.path().is_dir())
        .flat_map(|class| std::fs::read_dir(class.path()).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("label-")
        })
        .collect();
    found.sort();
    found
}

/// The page's `left · labelled` counts, once they read `want`.
async fn counts_read(browser: &Browser, want: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let text = browser
            .client
            .find(Locator::Id("counts"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "the page's counts read {text:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn press(browser: &Browser, key: &str) {
    let body = browser.client.find(Locator::Css("body")).await.unwrap();
    body.send_keys(key).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_labels_on_the_page_and_the_site_trains_on_the_labels() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let Some(browser) = Browser::start().await else {
        return;
    };
    let port = mosquitto.port();
    let capture = Capture::start(port);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_site(&root.join("site-a"), 0, &[], 150);
    write_site(&root.join("site-b"), 2, &[], 150);
    // What site-b's camera sees after the federation trained: the same domain's other images.
    let unseen: Vec<PathBuf> = write_site(&root.join("incoming"), 2, &[], 162)
        .into_iter()
        .filter(|p| {
            !root
                .join("site-b")
                .join(p.strip_prefix(root.join("incoming")).unwrap())
                .exists()
        })
        .collect();
    assert_eq!(unseen.len(), 12);
    let free = || fedge_coordinator::io::broker::free_loopback_addr().unwrap();
    let (infer, page) = (free(), free());
    let devices = [
        write_device(root, "site-a", port, ""),
        write_device(
            root,
            "site-b",
            port,
            &format!("[inference]\nlisten = \"{infer}\"\n\n[labelling]\nlisten = \"{page}\"\n"),
        ),
    ];
    let agents: Vec<KillOnDrop> = devices.iter().map(|d| spawn(&edge_binary(), d)).collect();
    let mut first = spawn(
        &common::coordinator_binary(),
        &write_coordinator(root, port, "state-1", 2),
    );
    let status = first.0.wait().unwrap();
    assert!(status.success(), "first run: {status}");

    // site-b serves round 2's model; twelve unseen images are asked about.
    let http = agent();
    let base = format!("http://{infer}");
    until(Duration::from_secs(60), "site-b serves round 2", || {
        get_json(&http, &format!("{base}/v1/model")).filter(|m| m["round"] == 2)
    })
    .await;
    for image in &unseen {
        let response = http
            .post(format!("{base}/v1/predict"))
            .header("content-type", "image/png")
            .send(std::fs::read(image).unwrap())
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    // The JSON API: every one waits (200 places), most uncertain first.
    let queue = get_json(&http, &format!("http://{page}/api/queue")).expect("the queue");
    let items = queue["items"].as_array().unwrap();
    assert_eq!(items.len(), 12, "{queue}");
    assert_eq!(queue["classes"].as_array().unwrap().len(), 10);
    let uncertainty: Vec<f64> = items
        .iter()
        .map(|i| i["uncertainty"].as_f64().unwrap())
        .collect();
    assert!(
        uncertainty.windows(2).all(|w| w[0] >= w[1]),
        "{uncertainty:?}"
    );
    assert!(
        items
            .iter()
            .all(|i| i["guesses"].as_array().unwrap().len() == 3)
    );

    // The page, in a real browser: a key, Enter, a click; then undo.
    let client = &browser.client;
    client.goto(&format!("http://{page}/")).await.unwrap();
    counts_read(&browser, "12 left · 0 labelled").await;
    press(&browser, "7").await;
    counts_read(&browser, "11 left · 1 labelled").await;
    press(&browser, "\u{E007}").await;
    counts_read(&browser, "10 left · 2 labelled").await;
    let third = shown(&browser, None).await;
    let guess = client.find(Locator::Css("#guesses button")).await.unwrap();
    guess.click().await.unwrap();
    counts_read(&browser, "9 left · 3 labelled").await;
    let fourth = shown(&browser, Some(&third)).await;
    assert_eq!(labelled(&root.join("site-b")).len(), 3);
    client
        .find(Locator::Id("undo"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    counts_read(&browser, "10 left · 2 labelled").await;
    // The undone input is back on screen at once.
    shows(&browser, &third, &fourth).await;
    let screenshot = client.screenshot().await.unwrap();
    let shot = common::repo_root().join("target/labelling-page.png");
    std::fs::write(&shot, &screenshot).unwrap();
    browser.close().await;

    // The site folder: the key's label under class "7" (a class named by a key has that key),
    // one more.
    let files = labelled(&root.join("site-b"));
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files.iter().any(|f| f.parent().unwrap().ends_with("7")),
        "{files:?}"
    );
    for file in &files {
        assert!(
            unseen
                .iter()
                .any(|u| std::fs::read(u).unwrap() == std::fs::read(file).unwrap())
        );
    }

    // A second run: site-b's first rescan finds the two labelled images and it trains on them.
    let mut second = spawn(
        &common::coordinator_binary(),
        &write_coordinator(root, port, "state-2", 1),
    );
    let status = second.0.wait().unwrap();
    assert!(status.success(), "second run: {status}");
    drop(agents);
    let seen = capture.stop();
    let news: Vec<u64> = (statuses(&seen, "site-b").iter())
        .filter_map(|s| s["new_samples"].as_u64())
        .collect();
    assert!(news.contains(&2), "site-b's rescans found {news:?}");
    // The broker hears of the queue in counts only.
    // The last status of the running device (the Last Will, offline, carries no counts: it
    // was made at connection).
    let last = (statuses(&seen, "site-b").into_iter().rev())
        .find(|s| s["online"] == true)
        .expect("a status of the running device");
    assert!(
        (statuses(&seen, "site-b").iter()).all(|s| s["online"] == true || s["labelling"].is_null())
    );
    assert_eq!(
        last["labelling"],
        serde_json::json!({"waiting": 10, "labelled": 2})
    );
    assert!(updates(&seen, "site-b") >= 3, "site-b trained in both runs");
    // Nothing of an image crossed the broker: no PNG signature, none of the files' bytes.
    assert!(seen.len() > 20);
    let carried: Vec<u8> = seen
        .iter()
        .flat_map(|m| m.payload.iter().copied())
        .collect();
    let holds = |needle: &[u8]| carried.windows(needle.len()).any(|w| w == needle);
    assert!(!holds(b"\x89PNG\r\n\x1a\n"), "a PNG file on the broker");
    for image in unseen.iter().take(3) {
        let bytes = std::fs::read(image).unwrap();
        assert!(
            !holds(&bytes[bytes.len() - 40..]),
            "{} on the broker",
            image.display()
        );
    }
}

/// The JSON statuses `client` published.
fn statuses(seen: &[Message], client: &str) -> Vec<Value> {
    let topic = fedge_wire::Topics::new(FEDERATION)
        .unwrap()
        .edge_status(client);
    (seen.iter())
        .filter(|m| m.topic == topic)
        .filter_map(|m| serde_json::from_slice(&m.payload).ok())
        .collect()
}

/// How many update messages (or first chunks) `client` published.
fn updates(seen: &[Message], client: &str) -> usize {
    let topic = fedge_wire::Topics::new(FEDERATION).unwrap().update(client);
    let first_chunk = format!("{topic}/0");
    (seen.iter())
        .filter(|m| m.topic == topic || m.topic == first_chunk)
        .count()
}

/// The page alone over a queue of three inputs (a release with three classes, no federation):
/// after a label and `U`, the input whose label was undone is on screen at once, not the one
/// that followed it, and labelling it again takes the key's class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_shows_the_undone_input_at_once() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let classes: Vec<String> = ["bolt", "nut", "washer"].map(String::from).to_vec();
    let queue = fedge_edge::labelling::LabelQueue::open(fedge_edge::labelling::QueueSettings {
        dir: dir.path().join("queue"),
        site: dir.path().join("site"),
        capacity: 8,
        random_share: 0.0,
        max_bytes: 1 << 20,
    })
    .unwrap();
    // Three inputs, from the least sure (shown first) to the surest.
    for (i, logits) in [[1.0, 0.95, 0.0], [2.0, 1.0, 0.0], [6.0, 0.0, 0.0]]
        .into_iter()
        .enumerate()
    {
        let image = image::GrayImage::from_pixel(8, 8, image::Luma([40 * i as u8]));
        let mut png = std::io::Cursor::new(Vec::new());
        image.write_to(&mut png, image::ImageFormat::Png).unwrap();
        let prediction = fedge_edge::inference::Prediction {
            class: "bolt".into(),
            index: 0,
            probability: 0.5,
            top_k: Vec::new(),
            logits: logits.to_vec(),
            model_round: 1,
            model_sha256: String::new(),
            distance: None,
            unfamiliar: None,
            variant: fedge_wire::SiteVariant::Release,
        };
        assert!(queue.offer(png.get_ref(), &prediction, &classes).unwrap());
    }
    let card = common::repo_root().join("models/assets/digits-conv.toml");
    let backbone = std::sync::Arc::new(fedge_edge::features::load_backbone(&card).unwrap().0);
    let head = fedge_wire::HeadConfig::new(512, 3).with_hidden(4);
    let params = head.init_flat(1);
    let release = fedge_wire::ModelRelease {
        pooled: None,
        federation: "labels".into(),
        run: 1,
        round: 1,
        strategy: "fedavg".into(),
        classes: classes.clone(),
        backbone: "digits-conv".into(),
        sha256: fedge_wire::ModelRelease::digest(&params),
        params: fedge_wire::TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    };
    let predictor = fedge_edge::inference::Predictor::new(backbone, release, None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = listener.local_addr().unwrap();
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let router = fedge_edge::labelling::http::router(
        std::sync::Arc::new(queue),
        fedge_edge::inference::http::shared(Some(predictor)),
        None,
    );
    tokio::spawn(fedge_edge::labelling::http::serve(listener, router, stop));

    let client = &browser.client;
    client.goto(&format!("http://{page}/")).await.unwrap();
    counts_read(&browser, "3 left · 0 labelled").await;
    let first = shown(&browser, None).await;
    // Keys: the classes have no one-key names, so 1, 2, 3 in order.
    press(&browser, "2").await;
    counts_read(&browser, "2 left · 1 labelled").await;
    let second = shown(&browser, Some(&first)).await;
    press(&browser, "u").await;
    counts_read(&browser, "3 left · 0 labelled").await;
    shows(&browser, &first, &second).await;
    // Labelled anew, as the person meant it this time.
    press(&browser, "3").await;
    counts_read(&browser, "2 left · 1 labelled").await;
    browser.close().await;
    let files = labelled(&dir.path().join("site"));
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].parent().unwrap().ends_with("washer"), "{files:?}");
}

/// Waits until the page shows `undone` again after an undo, failing if it keeps `next` (the
/// input that followed it) or anything else for 5 s.
async fn shows(browser: &Browser, undone: &str, next: &str) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let now = shown(browser, None).await;
        if now == undone {
            return;
        }
        assert!(
            Instant::now() < end,
            "after undo the page shows {now:?} (the next input is {next:?}), not the undone \
             input {undone:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `src` of the input on the page, once it differs from `not` (within 10 s).
async fn shown(browser: &Browser, not: Option<&str>) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let image = browser.client.find(Locator::Id("image")).await.unwrap();
        let src = image.attr("src").await.unwrap().unwrap_or_default();
        if !src.is_empty() && Some(src.as_str()) != not {
            return src;
        }
        assert!(Instant::now() < end, "the page still shows {src:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
