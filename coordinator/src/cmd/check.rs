//! `fedge-coordinator check`: what `run` would trip over, found before it runs: the
//! configuration, the keys and operator key files, the state folder and what it holds, the
//! metrics address and (unless `--dry-run`) the broker. One line per check, `ok` or `FAIL` with
//! what to fix; exits 1 when one failed.

use std::path::Path;

use fedge_coordinator::CoordinatorConfig;
use fedge_coordinator::store::{checkpoint, control, keys};
use fedge_daemon::checks::{self, Check, fail, pass};

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
    checks.push(match &config.auth.keys_file {
        None => pass(
            "keys",
            "no [auth] keys_file: nothing is authenticated (docs/mosquitto.md, keygen, enroll)",
        ),
        Some(file) => match keys::load(file) {
            Ok(devices) => pass(
                "keys",
                format!("{} device key(s) in {}", devices.len(), file.display()),
            ),
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
        checks.push(checks::broker(&config.broker.host, config.broker.port));
    }
    checks
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
