use super::super::{ConfigError, CoordinatorConfig, InvalidConfig};
use super::*;

const HEAD: &str = "[head]\nfeatures = 4\nclasses = 2\n";

/// The unknown key `CoordinatorConfig::load` reports for `text`, and its message.
fn unknown(text: &str) -> (UnknownKey, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    match CoordinatorConfig::load(&path) {
        Err(ConfigError::Invalid {
            reason: InvalidConfig::UnknownKey(unknown),
            ..
        }) => {
            let said = unknown.to_string();
            (*unknown, said)
        }
        other => panic!("{text:?}: not an unknown key: {other:?}"),
    }
}

#[test]
fn a_misspelt_top_level_key_is_named_with_its_line_the_closest_key_and_the_valid_ones() {
    let (found, said) = unknown(&format!("federation = \"f\"\nrouns = 5\n{HEAD}"));
    assert_eq!(found.line, 2, "{said}");
    assert_eq!(found.hint, Some(Hint::Closest("rounds".into())), "{said}");
    assert!(said.starts_with("line 2: unknown key `rouns`; did you mean `rounds`?"));
    // The top level's keys and tables, from the schema (the flattened strategy's among them).
    for valid in [
        "`federation`",
        "`strategy`",
        "`kappa`",
        "`round_timeout_s`",
        "[broker]",
    ] {
        assert!(said.contains(valid), "{valid}: {said}");
    }
    // Not serde's hint for a missing key, which is wrong here.
    assert!(!said.contains("write it above"), "{said}");
    // A key at the end of the file, after every section, is still found at its line (the
    // strategy's flattened keys make serde lose it).
    let (found, said) = unknown(&format!("federation = \"f\"\nfederaton = \"g\"\n{HEAD}"));
    assert_eq!(found.line, 2, "{said}");
    assert_eq!(
        found.hint,
        Some(Hint::Closest("federation".into())),
        "{said}"
    );
}

#[test]
fn a_misspelt_section_is_named_as_a_table_with_the_closest_one() {
    let text = format!("federation = \"f\"\n{HEAD}\n[relase]\nmode = \"gated\"\n");
    let (found, said) = unknown(&text);
    assert_eq!((found.line, found.is_table), (6, true), "{said}");
    assert!(
        said.starts_with("line 6: unknown table [relase]; did you mean [release]?"),
        "{said}"
    );
    let (found, said) = unknown(&format!("federation = \"f\"\n{HEAD}[trian]\nseed = 1\n"));
    assert_eq!(found.hint, Some(Hint::Closest("train".into())), "{said}");
    // A nested table's name, with the full path.
    let text = format!("federation = \"f\"\n{HEAD}[broker]\nhost = \"b\"\n[broker.tsl]\n");
    let (found, said) = unknown(&text);
    assert_eq!(found.line, 7, "{said}");
    assert!(
        said.contains("unknown table [broker.tsl] in [broker]; did you mean [broker.tls]?"),
        "{said}"
    );
}

#[test]
fn a_misspelt_key_in_a_section_names_the_section_its_keys_and_the_closest() {
    let text = format!("federation = \"f\"\n{HEAD}[train]\nbatch_size = 8\nlearnig_rate = 0.1\n");
    let (found, said) = unknown(&text);
    assert_eq!(found.line, 7, "{said}");
    assert_eq!(found.table, ["train"]);
    assert!(
        said.starts_with(
            "line 7: unknown key `learnig_rate` in [train]; did you mean `learning_rate`?"
        ),
        "{said}"
    );
    assert!(
        said.contains("[train] takes the keys `adversarial_batches`"),
        "{said}"
    );
    assert!(said.contains(", `objective`, "), "{said}");
    // Inside a nested table.
    let text = format!("federation = \"f\"\n{HEAD}[broker.tls]\ncafile = \"ca.pem\"\n");
    let (found, said) = unknown(&text);
    assert_eq!(
        (found.line, found.table.clone()),
        (6, vec!["broker".into(), "tls".into()])
    );
    assert!(said.contains("did you mean `ca_file`?"), "{said}");
    assert!(said.contains("`client_key`"), "{said}");
}

#[test]
fn a_key_in_the_wrong_table_says_where_it_belongs() {
    // A top-level key written below a section: TOML reads it as the section's.
    let (found, said) = unknown(&format!("federation = \"f\"\n{HEAD}rounds = 3\n"));
    assert_eq!(found.hint, Some(Hint::Elsewhere(vec![vec![]])), "{said}");
    assert!(
        said.contains(
            "line 5: unknown key `rounds` in [head]; `rounds` is a top-level key: \
                       write it above the first [section]."
        ),
        "{said}"
    );
    // A section's key at the top level.
    let (_, said) = unknown(&format!("federation = \"f\"\nlearning_rate = 0.1\n{HEAD}"));
    assert!(
        said.contains("`learning_rate` belongs in [train]."),
        "{said}"
    );
    // Far from every key: no guess, the list.
    let (found, said) = unknown(&format!("federation = \"f\"\nzzzzzzzz = 1\n{HEAD}"));
    assert_eq!(found.hint, None, "{said}");
    assert!(
        said.contains("line 2: unknown key `zzzzzzzz`. The top level takes"),
        "{said}"
    );
}

#[test]
fn known_keys_syntax_errors_and_open_tables_are_left_to_serde() {
    // The shipped configurations have no unknown key.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for file in ["configs/coordinator.toml", "configs/site.toml"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert_eq!(find::<CoordinatorConfig>(&text), None, "{file}");
    }
    // Not TOML: serde's message, with its place.
    assert_eq!(find::<CoordinatorConfig>("federation = \n"), None);
}

#[test]
fn the_distance_counts_a_swap_of_neighbours_as_one_edit() {
    assert_eq!(distance("trian", "train"), 1);
    assert_eq!(distance("rouns", "rounds"), 1);
    assert_eq!(distance("federaton2", "federation"), 2);
    assert_eq!(distance("", "abc"), 3);
    assert_eq!(distance("same", "same"), 0);
}
