//! The kit folder as provision fills it: a file is written only when it is not there yet, and
//! every file is counted as added or kept for the report. The CA is the kit's own when it has
//! one, and new only for a kit without certificates.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use fedge_daemon::Visibility;
use toml::{Table, Value};

use super::certs::{Ca, Role};

/// The marker of a kit folder and the federation it is for.
const MARKER: &str = "kit.toml";

/// The kit folder being written: what was added and what was already there.
pub(super) struct Kit {
    /// The folder.
    pub(super) root: PathBuf,
    /// Files written, relative to the folder.
    pub(super) added: Vec<String>,
    /// Files that were there already.
    pub(super) kept: Vec<String>,
    /// What the operator should know.
    pub(super) notes: Vec<String>,
    /// Device keys added to coordinator/devices.toml.
    pub(super) new_keys: usize,
    /// Files copied into the kit, by source: the first copy, which later ones link to.
    copies: HashMap<PathBuf, PathBuf>,
}

impl Kit {
    /// The path of `rel` in the kit.
    pub(super) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Whether `rel` is in the kit.
    pub(super) fn has(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Makes the folder `rel` (mode 0700) if missing.
    pub(super) fn dir(&self, rel: &str) -> anyhow::Result<()> {
        let path = self.path(rel);
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&path)
            .with_context(|| format!("cannot create {}", path.display()))
    }

    /// The user name of the kit folder's owner (from `/etc/passwd`), if it is found there.
    pub(super) fn owner(&self) -> Option<String> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata(&self.root).ok()?.uid();
            let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
            user_of(&passwd, uid)
        }
        #[cfg(not(unix))]
        None
    }

    /// Writes `rel` unless it is there already.
    pub(super) fn write(
        &mut self,
        rel: &str,
        bytes: &[u8],
        visibility: Visibility,
    ) -> anyhow::Result<()> {
        if self.has(rel) {
            self.kept.push(rel.to_owned());
            return Ok(());
        }
        let path = self.path(rel);
        fedge_daemon::write_atomically(&path, bytes, visibility)
            .with_context(|| format!("cannot write {}", path.display()))?;
        self.added.push(rel.to_owned());
        Ok(())
    }

    /// Copies `source` to `rel` unless it is there already (a hard link to an earlier copy
    /// when the file system allows: one backbone for many devices).
    pub(super) fn copy(&mut self, rel: &str, source: &Path) -> anyhow::Result<()> {
        self.copy_from(rel, source, || {
            std::fs::read(source).with_context(|| format!("cannot read {}", source.display()))
        })
    }

    /// Writes what `read` gives, the file `source`, to `rel` unless it is there already; a
    /// hard link to an earlier copy of the same source when the file system allows (`read`
    /// is then not called).
    pub(super) fn copy_from(
        &mut self,
        rel: &str,
        source: &Path,
        read: impl FnOnce() -> anyhow::Result<Vec<u8>>,
    ) -> anyhow::Result<()> {
        if self.has(rel) {
            self.kept.push(rel.to_owned());
            return Ok(());
        }
        let to = self.path(rel);
        let linked =
            (self.copies.get(source)).is_some_and(|first| std::fs::hard_link(first, &to).is_ok());
        if !linked {
            let bytes = read()?;
            fedge_daemon::write_atomically(&to, &bytes, Visibility::Shared)
                .with_context(|| format!("cannot write {}", to.display()))?;
            self.copies.insert(source.to_owned(), to);
        }
        self.added.push(rel.to_owned());
        Ok(())
    }

    /// `dir/stem.pem` and `dir/stem.key` for `cn`, issued unless both are there (a lone one
    /// is replaced).
    pub(super) fn pair(
        &mut self,
        ca: &Signer,
        dir: &str,
        stem: &str,
        cn: &str,
        role: Role,
        days: u32,
    ) -> anyhow::Result<()> {
        let (cert, key) = (format!("{dir}/{stem}.pem"), format!("{dir}/{stem}.key"));
        if self.has(&cert) && self.has(&key) {
            self.kept.extend([cert, key]);
            return Ok(());
        }
        let pair = ca.get(&cert)?.issue(cn, role, days)?;
        for rel in [&cert, &key] {
            let _ = std::fs::remove_file(self.path(rel));
        }
        self.write(&key, pair.key.as_bytes(), Visibility::Private)?;
        self.write(&cert, pair.cert.as_bytes(), Visibility::Shared)
    }
}

/// The name of user `uid` in `passwd` (`/etc/passwd`'s lines: `name:x:uid:gid:…`).
pub(super) fn user_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty() && !name.starts_with('#')).then(|| name.to_owned())
    })
}

/// The CA when its key is in the kit.
pub(super) struct Signer(Option<Ca>);

