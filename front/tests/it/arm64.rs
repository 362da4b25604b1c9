//! The ARM64 build of `fedge-edge` (cross-compiled, see .cargo/config.toml) runs one full
//! round under qemu-aarch64 against a coordinator and broker on loopback.
//!
//! Needs `target/aarch64-unknown-linux-gnu/edge/fedge-edge` (build it with
//! `bash deploy/build-gateway.sh`: `cargo build --profile edge --target aarch64-unknown-linux-gnu
//! -p fedge-edge --bin fedge-edge` with its size flags)
//! and qemu-user; skipped without them unless `FEDGE_REQUIRE_ARM64=1` (as in CI).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fedge_coordinator::{FedAvg, RoundConfig, Rounds};
use fedge_models::HeadConfig;

use crate::common::{self, Driver, KillOnDrop};

fn arm_binary() -> Option<PathBuf> {
    let bin = std::env::var_os("FEDGE_ARM64_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            common::repo_root().join("target/aarch64-unknown-linux-gnu/edge/fedge-edge")
        });
    let qemu = Command::new("qemu-aarch64")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if bin.exists() && qemu {
        return Some(bin);
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_ARM64").map_or(true, |v| v != "1"),
        "FEDGE_REQUIRE_ARM64=1 but {} or qemu-aarch64 is missing",
        bin.display()
    );
    eprintln!("no ARM64 build or qemu-aarch64: skipping");
    None
}

fn profile(dir: &Path, port: u16) -> PathBuf {
    common::profile_copy("arm64-gateway.toml", dir, |text| {
        text.replace(
            "cache_dir = \"/var/cache/fedge\"",
            &format!("cache_dir = {:?}", dir.join("cache")),
        )
        .replace("port = 1883", &format!("port = {port}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arm64_edge_binary_trains_a_round_under_qemu() {
    let Some(binary) = arm_binary() else {
        return;
    };
    let broker = common::embedded_broker();
    let dir = tempfile::tempdir().unwrap();
    let config = profile(dir.path(), broker.port);
    let head = HeadConfig::new(512, 10).with_hidden(64);
    let rounds = Rounds::new(
        RoundConfig {
            rounds: 1,
            min_clients: 1,
            min_updates: 1,
            round_timeout_ms: 600_000,
            // The digits' classes: a device refuses a task whose list lacks one of its own.
            classes: fedge_wire::numbered_classes(10),
            ..RoundConfig::default()
        },
        Box::new(FedAvg),
        fedge_models::ModelLayout::new(head, false).init_flat(0),
    );
    let mut coordinator = Driver::spawn(rounds, common::driver_options(broker, "demo"));
    // `file` would say "ELF 64-bit LSB pie executable, ARM aarch64".
    let header = std::fs::read(&binary).unwrap();
    assert_eq!(&header[..4], b"\x7fELF");
    assert_eq!(
        u16::from_le_bytes([header[18], header[19]]),
        183,
        "EM_AARCH64"
    );
    let edge = Command::new("qemu-aarch64")
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(&binary)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let edge = KillOnDrop(edge);
    // Under qemu one round takes minutes.
    let report = coordinator.round_ended(Duration::from_secs(600)).await;
    drop(edge);
    assert!(report.aggregated, "{report:?}");
    assert_eq!(report.reported, ["gateway-rot30"]);
    assert!(report.source_val_accuracy.is_some());
    let rounds = coordinator.finished(Duration::from_secs(20)).await;
    assert_ne!(
        rounds.params(),
        fedge_models::ModelLayout::new(HeadConfig::new(512, 10).with_hidden(64), false)
            .init_flat(0)
    );
}
