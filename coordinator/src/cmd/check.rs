//! `fedge-coordinator check`: what `run` would trip over, found before it runs: the
//! configuration, the keys and operator key files, the state folder and what it holds, the
//! release gate's settings, the metrics address and (unless `--dry-run`) the broker: TCP, then
//! the TLS handshake and the MQTT login as `run` makes them. One line per check, `ok` or `FAIL`
//! with what to fix; exits 1 when one failed.

use std::path::Path;
use std::time::{Duration, Instant};

use fedge_coordinator::CoordinatorConfig;
use fedge_coordinator::release::{OnTimeout, ReleaseConfig, ReleaseMode};
use fedge_coordinator::round::DeviceKeys;
use fedge_coordinator::store::{checkpoint, control, keys};
use fedge_daemon::checks::{self, Check, fail, pass};
use fedge_mqtt::BrokerConfig;
use rumqttc::{ConnectionError, Event, Packet};

/// Runs the checks of the configuration at `path` and prints them; exits 1 when one failed.
pub fn run(path: &Path, dry_run: bool) {
    checks::finish(path, &checks(path, dry_run));
}

fn checks(path: &Path, dry_run: bool) -> Vec<Check> {
    let config = match CoordinatorConfig::load(path) {
        Ok(config) => config,
        Err(e) => return vec![fail("config", format!("{e:#}"))],
    };
    let mut checks = vec![pass(
        "config",
        format!(
            "federation {:?}, {} rounds of {}, head {}→{}→{}",
            config.federation,
            config.rounds,
            config.strategy.strategy.name(),
            config.head.features,
            config.head.hidden,
            config.head.classes
        ),
    )];
    let mut devices = None;
    checks.push(match &config.auth.keys_file {
        None => pass(
            "keys",
            "no [auth] keys_file: nothing is authenticated (docs/mosquitto.md, keygen, enroll)",
        ),
        Some(file) => match keys::load(file) {
            Ok(found) => {
                let said = format!("{} device key(s) in {}", found.len(), file.display());
                devices = Some(found);
                pass("keys", said)
            }
            Err(e) => fail("keys", e.to_string()),
        },
    });
    checks.push(match (&config.auth.operator_key_file, config.stay_up) {
        (None, true) => fail(
            "operator",
            "stay_up = true needs [auth] operator_key_file (ctl new-run starts the next run)",
        ),
        (None, false) => pass("operator", "no [auth] operator_key_file: ctl is off"),
        (Some(file), _) => match keys::load_operator(file) {
            Ok(_) => pass("operator", format!("operator key in {}", file.display())),
            Err(e) => fail("operator", e.to_string()),
        },
    });
    checks.push(check_state(config.state_dir.as_deref()));
    checks.push(check_release(&config, devices.as_ref()));
    let aggregation = &config.aggregation;
    if aggregation.is_buffered() {
        // A mis-sized buffer runs, but refuses most updates as stale: said as a failure so
        // that it is read before the fleet wastes its training.
        checks.push(match aggregation.advice() {
            Some(advice) => fail("aggregation", advice),
            None => pass(
                "aggregation",
                format!(
                    "buffered: a version every {} updates, {} training at once, max_staleness {}",
                    aggregation.buffer_size,
                    match aggregation.concurrency {
                        0 => "every online device".to_owned(),
                        n => format!("{n} devices"),
                    },
                    aggregation.max_staleness
                ),
            ),
        });
    }
    if let Some(addr) = config.metrics_listen {
        checks.push(match std::net::TcpListener::bind(addr) {
            Ok(_) => pass("metrics", format!("{addr} is free")),
            Err(e) => fail(
                "metrics",
                format!("metrics_listen = {addr} cannot be bound ({e}): pick a free port"),
            ),
        });
    }
    if !dry_run {
        let reachable = checks::broker(&config.broker.host, config.broker.port);
        let connect = reachable.ok;
        checks.push(reachable);
        if connect {
            checks.extend(check_login(&config));
        }
    }
    checks
}

