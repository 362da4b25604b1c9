//! The architecture ARCHITECTURE.md describes, checked against the source tree: no module
//! cycle in any crate, no file over the length limit, and state machines that do no I/O.

mod graph;

use std::path::{Path, PathBuf};

use graph::{CRATES, MAX_LINES, SourceFile, cycles, io_names, module_cycles, read_crate};

fn workspace() -> PathBuf {
    crate::common::repo_root().to_path_buf()
}

fn crate_files(folder: &str) -> Vec<SourceFile> {
    read_crate(&workspace().join(folder).join("src"))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for folder in CRATES {
        let files = crate_files(folder);
        for cycle in cycles(&files) {
            let names: Vec<String> = cycle.iter().map(|p| shown(p)).collect();
            found.push(names.join(" ↔ "));
        }
        for cycle in module_cycles(&files) {
            found.push(format!("{folder}/src/{cycle}"));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn no_source_file_is_longer_than_the_limit_without_its_tests() {
    let long: Vec<String> = CRATES
        .into_iter()
        .flat_map(crate_files)
        .filter(|f| f.lines > MAX_LINES)
        .map(|f| format!("{} ({} lines)", shown(&f.path), f.lines))
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The sans-IO parts of the device core: the agent machine and the trainer. (The coordinator's
/// layers are checked by `fedge-rounds`' own `layering_tests`; what each core crate may depend
/// on, by its manifest and [`the_core_crates_depend_on_no_network_crate`].)
const SANS_IO: [(&str, &str); 2] = [("device", "machine"), ("device", "train")];

#[test]
fn the_state_machines_do_no_io_and_read_no_clock() {
    let mut found = Vec::new();
    for (folder, module) in SANS_IO {
        let prefix: Vec<&str> = module.split('/').collect();
        let files = crate_files(folder);
        let inside: Vec<&SourceFile> = files
            .iter()
            .filter(|f| f.module.len() >= prefix.len() && f.module[..prefix.len()] == prefix[..])
            .collect();
        assert!(!inside.is_empty(), "no module {folder}/src/{module}");
        for file in inside {
            let names = io_names(file);
            if !names.is_empty() {
                found.push(format!("{}: {}", shown(&file.path), names.join(", ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "I/O in a state machine:\n{}",
        found.join("\n")
    );
}

/// Writes `text` to `name` under `src`, making its folder.
fn write_in(src: &std::path::Path, name: &str, text: &str) {
    let path = src.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn the_checker_sees_a_cycle_and_a_clean_layering() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |name: &str, text: &str| write_in(src, name, text);
    write("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\n");
    write("a.rs", "use crate::b::B;\npub struct A(B);\n");
    write(
        "b.rs",
        "pub struct B;\npub fn f() -> crate::c::C { crate::c::C }\n",
    );
    write("c.rs", "pub struct C;\n");
    assert!(cycles(&read_crate(src)).is_empty());
    // c now names a's item through the crate root's re-export: a → b → c → a.
    write(
        "c.rs",
        "pub struct C;\npub fn g() -> Option<crate::A> { None }\n",
    );
    let found = cycles(&read_crate(src));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3);

    // Folders: no file cycle, but `p` (through its test file) and `q` name each other.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |name: &str, text: &str| write_in(src, name, text);
    write("lib.rs", "mod p;\nmod q;\n");
    write("p/mod.rs", "mod tests;\npub struct P;\n");
    write(
        "p/tests.rs",
        "use crate::q::Q;\n#[test]\nfn t() { let _ = Q; }\n",
    );
    write("q/mod.rs", "pub struct Q(crate::p::P);\n");
    let files = read_crate(src);
    assert!(cycles(&files).is_empty());
    assert_eq!(module_cycles(&files), [": p ↔ q"]);
}

/// The sans-I/O cores, kept so by Cargo: their dependency trees hold no async runtime, MQTT
/// client or broker, HTTP server or fedge's MQTT crate. The workspace-hack is left out of the
/// trees: every member depends on it only to unify features (.config/hakari.toml), it has no
/// code, and a crate can use only what its own manifest names.
const CORES: [&str; 2] = ["fedge-rounds", "fedge-device"];
const NETWORK_CRATES: [&str; 6] = ["tokio", "rumqttc", "rumqttd", "axum", "hyper", "fedge-mqtt"];

#[test]
fn the_core_crates_depend_on_no_network_crate() {
    for core in CORES {
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "tree",
                "--offline",
                "-e",
                "normal",
                "--prefix",
                "none",
                "--prune",
                "workspace-hack",
                "-p",
                core,
            ])
            .current_dir(workspace())
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tree = String::from_utf8_lossy(&out.stdout);
        assert!(tree.lines().count() > 5, "{tree}");
        let found: Vec<&str> = (tree.lines())
            .filter(|line| {
                let name = line.split_whitespace().next().unwrap_or_default();
                NETWORK_CRATES.contains(&name)
            })
            .collect();
        assert!(found.is_empty(), "{core} depends on {found:?}");
    }
}
