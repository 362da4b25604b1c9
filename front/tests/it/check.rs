//! `fedge-edge check`: every shipped profile passes in dry-run mode, and each kind of
//! misconfiguration is reported with a message that says what to fix. `session.rs`: the check
//! at the broker, beside a running agent and against the federation's backbone.

mod session;

use std::path::{Path, PathBuf};

use fedge_edge::check::{Check, run_checks};

use crate::common;

fn failures(checks: &[Check]) -> Vec<(&'static str, String)> {
    checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| (c.name, c.detail.clone()))
        .collect()
}

/// A change to a profile's text.
type Edit = Box<dyn Fn(String) -> String>;

/// A copy of the generic profile with `edit` applied, in its own folder.
fn variant(dir: &Path, edit: impl FnOnce(String) -> String) -> PathBuf {
    common::profile_copy("generic-x86_64.toml", dir, edit)
}

#[test]
fn every_shipped_profile_passes_in_dry_run() {
    for path in common::shipped_profiles() {
        // Profiles name system folders for the cache; check them against a writable one. The
        // copy goes to a folder of its own, where other tests listing the profiles cannot see it.
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let mut text = String::new();
        let name = path.file_name().unwrap().to_string_lossy();
        let copy = common::profile_copy(&name, dir.path(), |original| {
            text = original
                .lines()
                .filter(|l| !l.starts_with("cache_dir"))
                .map(|l| format!("{l}\n"))
                .collect();
            format!("cache_dir = {cache:?}\n{text}")
        });
        let checks = run_checks(&copy, true);
        assert!(
            failures(&checks).is_empty(),
            "{}: {:?}",
            path.display(),
            failures(&checks)
        );
        // Twelve checks, and FedDDL's masks where the profile enables it.
        let others = checks.iter().filter(|c| c.name != "fedddl").count();
        assert_eq!(others, 12, "{checks:?}");
        let device = checks.iter().find(|c| c.name == "device").unwrap();
        if text.contains("device = \"cuda\"") && !fedge_models::CUDA_BUILT {
            // The Jetson profile in a CPU build: a pass that names the fallback.
            assert!(device.detail.contains("training on the CPU"), "{device:?}");
        }
    }
}