/// `[release]`: the mode and, gated, who judges a candidate. An evaluator that is not in the
/// keys file (when it holds keys) can never send a score the gate takes, so every candidate
/// would wait for its timeout: a failure.
fn check_release(config: &CoordinatorConfig, devices: Option<&DeviceKeys>) -> Check {
    let release: &ReleaseConfig = &config.release;
    let kept = format!("{} releases kept for ctl rollback", release.keep);
    if release.mode == ReleaseMode::Direct {
        return pass(
            "release",
            format!("direct: every aggregate is served at once; {kept}"),
        );
    }
    if let (Some(devices), Some(file)) = (devices, &config.auth.keys_file)
        && !devices.is_empty()
    {
        let unknown: Vec<&str> = (release.evaluators.iter())
            .filter(|e| !devices.contains_key(e.as_str()))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return fail(
                "release",
                format!(
                    "gated, but [release] evaluators {unknown:?} are not devices of [auth] \
                     keys_file {}: a device without a key is turned away, so its scores never \
                     reach the gate and every candidate waits {} s for them; correct the \
                     client ids in evaluators, or give those devices keys (keygen, enroll)",
                    file.display(),
                    release.timeout_s
                ),
            );
        }
    }
    let canary = match release.canary_share {
        0.0 => "no canary stage".to_owned(),
        share => format!(
            "canary {} % of the devices for {} s",
            share * 100.0,
            release.canary_window_s
        ),
    };
    pass(
        "release",
        format!(
            "gated: evaluators {} (min_sites {}, significance {}, timeout {} s then {}), \
             {canary}; {kept}",
            release.evaluators.join(", "),
            release.min_sites,
            release.significance,
            release.timeout_s,
            match release.on_timeout {
                OnTimeout::Hold => "hold",
                OnTimeout::Promote => "promote",
            }
        ),
    )
}

/// How long the broker has to answer the TLS handshake and the login.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// The TLS handshake (with `[broker.tls]`) and the MQTT login, as `run` makes them: the
/// coordinator's client id and a persistent session, which the check neither cleans nor takes
/// anything from (it subscribes to nothing and acknowledges nothing), so a broker that keeps
/// the coordinator's session keeps it whole. A coordinator already running under the same
/// client id is pushed off once and reconnects.
fn check_login(config: &CoordinatorConfig) -> Vec<Check> {
    let broker = config.broker.clone();
    let id = format!("fedge-coordinator-{}", config.federation);
    // rumqttc's blocking client runs its own runtime: on a thread of its own, outside main's.
    let answer = std::thread::spawn(move || connect(&broker, &id))
        .join()
        .unwrap_or_else(|_| Err(Refused::Other("the connection attempt panicked".into())));
    let at = format!("{}:{}", config.broker.host, config.broker.port);
    // Past the handshake, its line; then the login's.
    let verified = (config.broker.tls.as_ref()).map(|tls| {
        let roots = tls.roots();
        pass(
            "tls",
            format!("{at}: the broker's certificate verifies against {roots}"),
        )
    });
    let login = match answer {
        Ok(()) => pass("mqtt", format!("{at} accepted the login (CONNACK)")),
        Err(Refused::Tls(e)) => return vec![fail("tls", tls_advice(&config.broker, &at, &e))],
        Err(Refused::Mqtt(e)) => fail("mqtt", login_advice(&config.broker, &at, &e)),
        Err(Refused::Other(e)) => return vec![fail("mqtt", format!("{at}: {e}"))],
    };
    verified.into_iter().chain([login]).collect()
}

/// Why the broker was not logged in to.
enum Refused {
    /// The TLS handshake failed: rumqttc's error.
    Tls(String),
    /// Past TLS (or without it), the broker closed or refused the session.
    Mqtt(Box<ConnectionError>),
    /// No answer in time, or no attempt.
    Other(String),
}

/// Connects, waits for the CONNACK and disconnects.
fn connect(broker: &BrokerConfig, id: &str) -> Result<(), Refused> {
    let mut options = broker.options(id, None);
    options.set_clean_session(false);
    options.set_manual_acks(true);
    let (client, mut connection) = rumqttc::Client::new(options, 10);
    let start = Instant::now();
    let silent = || {
        let wait = CONNECT_WAIT.as_secs();
        Refused::Other(format!(
            "no answer to the TLS handshake and MQTT login within {wait} s"
        ))
    };
    let outcome = loop {
        let Some(left) = CONNECT_WAIT.checked_sub(start.elapsed()) else {
            break Err(silent());
        };
        match connection.recv_timeout(left) {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => break Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(ConnectionError::Tls(e))) => break Err(Refused::Tls(e.to_string())),
            Ok(Err(e)) => break Err(Refused::Mqtt(Box::new(e))),
            Err(_) => break Err(silent()),
        }
    };
    let _ = client.disconnect();
    // The DISCONNECT goes out before the connection is dropped.
    let until = Instant::now() + Duration::from_secs(1);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match connection.recv_timeout(left) {
            Ok(Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect))) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(_)) => {}
        }
    }
    outcome
}

