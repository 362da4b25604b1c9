//! The crate's layering, checked on its own source text: the layers never reach up
//! (`updates` ← `strategy`, `objectives` ← `round` ← `boot`), and nothing the round machine is
//! made of touches files, the network or a clock. A `use` that breaks a rule
//! fails here, before it can grow into a module cycle.

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// A file's code without its tests and comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn lower_layers_never_reach_up_and_the_machine_does_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let io = [
        "std::fs",
        "std::net",
        "tokio",
        "rumqttc",
        "rumqttd",
        "Instant",
        "SystemTime",
    ];
    // The composition root (`boot`) sits above every layer. (The daemon's files, network and
    // configuration are in fedge-coordinator, which this crate cannot name: Cargo enforces it.)
    let up = ["crate::boot"];
    // Layer by layer: the paths it must not use.
    let rules: [(&str, Vec<&str>); 6] = [
        ("round", [&io[..], &up[..]].concat()),
        (
            "buffer",
            [
                &io[..],
                &up[..],
                &[
                    "crate::round",
                    "crate::release",
                    "crate::strategy",
                    "crate::objectives",
                    "crate::updates",
                ],
            ]
            .concat(),
        ),
        (
            "release",
            [
                &io[..],
                &up[..],
                &[
                    "crate::round",
                    "crate::strategy",
                    "crate::objectives",
                    "crate::updates",
                ],
            ]
            .concat(),
        ),
        (
            "strategy",
            [&io[..], &up[..], &["crate::round", "crate::objectives"]].concat(),
        ),
        (
            "objectives",
            [&io[..], &up[..], &["crate::round", "crate::strategy"]].concat(),
        ),
        (
            "updates",
            [
                &up[..],
                &["crate::round", "crate::strategy", "crate::objectives"],
            ]
            .concat(),
        ),
    ];
    let mut broken = Vec::new();
    for (layer, forbidden) in &rules {
        for path in sources(&root.join(layer)) {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with("tests.rs") {
                continue;
            }
            let code = code(&path);
            for word in forbidden {
                if code.contains(word) {
                    let shown = path.strip_prefix(&root).unwrap_or(&path).display();
                    broken.push(format!("{shown} uses {word}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}
