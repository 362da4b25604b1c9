//! `fedge-edge check`: is this device ready to join? Each check says what it found, or what to
//! fix. Run it on site before leaving; `--dry-run` skips the broker (for CI and staging).
//! With the broker reachable, `broker.rs` makes the TLS handshake and the MQTT login, and
//! `federation.rs` compares the protocol version and the backbone with what the federation's
//! coordinator has published; while this profile's agent runs (`running.rs`), the check
//! leaves its session alone. `endpoints.rs`: the addresses the agent listens on.

use std::path::Path;

use fedge_models::HeadConfig;

use crate::config::EdgeConfig;
use crate::resources;

mod broker;
mod endpoints;
mod federation;
mod running;

pub use fedge_daemon::checks::{Check, report};

fn pass(name: &'static str, detail: String) -> Check {
    fedge_daemon::checks::pass(name, detail)
}

fn fail(name: &'static str, detail: String) -> Check {
    fedge_daemon::checks::fail(name, detail)
}

/// Runs every check of the profile at `path`; the broker is skipped when `dry_run`. The memory
/// estimate is taken from the data's sizes: a caller sharing its process with other work (a
/// test) has no peak of its own to measure. See [`run_checks_alone`].
pub fn run_checks(path: &Path, dry_run: bool) -> Vec<Check> {
    checks(path, dry_run, false)
}

/// As [`run_checks`], in a process that does nothing else (`fedge-edge check`): the memory
/// estimate starts from the process's own peak once it loaded the backbone, ran it and loaded
/// the images, which measures what the sizes cannot (the backbone's plan and activations).
pub fn run_checks_alone(path: &Path, dry_run: bool) -> Vec<Check> {
    checks(path, dry_run, true)
}

fn checks(path: &Path, dry_run: bool, alone: bool) -> Vec<Check> {
    let config = match EdgeConfig::load(path) {
        Ok(config) => config,
        Err(e) => return vec![fail("profile", format!("{e:#}"))],
    };
    let mut checks = vec![pass(
        "profile",
        format!(
            "{} in federation {} (profile {})",
            config.client_id, config.federation, config.profile
        ),
    )];
    checks.push(match config.load_key() {
        Ok(Some(_)) => pass("key", "device key present (updates will be signed)".into()),
        Ok(None) => pass(
            "key",
            "no key_file: updates are not signed (fine only if the coordinator has no [auth])"
                .into(),
        ),
        Err(e) => fail("key", format!("{e:#}")),
    });
    checks.push(match &config.broker.tls {
        Some(tls) => pass("tls", format!("CA: {}", tls.roots())),
        None => pass("tls", "plain TCP to the broker".into()),
    });
    checks.push(check_cache(config.cache_dir.as_deref()));
    let loaded = match config.backbone_from_federation() {
        // Fetched at start; nothing to run before then.
        true => {
            checks.push(match &config.cache_dir {
                Some(dir) => pass(
                    "backbone",
                    format!(
                        "the federation's (fedge-coordinator publish-backbone), fetched into {} \
                         at start",
                        dir.join("backbones").display()
                    ),
                ),
                None => fail(
                    "backbone",
                    "backbone = \"federation\" needs cache_dir, where it is kept".into(),
                ),
            });
            Err(None)
        }
        false => crate::features::load_backbone_with(
            &config.backbone,
            &config.model,
            config.resources.threads,
        )
        .map_err(Some),
    };
    let backbone = match loaded {
        Err(None) => None,
        Ok((backbone, _)) => {
            let card = backbone.card();
            let input = vec![0f32; card.channels * card.height * card.width];
            match backbone.features(&input, 1) {
                Ok(features) if features.len() == card.feature_size => {
                    checks.push(pass(
                        "backbone",
                        format!(
                            "{} runs: {}×{}×{} in, {} features out, as its card says",
                            card.name, card.channels, card.height, card.width, card.feature_size
                        ),
                    ));
                    checks.push(pass("runtime", backbone.runtime().to_string()));
                    Some(backbone)
                }
                Ok(features) => {
                    checks.push(fail(
                        "backbone",
                        format!(
                            "{} gives {} features but its card says feature_size = {}: fix the card",
                            card.name,
                            features.len(),
                            card.feature_size
                        ),
                    ));
                    None
                }
                Err(e) => {
                    checks.push(fail("backbone", format!("{} does not run: {e}", card.name)));
                    None
                }
            }
        }
        Err(Some(e)) => {
            checks.push(fail(
                "backbone",
                format!("{e:#} (backbone = {})", config.backbone.display()),
            ));
            None
        }
    };
    checks.push(check_device(&config));
    if let Some(backbone) = &backbone {
        let loaded = config.load_images(backbone);
        if let Ok(loaded) = &loaded
            && !loaded.skipped.is_empty()
        {
            checks.push(check_unreadable(&loaded.skipped));
        }
        let images = loaded.map(|l| l.images);
        let tail = config.train_tail.then(|| check_tail(backbone));
        if let Some((check, _)) = &tail {
            checks.push(check.clone());
        }
        let tail = tail.and_then(|(_, tail)| tail);
        if let Ok(images) = &images {
            let measured = alone.then(resources::peak_rss_mib).flatten();
            checks.push(check_resources(
                &config,
                backbone,
                tail.as_ref(),
                images,
                measured,
            ));
        }
        if let (Ok(images), Some(file)) = (&images, &config.classes_file) {
            checks.push(check_classes(images, file));
        }
        if let (Ok(images), true) = (&images, config.fedddl.enabled) {
            checks.push(check_fedddl(&config, images));
        }
        checks.push(match images {
            Ok(images) if images.len() >= 2 => pass(
                "data",
                format!(
                    "{} labelled samples in {} classes",
                    images.len(),
                    images.classes()
                ),
            ),
            Ok(images) => fail(
                "data",
                format!(
                    "{} samples in {} classes: a device needs at least 2 samples",
                    images.len(),
                    images.classes()
                ),
            ),
            Err(e) => fail("data", format!("{e:#}")),
        });
    }
    let metrics = endpoints::Metrics::probe(&config);
    let running = running::evidence(path, &config, metrics.answered());
    let running = running.as_deref();
    checks.push(endpoints::check_inference(&config, running));
    if let Some(labelling) = &config.labelling {
        checks.push(endpoints::check_labelling(&config, labelling, running));
    }
    checks.push(endpoints::check_metrics(&metrics, running));
    match dry_run {
        true => checks.push(pass("broker", "skipped (--dry-run)".into())),
        false => checks.extend(broker::check_broker(&config, running, backbone.as_ref())),
    }
    checks
}

