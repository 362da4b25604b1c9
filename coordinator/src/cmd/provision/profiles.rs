//! The device profile a kit's profiles are made from: one of the shipped profiles
//! (`firmware-configs/`), built into the binary with the backbone they name, so that provision
//! works from any folder; or a file the operator names, whose relative paths are read from its
//! folder.

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

/// The shipped profiles, by name (their file name without `.toml`).
const SHIPPED: [(&str, &str); 5] = [
    (
        "generic-x86_64",
        include_str!("../../../../firmware-configs/generic-x86_64.toml"),
    ),
    (
        "arm64-gateway",
        include_str!("../../../../firmware-configs/arm64-gateway.toml"),
    ),
    (
        "low-memory-arm64",
        include_str!("../../../../firmware-configs/low-memory-arm64.toml"),
    ),
    (
        "jetson-orin-nano",
        include_str!("../../../../firmware-configs/jetson-orin-nano.toml"),
    ),
    (
        "evaluation-site",
        include_str!("../../../../firmware-configs/evaluation-site.toml"),
    ),
];

/// The files the shipped profiles name, by their path from the repository's root (the
/// profiles name them relative to `firmware-configs/`).
const SHIPPED_FILES: [(&str, &[u8]); 2] = [
    (
        "models/assets/digits-conv.toml",
        include_bytes!("../../../../models/assets/digits-conv.toml"),
    ),
    (
        "models/assets/digits-conv.onnx",
        include_bytes!("../../../../models/assets/digits-conv.onnx"),
    ),
];

/// The profile used without `--profile`.
pub(super) const DEFAULT: &str = "generic-x86_64";

/// The names `--profile` takes for the built-in profiles.
pub(super) fn shipped_names() -> Vec<&'static str> {
    SHIPPED.iter().map(|(name, _)| *name).collect()
}

/// A device profile and where the files it names by relative path come from.
pub(super) struct Profile {
    /// Its text.
    pub(super) text: String,
    /// What the kit's profiles say they were made from.
    pub(super) origin: String,
    /// The folder of a profile file; `None` for a built-in one.
    folder: Option<PathBuf>,
}

impl Profile {
    /// `--profile`: a built-in profile's name (the default one when `None`), else a file.
    pub(super) fn open(arg: Option<&Path>) -> anyhow::Result<Self> {
        let name = arg.map_or(Some(DEFAULT), |a| a.to_str());
        if let Some((name, text)) = SHIPPED.iter().find(|(n, _)| Some(*n) == name) {
            return Ok(Self {
                text: (*text).to_owned(),
                origin: format!("the built-in profile firmware-configs/{name}.toml"),
                folder: None,
            });
        }
        let Some(path) = arg else {
            bail!("no built-in profile {DEFAULT}");
        };
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "--profile {}: give a device profile file, or the name of a built-in one ({})",
                path.display(),
                shipped_names().join(", ")
            )
        })?;
        Ok(Self {
            text,
            origin: path.display().to_string(),
            folder: Some(path.parent().unwrap_or(Path::new(".")).to_owned()),
        })
    }

    /// Where the file `rel` (relative to the profile) is: a path on disk, or a built-in file's
    /// name; a copy of one is linked to the first copy of the same source.
    pub(super) fn source(&self, rel: &Path) -> PathBuf {
        match &self.folder {
            Some(folder) => folder.join(rel),
            None => Path::new("<built-in>").join(shipped_path(rel)),
        }
    }

    /// The bytes of the file `rel` (relative to the profile).
    pub(super) fn read(&self, rel: &Path) -> anyhow::Result<Vec<u8>> {
        match &self.folder {
            Some(folder) => {
                let path = folder.join(rel);
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
            }
            None => {
                let wanted = shipped_path(rel);
                let found = SHIPPED_FILES.iter().find(|(p, _)| Path::new(p) == wanted);
                match found {
                    Some((_, bytes)) => Ok(bytes.to_vec()),
                    None => bail!(
                        "{}: not a file built into fedge-coordinator: give --profile a profile \
                         file that names it",
                        rel.display()
                    ),
                }
            }
        }
    }
}

/// A path relative to `firmware-configs/` as a path from the repository's root, `..` taken
/// away.
fn shipped_path(rel: &Path) -> PathBuf {
    let mut out: Vec<Component> = vec![Component::Normal("firmware-configs".as_ref())];
    for part in rel.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_profiles_are_the_shipped_files_and_bring_their_backbone() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files: Vec<String> = std::fs::read_dir(root.join("firmware-configs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| Some(n.strip_suffix(".toml")?.to_owned()))
            .filter(|n| !n.starts_with('.'))
            .collect();
        files.sort();
        let mut names = shipped_names();
        names.sort();
        assert_eq!(names, files, "every shipped profile is built in");
        for name in shipped_names() {
            let profile = Profile::open(Some(Path::new(name))).unwrap();
            let table: toml::Table = profile.text.parse().unwrap();
            let card = Path::new(table["backbone"].as_str().unwrap());
            assert!(profile.read(card).is_ok(), "{name}: {}", card.display());
            assert_eq!(
                profile.source(card),
                Path::new("<built-in>/models/assets/digits-conv.toml")
            );
        }
        let default = Profile::open(None).unwrap();
        assert!(
            default.origin.contains("generic-x86_64"),
            "{}",
            default.origin
        );
        // A file is read from disk, its files beside it.
        let path = root.join("firmware-configs/arm64-gateway.toml");
        let file = Profile::open(Some(&path)).unwrap();
        let onnx = Path::new("../models/assets/digits-conv.onnx");
        assert_eq!(file.read(onnx).unwrap(), profile_bytes(onnx));
        let missing = Profile::open(Some(Path::new("no-such-profile")));
        let said = format!("{:#}", missing.err().unwrap());
        assert!(said.contains("generic-x86_64, arm64-gateway"), "{said}");
    }

    fn profile_bytes(rel: &Path) -> Vec<u8> {
        Profile::open(None).unwrap().read(rel).unwrap()
    }
}