/// A failed handshake, with the file to fix.
fn tls_advice(broker: &BrokerConfig, at: &str, error: &str) -> String {
    let Some(tls) = &broker.tls else {
        return format!("{at}: {error}");
    };
    let roots = match tls.ca_file.as_os_str().is_empty() {
        true => "the system's CA store (no [broker.tls] ca_file)".to_owned(),
        false => format!("[broker.tls] ca_file {}", tls.ca_file.display()),
    };
    if error.contains("NotValidForName") || error.contains("not valid for name") {
        return format!(
            "{at}: the TLS handshake failed ({error}): the broker's certificate does not name \
             {:?}; set [broker] host to a name its certificate holds (provision --broker-host)",
            broker.host
        );
    }
    format!(
        "{at}: the TLS handshake failed ({error}): the broker's certificate does not verify \
         against {roots}: set ca_file to the CA that signed the broker's certificate (a kit's \
         ca.pem); if this port is plain MQTT, remove [broker.tls]"
    )
}

/// A refused or dropped login, with the setting to fix.
fn login_advice(broker: &BrokerConfig, at: &str, error: &ConnectionError) -> String {
    let tls = broker.tls.as_ref();
    let said = error.to_string();
    // A broker that refuses a client certificate says so with a TLS alert after the handshake,
    // which reaches the client as the first read failing.
    if let Some(tls) = tls
        && said.contains("alert")
    {
        return match &tls.client_cert {
            Some(cert) => format!(
                "{at}: the broker refused the client certificate ({said}): [broker.tls] \
                 client_cert {} must be signed by the CA the broker trusts (its cafile; a \
                 kit's certificates are signed by its ca/ca.pem)",
                cert.display()
            ),
            None => format!(
                "{at}: the broker ended the session after the TLS handshake ({said}): if it \
                 requires client certificates, set [broker.tls] client_cert and client_key"
            ),
        };
    }
    format!("{at}: {}", fedge_mqtt::describe_error(error))
}

