//! A mosquitto broker the tests start on a free loopback port and kill on drop. It does not
//! install mosquitto: without it the tests that need it skip, unless `FEDGE_REQUIRE_MOSQUITTO=1`.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fedge_mqtt::BrokerConfig;

/// A mosquitto broker on a free loopback port, killed on drop.
pub struct Mosquitto {
    child: Child,
    port: u16,
    binary: &'static str,
    dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts mosquitto, or returns `None` (test skipped) when it is not installed — unless
    /// `FEDGE_REQUIRE_MOSQUITTO=1`, under which a missing mosquitto fails the test.
    pub fn start() -> Option<Self> {
        Self::start_with("")
    }

    /// Like [`Mosquitto::start`], with extra lines for the listener (TLS files, for example).
    pub fn start_with(listener_options: &str) -> Option<Self> {
        Self::start_configured(listener_options, "")
    }

    /// Like [`Mosquitto::start`], with `tail` (a bridge's `connection` section) at the end of
    /// the configuration.
    pub fn start_bridged(tail: &str) -> Option<Self> {
        Self::start_configured("", tail)
    }

    fn start_configured(listener_options: &str, tail: &str) -> Option<Self> {
        let binary = binary()?;
        let port = fedge_coordinator::io::broker::free_loopback_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\n{listener_options}\nallow_anonymous true\npersistence false\n{tail}\n"
            ),
        )
        .unwrap();
        let child = spawn(binary, &conf, port);
        Some(Self {
            child,
            port,
            binary,
            dir,
        })
    }

    /// Kills the broker (all sessions and retained messages are lost) and starts a new one on
    /// the same port after `down`.
    pub fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = spawn(
            self.binary,
            &self.dir.path().join("mosquitto.conf"),
            self.port,
        );
    }

    /// Client settings for this broker.
    pub fn broker(&self) -> BrokerConfig {
        BrokerConfig::at("127.0.0.1", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

fn spawn(binary: &str, conf: &std::path::Path, port: u16) -> Child {
    let child = Command::new(binary)
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "mosquitto did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mosquitto binary, if installed; `None` (the caller skips its test) unless
/// `FEDGE_REQUIRE_MOSQUITTO=1`, under which a missing mosquitto fails the test.
pub fn binary() -> Option<&'static str> {
    let found = ["mosquitto", "/usr/sbin/mosquitto"].into_iter().find(|b| {
        Command::new(b)
            .arg("-h")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    });
    if found.is_none() {
        assert!(
            std::env::var("FEDGE_REQUIRE_MOSQUITTO").map_or(true, |v| v != "1"),
            "FEDGE_REQUIRE_MOSQUITTO=1 but mosquitto is not installed (apt-get install mosquitto)"
        );
        eprintln!("mosquitto not installed: skipping");
    }
    found
}