impl Signer {
    /// The CA, to issue `for_file`; an error saying to bring ca.key back when it is offline.
    pub(super) fn get(&self, for_file: &str) -> anyhow::Result<&Ca> {
        self.0.as_ref().with_context(|| {
            format!(
                "{for_file} is missing and ca/ca.key is not in the kit (kept offline): put it \
                 back in ca/ to issue the missing certificates, then take it away again"
            )
        })
    }
}

/// Opens the kit folder: new, empty, or an earlier kit of `federation`.
pub(super) fn open(root: &Path, federation: &str) -> anyhow::Result<Kit> {
    let shown = root.display();
    let marker = root.join(MARKER);
    if marker.exists() {
        let text = std::fs::read_to_string(&marker)?;
        let table: Table = text
            .parse()
            .with_context(|| format!("{}", marker.display()))?;
        let theirs = table
            .get("federation")
            .and_then(Value::as_str)
            .unwrap_or("");
        if theirs != federation {
            bail!(
                "{shown} holds the kit of federation {theirs:?}, and --config is for {federation:?}: \
                 give another --out (one kit per federation)"
            );
        }
    } else if root.is_dir() && std::fs::read_dir(root)?.next().is_some() {
        bail!("{shown} is not empty and holds no fedge kit ({MARKER}): give a new or empty --out");
    } else if root.exists() && !root.is_dir() {
        bail!("{shown} is not a folder: give a new or empty --out");
    }
    let mut kit = Kit {
        root: root.to_owned(),
        added: Vec::new(),
        kept: Vec::new(),
        notes: Vec::new(),
        new_keys: 0,
        copies: HashMap::new(),
    };
    kit.dir("")?;
    let marker_text = format!(
        "# A fedge start-up kit (`fedge-coordinator provision`). Running provision again on this\n\
         # folder with the same federation adds what is missing (new devices) and keeps the rest.\n\
         federation = {}\n",
        Value::from(federation)
    );
    kit.write(MARKER, marker_text.as_bytes(), Visibility::Shared)?;
    Ok(kit)
}

/// The CA: the kit's, or a new one for a kit that has no certificate yet.
pub(super) fn ca(kit: &mut Kit, federation: &str) -> anyhow::Result<Signer> {
    kit.dir("ca")?;
    let (cert, key) = (kit.path("ca/ca.pem"), kit.path("ca/ca.key"));
    match (cert.exists(), key.exists()) {
        (true, true) => {
            let cert_pem = std::fs::read_to_string(&cert)?;
            let key_pem =
                fedge_daemon::read_secret(&key).with_context(|| format!("{}", key.display()))?;
            let ca = Ca::load(federation, &cert_pem, &key_pem)
                .with_context(|| format!("the kit's CA in {}", kit.path("ca").display()))?;
            kit.kept.extend(["ca/ca.pem".into(), "ca/ca.key".into()]);
            Ok(Signer(Some(ca)))
        }
        (true, false) => {
            kit.kept.push("ca/ca.pem".into());
            Ok(Signer(None))
        }
        (false, true) => bail!(
            "{} is there but not ca.pem: put the kit's ca.pem back",
            key.display()
        ),
        (false, false) => {
            if kit.has("coordinator/coordinator.pem") || kit.has("broker/broker.pem") {
                bail!(
                    "{} is missing, and the kit's certificates were signed by it: put it back, or \
                     start a new kit",
                    cert.display()
                );
            }
            let (ca, pair) = Ca::create(federation)?;
            kit.write("ca/ca.key", pair.key.as_bytes(), Visibility::Private)?;
            kit.write("ca/ca.pem", pair.cert.as_bytes(), Visibility::Shared)?;
            Ok(Signer(Some(ca)))
        }
    }
}

/// A client folder: certificate, key and the CA certificate.
pub(super) fn client_folder(
    kit: &mut Kit,
    ca: &Signer,
    ca_pem: &[u8],
    dir: &str,
    stem: &str,
    cn: &str,
    days: u32,
) -> anyhow::Result<()> {
    kit.dir(dir)?;
    kit.pair(ca, dir, stem, cn, Role::Client, days)?;
    kit.write(&format!("{dir}/ca.pem"), ca_pem, Visibility::Shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_named_from_the_passwd_file() {
        let passwd =
            "# comment\nroot:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        assert_eq!(user_of(passwd, 0).as_deref(), Some("root"));
        assert_eq!(user_of(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(user_of(passwd, 1001), None);
    }

    #[test]
    fn a_kit_is_owned_by_whoever_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let kit = open(&dir.path().join("kit"), "f").unwrap();
        // A user without a name (a container's bare uid) has no owner to name.
        let me = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        if !me.status.success() {
            return;
        }
        let me = String::from_utf8(me.stdout).unwrap();
        assert_eq!(kit.owner().as_deref(), Some(me.trim()));
    }
}
