//! Everything a broker carries, captured with `mosquitto_sub -t '#'` (mosquitto-clients) from
//! start to stop: what the tests that look for image bytes on the broker read.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One message the broker carried.
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
}

/// A running `mosquitto_sub` on every topic of the broker at `port`.
pub struct Capture {
    child: Child,
    reader: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Capture {
    /// Subscribes to `#` on the broker at `port` (and waits a moment for the subscription).
    pub fn start(port: u16) -> Self {
        // Every message, its payload in hex, one per line.
        let mut child = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-t", "#", "-F", "%t %x", "-q", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub (apt-get install mosquitto-clients)");
        // Read as it comes: hex payloads fill a pipe's buffer long before a federation ends.
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stdout, &mut all);
            all
        });
        std::thread::sleep(Duration::from_millis(300));
        Self {
            child,
            reader: Some(reader),
        }
    }

    /// Stops the capture and returns what it saw, in order. Interrupted, not killed:
    /// mosquitto_sub then flushes what it printed before it exits.
    pub fn stop(mut self) -> Vec<Message> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let all = (self.reader.take()).map_or_else(Vec::new, |r| r.join().unwrap());
        (String::from_utf8_lossy(&all).lines())
            .filter_map(|line| line.split_once(' '))
            .map(|(topic, hex)| Message {
                topic: topic.to_owned(),
                payload: (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                    .collect(),
            })
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
