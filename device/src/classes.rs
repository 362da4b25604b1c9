//! A device's classes on the federation's numbering.
//!
//! A device numbers its classes from what it has (its site folder's class folders, sorted);
//! the federation numbers them once, in the coordinator's `[model] classes`, and every task
//! and released model carries the list. Before training on a task or scoring a release, the
//! device renumbers its labels onto that list by name, so that a site missing a class still
//! trains the federation's output for each class it has, and refuses when it has a class the
//! federation does not (naming it), instead of shifting every later label.

use crate::features::FeatureSet;

/// Classes the device has samples of that the federation's list lacks.
pub fn unknown_classes<'a>(local: &'a [String], federation: &[String]) -> Vec<&'a str> {
    local
        .iter()
        .filter(|name| !federation.contains(name))
        .map(String::as_str)
        .collect()
}

/// Why a device cannot use a federation's class list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this device has images of class{} {}, which the federation's class list does not have \
     (it has: {}); remove or rename those folders, or add the class to the coordinator's \
     [model] classes",
    if unknown.len() == 1 { "" } else { "es" },
    quoted(unknown),
    federation.join(", ")
)]
pub struct UnknownClasses {
    /// The device's classes the federation lacks.
    pub unknown: Vec<String>,
    /// The federation's classes.
    pub federation: Vec<String>,
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that every class the device has samples of is in `federation`.
pub fn check(local: &[String], federation: &[String]) -> Result<(), UnknownClasses> {
    let unknown = unknown_classes(local, federation);
    if unknown.is_empty() {
        return Ok(());
    }
    // Long lists are cut: the message goes into a status document.
    const SHOWN: usize = 20;
    let mut shown: Vec<String> = federation.iter().take(SHOWN).cloned().collect();
    if federation.len() > SHOWN {
        shown.push(format!("… {} more", federation.len() - SHOWN));
    }
    Err(UnknownClasses {
        unknown: unknown.into_iter().take(SHOWN).map(str::to_owned).collect(),
        federation: shown,
    })
}

/// Labels numbered by `names` (label `l` is class `names[l]`), renumbered in place onto
/// `federation`; `names` becomes `federation`. Labels whose name is missing from `federation`
/// fail the whole renumbering (nothing is changed).
pub fn renumber(
    sets: &mut [&mut FeatureSet],
    names: &mut Vec<String>,
    federation: &[String],
) -> Result<(), UnknownClasses> {
    if names.as_slice() == federation {
        return Ok(());
    }
    let used = used_names(sets, names);
    check(&used, federation)?;
    let map: Vec<u32> = names
        .iter()
        .map(|name| {
            let at = federation.iter().position(|f| f == name);
            // Names without samples map nowhere, and no label refers to them.
            at.map_or(u32::MAX, |k| k as u32)
        })
        .collect();
    for set in sets.iter_mut() {
        for label in &mut set.labels {
            *label = map[*label as usize];
        }
    }
    names.clone_from(&federation.to_vec());
    Ok(())
}

/// The names that some label of `sets` refers to.
fn used_names(sets: &[&mut FeatureSet], names: &[String]) -> Vec<String> {
    let mut used = vec![false; names.len()];
    for set in sets {
        for &label in &set.labels {
            if let Some(u) = used.get_mut(label as usize) {
                *u = true;
            }
        }
    }
    names
        .iter()
        .zip(used)
        .filter(|(_, u)| *u)
        .map(|(n, _)| n.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn set(labels: &[u32]) -> FeatureSet {
        FeatureSet {
            dim: 1,
            features: labels.iter().map(|&l| l as f32).collect(),
            labels: labels.to_vec(),
        }
    }

    #[test]
    fn a_site_missing_a_class_keeps_the_federation_numbering() {
        // The site has no "dog": its own numbering would make "fox" label 1, the federation's
        // "dog".
        let mut local = names(&["cat", "fox"]);
        let federation = names(&["cat", "dog", "fox"]);
        let (mut train, mut val) = (set(&[0, 1, 1]), set(&[1]));
        renumber(&mut [&mut train, &mut val], &mut local, &federation).unwrap();
        assert_eq!(train.labels, [0, 2, 2]);
        assert_eq!(val.labels, [2]);
        assert_eq!(local, federation);
        // Renumbering onto the same list again changes nothing.
        renumber(&mut [&mut train], &mut local, &federation).unwrap();
        assert_eq!(train.labels, [0, 2, 2]);
    }

    #[test]
    fn a_class_the_federation_lacks_is_refused_by_name_and_nothing_changes() {
        let mut local = names(&["cat", "wolf"]);
        let federation = names(&["cat", "dog"]);
        let mut train = set(&[0, 1]);
        let err = renumber(&mut [&mut train], &mut local, &federation).unwrap_err();
        assert_eq!(err.unknown, ["wolf"]);
        let message = err.to_string();
        assert!(
            message.contains("\"wolf\"") && message.contains("cat, dog"),
            "{message}"
        );
        assert_eq!(train.labels, [0, 1]);
        assert_eq!(local, names(&["cat", "wolf"]));
    }

    #[test]
    fn a_name_without_samples_is_no_obstacle() {
        let mut local = names(&["cat", "empty"]);
        let federation = names(&["dog", "cat"]);
        let mut train = set(&[0, 0]);
        renumber(&mut [&mut train], &mut local, &federation).unwrap();
        assert_eq!(train.labels, [1, 1]);
    }
}