/// Image files that do not decode: listed every one (the device leaves them out and starts).
fn check_unreadable(skipped: &[(std::path::PathBuf, String)]) -> Check {
    let files: Vec<String> = skipped
        .iter()
        .map(|(file, _)| format!("  {}", file.display()))
        .collect();
    let first = &skipped[0].1;
    fail(
        "images",
        format!(
            "{} image file(s) do not decode and are left out (replace or remove them; the first: \
             {first}):\n{}",
            skipped.len(),
            files.join("\n")
        ),
    )
}

/// `[fedddl] enabled`: `run` builds FedDDL's views at start and stops when the images carry
/// no object masks, so `check` fails the same way.
fn check_fedddl(config: &EdgeConfig, images: &crate::data::ImageSet) -> Check {
    match (&config.fedddl.detector, &images.masks) {
        (Some(card), _) => pass(
            "fedddl",
            format!("object masks from the detector {}", card.display()),
        ),
        (None, Some(_)) => pass("fedddl", "object masks present for FedDDL's views".into()),
        (None, None) => fail(
            "fedddl",
            format!(
                "{} (`run` would stop at start); or set [fedddl] enabled = false if the \
                 coordinator does not run the fedddl objective",
                crate::views::ViewsError::NoMasks
            ),
        ),
    }
}

/// The device's classes against the federation's list (`classes_file`).
fn check_classes(images: &crate::data::ImageSet, file: &Path) -> Check {
    let federation = match fedge_daemon::read_list(file) {
        Ok(list) => list,
        Err(e) => return fail("classes", format!("classes_file {}: {e}", file.display())),
    };
    let counts = images.class_counts();
    let used: Vec<String> = (images.class_names.iter().zip(&counts))
        .filter(|(_, n)| **n > 0)
        .map(|(name, _)| name.clone())
        .collect();
    match fedge_device::classes::check(&used, &federation) {
        Ok(()) => {
            let missing = federation.len() - used.len();
            pass(
                "classes",
                format!(
                    "{} of the federation's {} classes here{}",
                    used.len(),
                    federation.len(),
                    if missing > 0 {
                        " (the others are trained by other sites)"
                    } else {
                        ""
                    }
                ),
            )
        }
        Err(e) => fail("classes", e.to_string()),
    }
}

