//! Helpers shared by the end-to-end tests: the brokers and binaries they start, what a device
//! sends, how a test waits for the coordinator, and the shipped device profiles. Every test owns
//! its state (a temporary folder, free loopback ports, its own federation name) and nothing here
//! touches process-wide state (environment, current folder, logging), so the tests run in
//! parallel in this one process. The helpers assert rather than return errors: a failure here is
//! a failed test.

pub mod browser;
pub mod capture;
mod coordinator;
mod device;
mod mosquitto;
pub mod onnxruntime;
mod profiles;

pub use coordinator::{
    Driver, coordinator_binary, driver_options, embedded_broker, wait_status, wait_task,
};
pub use device::{client_update, edge_status_json, signed_status_json, update_frame};
pub use mosquitto::{Mosquitto, binary as mosquitto_binary};
pub use profiles::{firmware_configs, profile_copy, repo_root, serving_setup, shipped_profiles};

use std::ops::{Deref, DerefMut};
use std::process::Child;
use std::time::Duration;

use fedge::demo::{self, DemoOptions, DemoResult};
use fedge_mqtt::BrokerConfig;

/// Runs `command` to its end and returns its output, failing the test with its standard
/// error when it does not succeed.
pub fn succeeded(command: &mut std::process::Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One JSON value per line of a command's standard output.
pub fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    (String::from_utf8_lossy(stdout).lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// Euclidean norm, as the coordinator computes it.
/// Writes a secret file (a key, a keys file) readable by its owner only, as
/// `fedge-coordinator keygen` does; fedge refuses secrets others can read.
pub fn write_private(path: &std::path::Path, contents: impl AsRef<[u8]>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

pub fn norm(v: &[f32]) -> f32 {
    fedge_coordinator::updates::norms::l2_norm(v)
}

/// A child process killed and reaped when the test ends, a failed one included, so that no
/// process a test started outlives it.
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A demo federation of three devices for three rounds of at most a minute each, over
/// `broker` (the embedded one when `None`).
pub fn demo_options(broker: Option<BrokerConfig>, federation: &str) -> DemoOptions {
    DemoOptions {
        rounds: 3,
        clients: 3,
        broker,
        federation: federation.into(),
        round_timeout_s: 60.0,
        ..DemoOptions::default()
    }
}

/// A demo federation (agents, coordinator, broker) run to its end, for at most two minutes.
pub async fn run_demo(options: &DemoOptions) -> DemoResult {
    let data = demo::prepare(options).unwrap();
    tokio::time::timeout(Duration::from_secs(120), demo::run(options, &data, |_| {}))
        .await
        .expect("federation timed out")
        .unwrap()
}