#[test]
fn each_misconfiguration_is_named_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // An image folder without boxes.csv: FedDDL's views cannot be built from it.
    let site = d.join("site");
    let digits = &fedge_edge::data::digits_domains(&[0.0], 5)[0].data;
    for i in 0..6 {
        let folder = site.join(digits.labels[i].to_string());
        std::fs::create_dir_all(&folder).unwrap();
        let pixels = digits.image(i);
        let img = image::GrayImage::from_fn(8, 8, |x, y| {
            image::Luma([(pixels[(y * 8 + x) as usize] * 15.0) as u8])
        });
        img.save(folder.join(format!("{i}.png"))).unwrap();
    }
    let folder = format!("kind = \"imagefolder\"\nroot = {site:?}");
    // The same folder with a half-written upload: listed, while the rest still loads.
    let live = d.join("live");
    for entry in std::fs::read_dir(&site).unwrap() {
        let class = entry.unwrap().path();
        let to = live.join(class.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for file in std::fs::read_dir(&class).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
        }
    }
    let first_class = std::fs::read_dir(&live)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(first_class.join("upload.png"), b"\x89PNG\r\n").unwrap();
    let live_folder = format!("kind = \"imagefolder\"\nroot = {live:?}");
    let cases: Vec<(Edit, &str, &str)> = vec![
        (
            Box::new(move |t| {
                t.replace("kind = \"digits\"\ndomain = \"rot15\"", &live_folder)
                    .replace("enabled = true", "enabled = false")
            }),
            "images",
            "upload.png",
        ),
        (
            Box::new(move |t| {
                let t = t.replace("kind = \"digits\"\ndomain = \"rot15\"", &folder);
                // FedDDL on, whether or not the shipped profile turns it on.
                match t.contains("\n[fedddl]\n") {
                    true => t,
                    false => t + "\n[fedddl]\nenabled = true\n",
                }
            }),
            "fedddl",
            "add boxes.csv",
        ),
        (
            Box::new(|t| t.replace("domain = \"rot15\"", "domain = \"rot99\"")),
            "data",
            "domain \"rot99\" not found",
        ),
        (
            Box::new(|t| t.replace("digits-conv.toml", "missing-card.toml")),
            "backbone",
            "missing-card.toml",
        ),
        (
            Box::new(|t| format!("key_file = \"nope.key\"\n{t}")),
            "key",
            "fedge-coordinator keygen",
        ),
        (
            Box::new(|t| format!("cache_dir = \"/proc/fedge-cache\"\n{t}")),
            "cache",
            "not writable",
        ),
        (
            Box::new(|t| t.replace("client_id = \"site-rot15\"", "client_id = \"bad id\"")),
            "profile",
            "client_id",
        ),
        (
            Box::new(|t| t.replace("[data]", "[broker.tls]\nca_file = \"no-ca.pem\"\n\n[data]")),
            "profile",
            "no-ca.pem",
        ),
        (
            Box::new(|t| t.replace("device = \"auto\"", "device = \"gpu\"")),
            "profile",
            "unknown variant `gpu`, expected one of `auto`, `cpu`, `cuda`",
        ),
        (
            Box::new(|t| t.replace("memory_budget_mb = 1024", "memory_budget_mb = 20")),
            "resources",
            "is above memory_budget_mb = 20: set [resources] feature_cache_mb",
        ),
        (
            Box::new(|t| t.replace("[resources]", "[resources]\ncores = 2")),
            "profile",
            "unknown field `cores`",
        ),
    ];
    for (edit, name, needle) in cases {
        let path = variant(d, edit);
        let failed = failures(&run_checks(&path, true));
        assert_eq!(failed.len(), 1, "{name}: {failed:?}");
        assert_eq!(failed[0].0, name);
        assert!(
            failed[0].1.contains(needle),
            "{name}: {:?} lacks {needle:?}",
            failed[0].1
        );
    }
    common::write_private(&d.join("bad.key"), "zz");
    let path = variant(d, |t| format!("key_file = \"bad.key\"\n{t}"));
    let failed = failures(&run_checks(&path, true));
    assert!(failed[0].1.contains("64 hex digits"), "{failed:?}");
    // A key others may read is refused, with the fix.
    std::fs::write(d.join("open.key"), "ab".repeat(32)).unwrap();
    let path = variant(d, |t| format!("key_file = \"open.key\"\n{t}"));
    let failed = failures(&run_checks(&path, true));
    assert!(failed[0].1.contains("chmod 600"), "{failed:?}");
    // A broker nobody listens on: only the full check sees it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = variant(d, |t| t.replace("port = 1883", &format!("port = {port}")));
    assert!(failures(&run_checks(&path, true)).is_empty());
    let failed = failures(&run_checks(&path, false));
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].1.contains("nothing accepts connections"),
        "{failed:?}"
    );
}

#[test]
fn metrics_listen_is_checked_free_taken_or_unparsable() {
    let dir = tempfile::tempdir().unwrap();
    let with = |listen: &str| {
        let line = format!("metrics_listen = {listen:?}\n");
        variant(dir.path(), move |t| format!("{line}{t}"))
    };
    let checks = run_checks(&variant(dir.path(), |t| t), true);
    let metrics = checks.iter().find(|c| c.name == "metrics").unwrap();
    assert!(
        metrics.ok && metrics.detail.contains("no metrics_listen"),
        "{metrics:?}"
    );
    // Held by a socket that is no agent's: `run` would stop at start.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let failed = failures(&run_checks(&with(&addr), true));
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (name, detail) = &failed[0];
    assert_eq!(*name, "metrics");
    assert!(
        detail.contains(&format!("metrics_listen = \"{addr}\" cannot be bound"))
            && detail.contains("pick a free port"),
        "{detail}"
    );
    drop(taken);
    let checks = run_checks(&with(&addr), true);
    assert!(failures(&checks).is_empty(), "{:?}", failures(&checks));
    let metrics = checks.iter().find(|c| c.name == "metrics").unwrap();
    let said = format!("http://{addr}/metrics (free now)");
    assert!(metrics.detail.contains(&said), "{metrics:?}");
    // An address that is none: the profile names the key.
    let failed = failures(&run_checks(&with("nowhere"), true));
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "profile");
    assert!(failed[0].1.contains("metrics_listen"), "{failed:?}");
}