fn check_device(config: &EdgeConfig) -> Check {
    let (accelerator, backend) = config.training();
    let selected = fedge_models::select_device(accelerator, backend);
    match selected.fallback {
        // The CPU fallback is how a Jetson profile runs before its CUDA build: a note, not a
        // failure.
        Some(reason) => pass(
            "device",
            format!("{} asked for: {reason}", config.device.name()),
        ),
        None => pass("device", format!("training on {}", selected.name)),
    }
}

/// A profile with `train_tail = true`: the backbone's tail, and the table the coordinator's
/// configuration needs for it.
fn check_tail(
    backbone: &fedge_models::Backbone,
) -> (Check, Option<fedge_wire::layout::TailConfig>) {
    let read = crate::features::backbone_onnx(backbone)
        .and_then(|onnx| Ok(fedge_models::Tail::read(backbone.card(), &onnx, None)?));
    match read {
        Ok(tail) => {
            let t = tail.config;
            // One line to paste under the coordinator's [head].
            let table = toml::Value::try_from(t).map_or_else(|e| e.to_string(), |v| v.to_string());
            let detail = format!(
                "trains {} from {:?} ({} × {} × {} activations cached per image, {} tail \
                 parameters); the coordinator's [head] needs features = {} and \
                 tail = {table}",
                backbone.card().name,
                tail.cut,
                t.input[0],
                t.input[1],
                t.input[2],
                t.num_params(),
                t.features()
            );
            (pass("tail", detail), Some(t))
        }
        Err(e) => (fail("tail", format!("{e:#}")), None),
    }
}

fn check_resources(
    config: &EdgeConfig,
    backbone: &fedge_models::Backbone,
    tail: Option<&fedge_wire::layout::TailConfig>,
    images: &crate::data::ImageSet,
    measured: Option<f64>,
) -> Check {
    let limits = &config.resources;
    let card = backbone.card();
    let mut head =
        HeadConfig::new(card.feature_size, images.classes().max(2)).with_hidden(config.hidden);
    if let Some(tail) = tail {
        head = head.with_tail(*tail);
    }
    // With a tail, the cache holds the activations at its cut.
    let per_image = resources::feature_bytes_per_image(head.input_size(), config.fedddl.enabled);
    let kept = resources::cache_rows(images.len(), per_image, limits.feature_cache_mb);
    let left_out = images.len() - kept;
    let params = head.num_params();
    // All images are loaded while their features are computed; the cut happens after.
    let feature_bytes = kept as u64 * per_image;
    // `measured`: this process's peak now that it loaded the backbone, ran it on its
    // converter's sample and loaded the images, as `run` does before it computes features.
    let tail_bytes = tail.map_or(0, |t| {
        resources::tail_training_bytes(t, resources::CHECK_BATCH)
    });
    let estimate = resources::estimate_mib(images, feature_bytes, params, measured)
        + tail_bytes as f64 / (1024.0 * 1024.0);
    let features_mib = feature_bytes as f64 / (1024.0 * 1024.0);
    let mut notes = if left_out > 0 {
        format!(", {left_out} samples left out to fit feature_cache_mb")
    } else {
        String::new()
    };
    if tail.is_some() {
        notes += &format!(
            ", training the tail {:.1} MiB at batches of {} ({} parameters with the head)",
            tail_bytes as f64 / (1024.0 * 1024.0),
            resources::CHECK_BATCH,
            params
        );
    }
    let budget = limits.memory_budget_mb;
    if budget > 0 && estimate > budget as f64 {
        return fail(
            "resources",
            format!(
                "estimated peak {estimate:.0} MiB (features {features_mib:.1} MiB{notes}) is above \
                 memory_budget_mb = {budget}: set [resources] feature_cache_mb, use fewer or \
                 smaller images, or raise the budget"
            ),
        );
    }
    let budget = if budget > 0 {
        format!("within memory_budget_mb = {budget}")
    } else {
        "no memory_budget_mb".into()
    };
    pass(
        "resources",
        format!(
            "estimated peak {estimate:.0} MiB, {budget}; features {features_mib:.1} MiB{notes}"
        ),
    )
}

fn check_cache(dir: Option<&Path>) -> Check {
    let Some(dir) = dir else {
        return pass(
            "cache",
            "no cache_dir: features are recomputed at every start".into(),
        );
    };
    let probe = dir.join(".fedge-write-test");
    let result = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"ok"))
        .and_then(|_| std::fs::remove_file(&probe));
    match result {
        Ok(()) => pass("cache", format!("{} is writable", dir.display())),
        Err(e) => fail(
            "cache",
            format!(
                "cache_dir {} is not writable ({e}): create it for the service user or point cache_dir elsewhere",
                dir.display()
            ),
        ),
    }
}
