//! Is this profile's agent running? `check` must then leave the broker alone: a broker that
//! names clients by their certificate (`use_identity_as_username` and
//! `use_username_as_clientid`, as `deploy/mosquitto/fedge.conf` ships) gives the check's
//! connection the agent's client id whatever id the check sends, and so takes the agent's
//! session over and disconnects it. Nothing the check does before its MQTT login tells such a
//! broker apart from one that keeps client ids, so the check does not log in while the agent
//! runs.
//!
//! What tells, most certain first: the key file the agent holds while it runs
//! (`fedge-edge run` takes a shared hold on `key_file` for its whole life), a process running
//! `fedge-edge run --config` with this very file (Linux, `/proc`), and, for a profile without
//! a key file, a fedge-edge agent answering on its `metrics_listen`.

use std::path::{Path, PathBuf};

use crate::config::EdgeConfig;

/// Why the agent of the profile at `path` is taken to be running, or `None` when nothing says
/// it is. `metrics_answer`: a fedge-edge agent answers on the profile's `metrics_listen`.
pub fn evidence(path: &Path, config: &EdgeConfig, metrics_answer: bool) -> Option<String> {
    let key = config.key_file.as_deref().filter(|k| k.exists());
    if let Some(key) = key
        && key_in_use(key)
    {
        return Some(format!(
            "its key_file {} is held by another process, as `fedge-edge run` holds it",
            key.display()
        ));
    }
    if let Some(pid) = agent_process(path) {
        return Some(format!(
            "process {pid} is `fedge-edge run` with this profile"
        ));
    }
    // Without a key file the port is the one sign left; with one, the free key says that
    // whoever answers there is not this profile's agent.
    match (key, metrics_answer, config.metrics_listen) {
        (None, true, Some(addr)) => Some(format!(
            "a fedge-edge agent answers on its metrics_listen {addr}"
        )),
        _ => None,
    }
}

/// True while another process holds `key` (the running agent's shared hold, or `fedge-edge
/// enroll` replacing it). Taking the exclusive hold is the only way to ask; it is dropped at
/// once.
fn key_in_use(key: &Path) -> bool {
    matches!(fedge_daemon::hold_alone(key), Ok(fedge_daemon::Hold::Taken))
}

/// The id of a process running `fedge-edge run --config <the file at path>`, read from
/// `/proc` (none elsewhere, and none whose command line this user may not read).
fn agent_process(path: &Path) -> Option<u32> {
    let ours = std::fs::canonicalize(path).ok()?;
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .find(|pid| runs_profile(*pid).is_some_and(|profile| profile == ours))
}

/// The profile process `pid` runs the agent with, when it is `fedge-edge run`.
fn runs_profile(pid: u32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = (cmdline.split(|b| *b == 0))
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let program = Path::new(args.first()?).file_name()?.to_string_lossy();
    if !program.starts_with("fedge-edge") || !args.iter().any(|a| a == "run") {
        return None;
    }
    let config = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.as_str() {
            "--config" => args.get(i + 1).cloned(),
            a => a.strip_prefix("--config=").map(str::to_owned),
        })?;
    let config = PathBuf::from(config);
    let config = match config.is_absolute() {
        true => config,
        false => std::fs::read_link(format!("/proc/{pid}/cwd"))
            .ok()?
            .join(config),
    };
    std::fs::canonicalize(config).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_is_seen_and_a_free_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("device.key");
        std::fs::write(&key, "ab".repeat(32)).unwrap();
        assert!(!key_in_use(&key));
        let held = fedge_daemon::hold_in_use(&key).unwrap();
        assert!(key_in_use(&key));
        drop(held);
        assert!(!key_in_use(&key));
    }

    #[test]
    fn this_process_is_not_taken_for_an_agent() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("profile.toml");
        std::fs::write(&profile, "").unwrap();
        assert_eq!(agent_process(&profile), None);
    }
}
