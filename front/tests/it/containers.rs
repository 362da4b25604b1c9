//! The container images and stack of `deploy/container/` (docs/containers.md). On every run: the
//! stack's configuration files load as the binaries read them and agree with each other and
//! with Prometheus's scrape targets, and both Dockerfiles share their runtime stage. With
//! podman: `deploy/container/smoke.sh` builds the full Dockerfile around a stand-in cargo,
//! assembles the images from this build's binaries, and runs the stack in a pod without
//! network until the federation has trained and Prometheus has scraped it. Without podman that
//! part skips, unless `FEDGE_REQUIRE_PODMAN=1` (as in CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use fedge_coordinator::CoordinatorConfig;
use fedge_edge::config::EdgeConfig;

use crate::common;

fn container_dir() -> PathBuf {
    common::repo_root().join("deploy/container")
}

#[test]
fn the_container_stack_s_configuration_files_agree() {
    let dir = container_dir();
    let path = dir.join("coordinator.toml");
    let coordinator =
        CoordinatorConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(coordinator.broker.host, "mosquitto");
    assert_eq!(coordinator.metrics_listen.map(|a| a.port()), Some(9464));
    assert_eq!(coordinator.min_clients, 2, "the stack runs two edges");
    let prometheus = std::fs::read_to_string(dir.join("prometheus.yml")).unwrap();
    assert!(prometheus.contains("'coordinator:9464'"), "{prometheus}");
    for (name, port) in [("edge-1", 9465), ("edge-2", 9466)] {
        let path = dir.join(format!("{name}.toml"));
        let edge = EdgeConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(edge.client_id, name);
        assert_eq!(edge.federation, coordinator.federation);
        assert_eq!(edge.broker.host, "mosquitto");
        assert_eq!(edge.hidden, coordinator.head.hidden);
        assert_eq!(edge.metrics_listen.map(|a| a.port()), Some(port));
        assert!(
            prometheus.contains(&format!("'{name}:{port}'")),
            "{prometheus}"
        );
        // Where both Dockerfiles put the built-in backbone.
        assert_eq!(
            edge.backbone,
            Path::new("/usr/share/fedge/models/digits-conv.toml")
        );
        assert_eq!(
            edge.cache_dir.as_deref(),
            Some(Path::new("/var/cache/fedge"))
        );
    }
}

/// The lines from `# >>> runtime stage` to `# <<< runtime stage` of a Dockerfile.
fn runtime_stage(file: &str) -> String {
    let text = std::fs::read_to_string(container_dir().join(file)).unwrap();
    let start = text.find("# >>> runtime stage");
    let end = text.find("# <<< runtime stage");
    let (Some(start), Some(end)) = (start, end) else {
        panic!("{file} has no runtime stage markers");
    };
    text[start..end].to_owned()
}

#[test]
fn both_dockerfiles_share_their_runtime_stage() {
    let full = runtime_stage("Dockerfile");
    assert!(full.contains("USER 10001:10001"), "{full}");
    assert_eq!(
        full,
        runtime_stage("Dockerfile.runtime"),
        "the runtime stage of deploy/container/Dockerfile.runtime must be Dockerfile's, unchanged"
    );
}

/// Whether podman is installed; a missing one fails the test under `FEDGE_REQUIRE_PODMAN=1`.
fn podman() -> bool {
    let found = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("FEDGE_REQUIRE_PODMAN").map_or(true, |v| v != "1"),
            "FEDGE_REQUIRE_PODMAN=1 but podman is missing (apt-get install podman runc)"
        );
        eprintln!("no podman: skipping the container smoke test");
    }
    found
}

#[test]
fn the_images_built_from_this_build_s_binaries_run_a_federation_under_podman() {
    if !podman() {
        return;
    }
    let bin_dir = common::coordinator_binary().parent().unwrap().to_owned();
    // smoke.sh bounds its waits (FEDGE_SMOKE_TIMEOUT) and cleans up on SIGTERM; `timeout`
    // bounds the whole run, image builds included.
    let out = Command::new("timeout")
        .args(["--signal=TERM", "--kill-after=30", "480", "bash"])
        .arg(container_dir().join("smoke.sh"))
        .env("BIN_DIR", &bin_dir)
        .env("FEDGE_SMOKE_TIMEOUT", "240")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "deploy/container/smoke.sh failed:\n{stderr}"
    );
    eprint!("{stderr}");
}