/// The state folder can be written, and what it holds can be read.
fn check_state(dir: Option<&Path>) -> Check {
    let Some(dir) = dir else {
        return pass(
            "state",
            "no state_dir: a restart starts the federation afresh",
        );
    };
    // Probed where run would write: in the folder, or, before it exists, where it would be
    // made (check leaves nothing behind).
    let existing = dir
        .ancestors()
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("."));
    let probe = existing.join(".fedge-check");
    let written = fedge_daemon::write_atomically(&probe, b"", fedge_daemon::Visibility::Private);
    let _ = std::fs::remove_file(&probe);
    if let Err(e) = written {
        return fail(
            "state",
            format!("state_dir {} cannot be written: {e}", dir.display()),
        );
    }
    if !dir.is_dir() {
        return pass(
            "state",
            format!("{} (made at start); a fresh federation", dir.display()),
        );
    }
    let resumed = match checkpoint::load(&dir.join("checkpoint.bin")) {
        Ok(Some(saved)) => format!("resumes at round {}", saved.next_round),
        Ok(None) => "no checkpoint: a fresh federation".to_owned(),
        Err(e) => return fail("state", format!("{e} (move it away to start afresh)")),
    };
    if let Err(e) = fedge_coordinator::store::serving::load(&dir.join("serving.json")) {
        return fail("state", e.to_string());
    }
    match control::load(&dir.join("control.json")) {
        Ok(Some(settings)) => pass(
            "state",
            format!(
                "{}; {resumed}; operator settings kept ({} banned{})",
                dir.display(),
                settings.banned.len(),
                if settings.paused { ", paused" } else { "" }
            ),
        ),
        Ok(None) => pass("state", format!("{}; {resumed}", dir.display())),
        Err(e) => fail("state", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_that_versions_would_outrun_fails_with_what_to_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.toml");
        let config = |buffer| {
            format!(
                "federation = \"f\"\n[head]\nfeatures = 8\nhidden = 4\nclasses = 2\n\
                 [aggregation]\nmode = \"buffered\"\nbuffer_size = {buffer}\nconcurrency = 1000\n"
            )
        };
        std::fs::write(&path, config(10)).unwrap();
        let found = checks(&path, true);
        let buffer = found.iter().find(|c| c.name == "aggregation").unwrap();
        assert!(
            !buffer.ok && buffer.detail.contains("raise buffer_size"),
            "{buffer:?}"
        );
        std::fs::write(&path, config(100)).unwrap();
        let found = checks(&path, true);
        let buffer = found.iter().find(|c| c.name == "aggregation").unwrap();
        assert!(
            buffer.ok && buffer.detail.contains("every 100 updates"),
            "{buffer:?}"
        );
    }

    #[test]
    fn the_release_mode_is_reported_and_a_gated_evaluator_without_a_key_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.toml");
        let config = |auth: &str, release: &str| {
            format!(
                "federation = \"f\"\n[head]\nfeatures = 8\nhidden = 4\nclasses = 2\n\
                 {auth}[release]\n{release}"
            )
        };
        let release = |text: String| {
            std::fs::write(&path, text).unwrap();
            let found = checks(&path, true);
            found.into_iter().find(|c| c.name == "release").unwrap()
        };
        let direct = release(config("", "keep = 3\n"));
        assert!(
            direct.ok
                && direct.detail.starts_with("direct:")
                && direct.detail.contains("3 releases"),
            "{direct:?}"
        );
        let gated = "mode = \"gated\"\nevaluators = [\"judge\", \"cam-02\"]\n";
        // No keys file: nothing to compare the evaluators with.
        let open = release(config("", gated));
        assert!(open.ok, "{open:?}");
        assert!(
            open.detail
                .starts_with("gated: evaluators judge, cam-02 (min_sites 1"),
            "{open:?}"
        );
        assert!(open.detail.contains("canary 5 %"), "{open:?}");
        // A keys file without judge: its scores would never reach the gate.
        let keys_file = dir.path().join("devices.toml");
        let auth = "[auth]\nkeys_file = \"devices.toml\"\n";
        for id in ["cam-01", "cam-02"] {
            keys::keygen(&keys_file, id, &dir.path().join(format!("{id}.key"))).unwrap();
        }
        let unknown = release(config(auth, gated));
        assert!(!unknown.ok, "{unknown:?}");
        assert!(
            unknown.detail.contains("[\"judge\"]") && unknown.detail.contains("devices.toml"),
            "{unknown:?}"
        );
        keys::keygen(&keys_file, "judge", &dir.path().join("judge.key")).unwrap();
        let known = release(config(auth, gated));
        assert!(known.ok && known.detail.starts_with("gated:"), "{known:?}");
        // An empty keys file (a fresh kit's): no device is known yet, nothing to compare.
        keys::store(&keys_file, &Default::default()).unwrap();
        assert!(release(config(auth, gated)).ok);
    }

    #[test]
    fn a_configuration_run_would_trip_over_fails_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.toml");
        std::fs::write(
            &path,
            "federation = \"f\"\nstay_up = true\nstate_dir = \"state\"\n[head]\nfeatures = 8\n\
             hidden = 4\nclasses = 2\n[auth]\nkeys_file = \"devices.toml\"\n",
        )
        .unwrap();
        let found = checks(&path, true);
        let failed: Vec<&str> = found.iter().filter(|c| !c.ok).map(|c| c.name).collect();
        assert_eq!(failed, ["keys", "operator"]);
        let keys = found.iter().find(|c| c.name == "keys").unwrap();
        assert!(keys.detail.contains("keygen"), "{}", keys.detail);
        let state = found.iter().find(|c| c.name == "state").unwrap();
        assert!(
            state.detail.contains("a fresh federation"),
            "{}",
            state.detail
        );
        assert!(
            !dir.path().join("state").exists(),
            "check leaves nothing behind"
        );
        // A damaged operator settings file is named before run stops on it.
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        std::fs::write(dir.path().join("state/control.json"), b"{").unwrap();
        let found = checks(&path, true);
        let state = found.iter().find(|c| c.name == "state").unwrap();
        assert!(
            !state.ok && state.detail.contains("control.json"),
            "{}",
            state.detail
        );
        // So is a damaged serving pointer's number.
        std::fs::remove_file(dir.path().join("state/control.json")).unwrap();
        std::fs::write(dir.path().join("state/serving.json"), b"[]").unwrap();
        let found = checks(&path, true);
        let state = found.iter().find(|c| c.name == "state").unwrap();
        assert!(
            !state.ok && state.detail.contains("serving.json"),
            "{}",
            state.detail
        );
    }
}
