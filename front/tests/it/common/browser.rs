//! A headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`, with
//! the fantoccini client): chromedriver on a free loopback port, killed on drop. Without them
//! the tests that need a browser skip, unless `FEDGE_REQUIRE_CHROMIUM=1`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// chromedriver, and a WebDriver session in headless Chromium.
pub struct Browser {
    driver: Child,
    pub client: fantoccini::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A new headless session, or `None` (test skipped) when chromium or chromedriver is not
    /// installed, unless `FEDGE_REQUIRE_CHROMIUM=1`.
    pub async fn start() -> Option<Self> {
        let found = ["/usr/bin/chromedriver", "chromedriver"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
        let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists());
        let (Some(driver), Some(chromium)) = (found, chromium) else {
            assert!(
                std::env::var("FEDGE_REQUIRE_CHROMIUM").map_or(true, |v| v != "1"),
                "FEDGE_REQUIRE_CHROMIUM=1 but chromium or chromedriver is not installed \
                 (apt-get install chromium chromium-driver)"
            );
            eprintln!("chromium or chromedriver not installed: skipping");
            return None;
        };
        let port = fedge_coordinator::io::broker::free_loopback_addr()
            .unwrap()
            .port();
        let driver = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().unwrap();
        let mut capabilities = serde_json::Map::new();
        // The flags a sandboxed, offline machine needs: no sandbox as root, no GPU, no
        // background connections that the closed network refuses.
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=900,1100",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match fantoccini::ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    panic!("no WebDriver session within 30 s: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        Some(Self {
            driver,
            client,
            _profile: profile,
        })
    }

    /// Ends the session and chromedriver.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