#[test]
fn a_feature_cache_limit_cuts_the_data_and_check_says_how_much() {
    let dir = tempfile::tempdir().unwrap();
    // digits-conv gives 512 features (2 KiB) per image, so the smallest limit (1 MiB) holds
    // 512, more than a digits domain: check the message of an uncut profile, and the cut
    // itself on that profile's data with a larger row size.
    let path = variant(dir.path(), |t| t);
    let checks = run_checks(&path, true);
    let resources = checks.iter().find(|c| c.name == "resources").unwrap();
    assert!(resources.ok, "{resources:?}");
    assert!(
        resources.detail.contains("within memory_budget_mb = 1024"),
        "{resources:?}"
    );
    assert!(!resources.detail.contains("left out"), "{resources:?}");
    let config = fedge_edge::config::EdgeConfig::load(&path).unwrap();
    let (backbone, _) = fedge_edge::features::load_backbone(&config.backbone).unwrap();
    let images = config.load_images(&backbone).unwrap().images;
    let n = images.len();
    // As if each image had 8 KiB of features: 1 MiB keeps 128 of them.
    assert!(n > 128, "{n}");
    let (kept, left_out) = fedge_edge::resources::fit_feature_cache(images, 8192, 1, 0);
    assert_eq!((kept.len(), left_out), (128, n - 128));
    assert!(kept.class_counts().iter().all(|&c| c > 0));
}

/// Publishes `payload` retained on `topic` of the broker at `port` (an empty one clears it).
fn retain(port: u16, topic: &str, payload: Vec<u8>) {
    let mut options = rumqttc::MqttOptions::new("retainer", "127.0.0.1", port);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut connection) = rumqttc::Client::new(options, 8);
    client
        .publish(topic, rumqttc::QoS::AtLeastOnce, true, payload)
        .unwrap();
    for event in connection.iter() {
        if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) = event {
            break;
        }
        event.unwrap();
    }
    let _ = client.disconnect();
}

#[test]
fn check_compares_protocol_and_backbone_with_the_federation_s() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let profile = variant(dir.path(), |text| {
        let text = text.replace("port = 1883", &format!("port = {port}"));
        format!(
            "cache_dir = {cache:?}\n{}",
            text.replace("cache_dir", "# cache_dir")
        )
    });
    let federation = |path: &Path| {
        let checks = run_checks(path, false);
        checks.into_iter().find(|c| c.name == "federation").unwrap()
    };
    let found = federation(&profile);
    assert!(
        found.ok && found.detail.contains("nothing retained"),
        "{found:?}"
    );
    // A released model of the federation ("demo", as the profile) on another backbone.
    let topics = fedge_wire::Topics::new("demo").unwrap();
    let head = fedge_models::HeadConfig::new(512, 10).with_hidden(4);
    let params = head.init_flat(1);
    let release = fedge_wire::ModelRelease {
        pooled: None,
        federation: "demo".into(),
        run: 1,
        round: 4,
        strategy: "fedavg".into(),
        classes: (0..10).map(|k| k.to_string()).collect(),
        backbone: "efficientnet-lite0".into(),
        sha256: fedge_wire::ModelRelease::digest(&params),
        params: fedge_wire::TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    };
    let frame = fedge_wire::encode(&fedge_wire::Message::Model(release.clone()));
    retain(port, &topics.model_current(), frame);
    let found = federation(&profile);
    assert!(!found.ok, "{found:?}");
    assert!(found.detail.contains("\"efficientnet-lite0\""), "{found:?}");
    // The same model on this profile's backbone passes.
    let same = fedge_wire::ModelRelease {
        backbone: "digits-conv".into(),
        ..release
    };
    let mut frame = fedge_wire::encode(&fedge_wire::Message::Model(same));
    retain(port, &topics.model_current(), frame.clone());
    let found = federation(&profile);
    assert!(found.ok && found.detail.contains("round 4"), "{found:?}");
    // Its head is 4 wide, the profile says 64: said, with what to set.
    assert!(found.detail.contains("hidden = 4"), "{found:?}");
    // A round task of a newer protocol: named, with what to do.
    frame[fedge_wire::MAGIC.len()] = fedge_wire::PROTOCOL_VERSION + 1;
    retain(port, &topics.round_task(), frame);
    let found = federation(&profile);
    assert!(!found.ok, "{found:?}");
    let newer = format!("protocol {}", fedge_wire::PROTOCOL_VERSION + 1);
    assert!(found.detail.contains(&newer), "{found:?}");
    // A task naming another backbone file (same name, another digest): what to change.
    let task = |backbone| fedge_wire::RoundTask {
        pooled: None,
        federation: "demo".into(),
        run: 1,
        round: 5,
        selected: vec!["site-rot15".into()],
        classes: (0..10).map(|k| k.to_string()).collect(),
        params: fedge_wire::TensorF32::from_slice(&params),
        train: Default::default(),
        deadline_ms: 60_000,
        insight: None,
        prototypes: None,
        backbone,
    };
    let other = fedge_wire::BackboneRef {
        name: "digits-conv".into(),
        sha256: [9; 32],
    };
    let frame = fedge_wire::encode(&fedge_wire::Message::RoundTask(task(Some(other))));
    retain(port, &topics.round_task(), frame);
    let found = federation(&profile);
    assert!(!found.ok, "{found:?}");
    assert!(
        found
            .detail
            .contains(&format!("sha256 {}", "09".repeat(32))),
        "{found:?}"
    );
    // This profile's own backbone file, in a task of the previous protocol and of this one.
    let onnx = common::repo_root().join("models/assets/digits-conv.onnx");
    let ours = fedge_wire::BackboneRef::of("digits-conv", &std::fs::read(onnx).unwrap());
    let old = fedge_wire::previous::encode(&fedge_wire::Message::RoundTask(task(None)));
    retain(port, &topics.round_task(), old);
    let found = federation(&profile);
    assert!(
        found.ok
            && found.detail.contains(&format!(
                "protocol {}",
                fedge_wire::PREVIOUS_PROTOCOL_VERSION
            )),
        "{found:?}"
    );
    let frame = fedge_wire::encode(&fedge_wire::Message::RoundTask(task(Some(ours.clone()))));
    retain(port, &topics.round_task(), frame);
    let found = federation(&profile);
    let said = format!("backbone sha256 {}…", ours.short());
    assert!(found.ok && found.detail.contains(&said), "{found:?}");
}

