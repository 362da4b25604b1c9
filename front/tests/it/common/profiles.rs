//! The device profiles shipped in `firmware-configs/`, and copies of them in a test's own
//! folder. A copy never goes next to the shipped files: the tests run in parallel, and a test
//! listing the shipped profiles must not see another test's copy.

use std::path::{Path, PathBuf};

/// The repository's root (the folder above the `fedge` package's `front/`).
pub fn repo_root() -> &'static Path {
    let front = Path::new(env!("CARGO_MANIFEST_DIR"));
    front.parent().unwrap_or(front)
}

/// The folder of the shipped device profiles.
pub fn firmware_configs() -> PathBuf {
    repo_root().join("firmware-configs")
}

/// Every shipped profile (`*.toml`, hidden files left out), sorted by name.
pub fn shipped_profiles() -> Vec<PathBuf> {
    let mut profiles: Vec<PathBuf> = std::fs::read_dir(firmware_configs())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .filter(|path| !path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    profiles.sort();
    profiles
}

/// A copy of the shipped profile `name` (e.g. `generic-x86_64.toml`) in `dir`, with `edit`
/// applied; its backbone path is made absolute first, since the copy is elsewhere.
pub fn profile_copy(name: &str, dir: &Path, edit: impl FnOnce(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(firmware_configs().join(name)).unwrap();
    let text: String = text
        .lines()
        .map(|line| {
            match line
                .strip_prefix("backbone = \"")
                .and_then(|rest| rest.strip_suffix('"'))
            {
                Some(relative) => {
                    format!("backbone = {:?}\n", firmware_configs().join(relative))
                }
                None => format!("{line}\n"),
            }
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, edit(text)).unwrap();
    path
}

/// The shipped generic profile's agent set up in `dir` to serve predictions (over MQTT, no
/// HTTP listener, no labelling page), for tests that install releases by hand.
pub fn serving_setup(dir: &Path) -> fedge_edge::agent::AgentSetup {
    let profile = profile_copy("generic-x86_64.toml", dir, |text| {
        text.replace("enabled = true", "enabled = false").replace(
            "# [inference]\n# listen = \"127.0.0.1:8085\"\n# mqtt = true",
            "[inference]\nmqtt = true",
        )
    });
    fedge_edge::config::EdgeConfig::load(&profile)
        .unwrap()
        .setup()
        .unwrap()
}
