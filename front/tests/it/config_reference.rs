//! docs/configuration.md, the configuration reference generated from the configuration types
//! (`fedge_daemon::reference`): the committed page is what the code generates, every key of the
//! shipped configuration files is in it, and every key in it says what it does.

use std::collections::BTreeSet;
use std::path::Path;

use fedge_coordinator::CoordinatorConfig;
use fedge_daemon::reference::{self, Daemon};
use fedge_edge::config::EdgeConfig;

use crate::common;

const REGENERATE: &str = "FEDGE_BLESS=1 cargo test --workspace --test it -- config_reference";

fn coordinator() -> String {
    reference::reference::<CoordinatorConfig>(Daemon::Coordinator)
}

fn edge() -> String {
    reference::reference::<EdgeConfig>(Daemon::Edge)
}

#[test]
fn the_committed_reference_is_what_the_code_generates() {
    // The page documents the default build: with burn-ndarray built in (`--features ndarray`),
    // `backend` takes one more value.
    if cfg!(feature = "ndarray") {
        return;
    }
    let path = common::repo_root().join("docs/configuration.md");
    let generated = reference::document::<CoordinatorConfig, EdgeConfig>();
    if std::env::var("FEDGE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == generated {
        return;
    }
    let line = (committed.lines().zip(generated.lines()))
        .position(|(a, b)| a != b)
        .unwrap_or(committed.lines().count().min(generated.lines().count()));
    let at = |text: &str| text.lines().nth(line).unwrap_or("(end of file)").to_owned();
    panic!(
        "docs/configuration.md differs from what the configuration types generate, first at \
         line {}:\n  committed: {}\n  generated: {}\nWrite it again with `{REGENERATE}` and \
         commit it.",
        line + 1,
        at(&committed),
        at(&generated),
    );
}

/// The TOML paths a reference documents: every table (`broker.tls`) and every key
/// (`broker.tls.ca_file`, `data.kind`), read from its headings and rows.
fn documented(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut table = String::new();
    for line in markdown.lines() {
        if let Some(heading) = line.strip_prefix("### ").or(line.strip_prefix("#### ")) {
            table = (heading
                .split_once("`[")
                .and_then(|(_, rest)| rest.split_once("]`")))
            .map_or(String::new(), |(name, _)| name.to_owned());
            if let Some((tag, _)) = heading
                .split_once("` with `")
                .and_then(|(_, rest)| rest.split_once(" = "))
            {
                found.insert(format!("{table}.{tag}"));
            }
            if !table.is_empty() {
                found.insert(table.clone());
            }
        } else if let Some(row) = line.strip_prefix("| `") {
            let key = row.split('`').next().unwrap_or_default();
            found.insert(match table.as_str() {
                "" => key.to_owned(),
                _ => format!("{table}.{key}"),
            });
        }
    }
    found
}

/// Every key path of a TOML file that `documented` lacks.
fn undocumented(file: &Path, documented: &BTreeSet<String>) -> Vec<String> {
    fn walk(table: &toml::Table, prefix: &str, known: &BTreeSet<String>, out: &mut Vec<String>) {
        for (key, value) in table {
            let path = match prefix {
                "" => key.clone(),
                _ => format!("{prefix}.{key}"),
            };
            if !known.contains(&path) {
                out.push(path.clone());
            }
            if let toml::Value::Table(inner) = value {
                walk(inner, &path, known, out);
            }
        }
    }
    let text = std::fs::read_to_string(file).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let mut missing = Vec::new();
    walk(&table, "", documented, &mut missing);
    let shown = file.strip_prefix(common::repo_root()).unwrap_or(file);
    (missing.into_iter())
        .map(|key| format!("{}: {key}", shown.display()))
        .collect()
}

#[test]
fn every_key_of_the_shipped_files_is_in_the_reference() {
    let root = common::repo_root();
    let coordinator = documented(&coordinator());
    let edge = documented(&edge());
    // What the reference must at least hold, so the parse above cannot pass on nothing.
    for key in [
        "federation",
        "broker.tls.ca_file",
        "train.objective",
        "strategy",
    ] {
        assert!(coordinator.contains(key), "coordinator: {key}");
    }
    for key in [
        "client_id",
        "data.kind",
        "data.domain",
        "data.root",
        "inference.listen",
    ] {
        assert!(edge.contains(key), "device profile: {key}");
    }
    let mut missing = Vec::new();
    for file in ["configs/coordinator.toml", "configs/site.toml"] {
        missing.extend(undocumented(&root.join(file), &coordinator));
    }
    let profiles = common::shipped_profiles();
    assert!(!profiles.is_empty());
    for profile in profiles {
        missing.extend(undocumented(&profile, &edge));
    }
    assert!(
        missing.is_empty(),
        "keys of shipped files missing from the configuration reference:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_key_in_the_reference_says_what_it_does() {
    for (name, markdown) in [("coordinator", coordinator()), ("device profile", edge())] {
        let mut table = String::new();
        let mut rows = 0;
        for line in markdown.lines() {
            if line.starts_with("### ") || line.starts_with("#### ") {
                table = line.to_owned();
            }
            let Some(row) = line.strip_prefix("| `") else {
                continue;
            };
            rows += 1;
            // | `key` | type | default | description |: split on the pipes Markdown sees.
            let cells: Vec<&str> = row.split(" | ").collect();
            assert_eq!(cells.len(), 4, "{name}, {table}: {line}");
            assert!(
                cells[1] != "any" && !cells[1].is_empty(),
                "{name}, {table}: no type in {line}"
            );
            let description = cells[3].trim_end_matches(" |").trim();
            assert!(
                description.len() > 10,
                "{name}, {table}: `{}` has no description; give its field a doc comment",
                cells[0].trim_end_matches('`')
            );
        }
        assert!(rows > 20, "{name}: only {rows} keys");
    }
}