#[test]
fn a_profile_that_trains_the_tail_gets_the_coordinator_s_table_and_its_memory_checked() {
    let dir = tempfile::tempdir().unwrap();
    let tail = |budget: &'static str| {
        move |t: String| {
            t.replacen("hidden = 64", "hidden = 64\ntrain_tail = true", 1)
                .replace("memory_budget_mb = 1024", budget)
        }
    };
    let path = variant(dir.path(), tail("memory_budget_mb = 1024"));
    let checks = run_checks(&path, true);
    assert!(failures(&checks).is_empty(), "{:?}", failures(&checks));
    let found = |name: &str| {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .detail
            .clone()
    };
    // digits-conv's last block: a 3×3 convolution 16 → 32 on a 4×4 map, flattened.
    let said = found("tail");
    for part in [
        "from \"p1\"",
        "16 × 4 × 4 activations",
        "features = 512",
        "input = [16, 4, 4]",
        "kernel = [3, 3]",
        "activation = \"relu\"",
        "pooling = \"flatten\"",
    ] {
        assert!(said.contains(part), "{part:?} not in {said}");
    }
    let resources = found("resources");
    assert!(resources.contains("training the tail"), "{resources}");
    // A budget too small for it is refused with the numbers.
    let small = variant(dir.path(), tail("memory_budget_mb = 20"));
    let failed = failures(&run_checks(&small, true));
    let (name, detail) = &failed[0];
    assert_eq!(*name, "resources", "{failed:?}");
    assert!(
        detail.contains("training the tail") && detail.contains("is above memory_budget_mb = 20"),
        "{detail}"
    );
    // A backbone without a trainable end says so at `check`, not at the first round: the
    // built-in backbone cut at its pooled map, which a max-pool makes.
    let text = std::fs::read_to_string(common::repo_root().join("models/assets/digits-conv.toml"))
        .unwrap()
        .replace(
            "file = \"digits-conv.onnx\"",
            "file = \"digits-conv-p1.onnx\"",
        )
        .replace("output_name = \"features\"", "output_name = \"p1\"")
        .replace("feature_size = 512", "feature_size = 256");
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(models.join("digits-conv-p1.toml"), text).unwrap();
    std::fs::copy(
        common::repo_root().join("models/assets/digits-conv.onnx"),
        models.join("digits-conv-p1.onnx"),
    )
    .unwrap();
    let pooled = variant(dir.path(), |t| {
        let t = tail("memory_budget_mb = 1024")(t);
        let line = t.lines().find(|l| l.starts_with("backbone = ")).unwrap();
        let ours = format!("backbone = {:?}", models.join("digits-conv-p1.toml"));
        t.replace(line, &ours)
    });
    let failed = failures(&run_checks(&pooled, true));
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (name, detail) = &failed[0];
    assert_eq!(*name, "tail");
    assert!(detail.contains("not from a convolution block"), "{detail}");
}
