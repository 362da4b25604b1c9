//! mosquitto with a whole configuration of the test's choosing (the shared helper in `common`
//! always allows anonymous clients): the documented set-up from `deploy/mosquitto/`, or a
//! password file. Killed on drop; skipped when mosquitto is missing, unless
//! `FEDGE_REQUIRE_MOSQUITTO=1`.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, KillOnDrop};

/// A running mosquitto.
pub struct Broker {
    _child: KillOnDrop,
    port: u16,
}

fn binary() -> Option<&'static str> {
    common::mosquitto_binary()
}

fn free_port() -> u16 {
    fedge_coordinator::io::broker::free_loopback_addr()
        .unwrap()
        .port()
}

impl Broker {
    /// `deploy/mosquitto/fedge.conf` and `fedge.acl` as shipped, with the certificates of
    /// `tls::make_certificates` in `dir` for those under /etc/mosquitto/certs, a loopback port
    /// for 8883, and one test-only user appended to the ACL: `observer`, who may read
    /// everything, to see what the broker lets through.
    pub fn documented(dir: &Path) -> Option<Self> {
        let binary = binary()?;
        let deploy = common::repo_root().join("deploy/mosquitto");
        let port = free_port();
        let d = dir.display();
        let conf = std::fs::read_to_string(deploy.join("fedge.conf")).unwrap();
        let mut out = String::new();
        for line in conf.lines() {
            let line = match line {
                "listener 8883" => format!("listener {port} 127.0.0.1"),
                "certfile /etc/mosquitto/certs/broker.pem" => format!("certfile {d}/server.pem"),
                "keyfile /etc/mosquitto/certs/broker.key" => format!("keyfile {d}/server.key"),
                l => l
                    .replace("/etc/mosquitto/certs/", &format!("{d}/"))
                    .replace("/etc/mosquitto/fedge.acl", &format!("{d}/fedge.acl")),
            };
            assert!(
                line.starts_with('#') || !line.contains("/etc/"),
                "unexpected path in fedge.conf: {line}"
            );
            out.push_str(&line);
            out.push('\n');
        }
        let mut acl = std::fs::read_to_string(deploy.join("fedge.acl")).unwrap();
        acl.push_str("\n# Test only.\nuser observer\ntopic read #\n");
        std::fs::write(dir.join("fedge.acl"), acl).unwrap();
        open_to_mosquitto(&dir.join("fedge.acl"));
        Some(Self::spawn(binary, dir, &out, port))
    }

    /// Plain MQTT with logins from a password file made by `mosquitto_passwd`.
    pub fn with_passwords(dir: &Path, users: &[(&str, &str)]) -> Option<Self> {
        let binary = binary()?;
        let passwords = dir.join("mosquitto.passwd");
        for (i, (user, password)) in users.iter().enumerate() {
            let mut command = Command::new("mosquitto_passwd");
            command.arg("-b");
            if i == 0 {
                command.arg("-c");
            }
            let out = command
                .arg(&passwords)
                .args([user, password])
                .output()
                .expect("mosquitto_passwd comes with mosquitto");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        open_to_mosquitto(&passwords);
        let port = free_port();
        let conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\n",
            passwords.display()
        );
        Some(Self::spawn(binary, dir, &conf, port))
    }

    fn spawn(binary: &str, dir: &Path, conf: &str, port: u16) -> Self {
        let path = dir.join("mosquitto.conf");
        std::fs::write(&path, conf).unwrap();
        open_to_mosquitto(dir);
        open_to_mosquitto(&path);
        let log = std::fs::File::create(dir.join("mosquitto.log")).unwrap();
        let child = KillOnDrop(
            Command::new(binary)
                .arg("-c")
                .arg(&path)
                .arg("-v")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "mosquitto did not start on port {port}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            _child: child,
            port,
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// mosquitto started as root drops to its own user, which must read the test's files.
fn open_to_mosquitto(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
