//! The audit trail: `audit.jsonl` in the state folder, one JSON object per line, appended and
//! never rewritten, each line chained to the one before by its SHA-256.
//!
//! ```json
//! {"seq":7,"at":"2025-11-26T09:14:03.221Z","who":"coordinator","event":"released","round":3,"run":"00c0ffee00c0ffee","sha256":"9f…","built_by":["cam-01","cam-02"],"relayed":false,"prev":"5d…","hash":"e3…"}
//! ```
//!
//! Chain format: a linear hash chain, the *linking* scheme of Haber and Stornetta ("How to
//! time-stamp a digital document", Journal of Cryptology 3(2), 1991): every record carries the
//! hash of the record before it, so changing, dropping, inserting or reordering a record breaks
//! the link of the record after it. Here `prev` is the lower-case hex SHA-256 of the previous
//! line's exact bytes (without its newline; 64 zeros on the first line), and `hash` is the
//! SHA-256 of the line's own bytes with its `hash` member taken out: the writer serialises
//! the record compactly with `hash` as the last member, so the hashed content is the line up
//! to `,"hash":"…"` followed by `}`. Hashing exact bytes (not a re-serialisation) makes any
//! edited byte a mismatch on its own line. `seq` counts lines from 1.
//!
//! What a chain cannot show on its own: lines cut off the end. [`verify`] reports the head
//! (the last line's `seq` and SHA-256); an operator who records it elsewhere (a ticket, a
//! second machine) can tell a shortened log later, as Haber and Stornetta publish their
//! chain's values and RFC 6962's logs sign their tree heads.
//!
//! `who` is `coordinator`, `device:<client id>` (a device's own request, an enrolment),
//! `operator:<key id>` (a tagged operator command; [`operator_id`]: 16 hex digits of the
//! SHA-256 of the operator key, which names the key without revealing it),
//! `operator:keys-file` (the keys file changed on the coordinator's machine: `keygen`,
//! `revoke` or an edit, whose author the coordinator cannot know) or `operator:cli` (a command
//! run with the configuration but without an operator key).
//!
//! Appends take `audit.jsonl.lock` (`fedge_daemon::lock`), so that `publish-backbone` and the
//! running coordinator never interleave, then write the line and fsync it before returning. A
//! line left torn by a crash is cut off at the next append and the cut recorded
//! (`torn-tail-cut`). The driver logs and counts an append that fails; it never stops a round.

mod format;
mod show;
mod verify;

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub use format::{Entry, Event, GENESIS, device, encode_line, operator, operator_id};
use format::{Head, sha256_hex};
pub use show::{Served, ServedRelease, served_at};
pub use verify::{Broken, Fault, Summary, VerifyError, read_verified, verify, verify_bytes};

/// The audit file's name in the state folder.
pub const FILE_NAME: &str = "audit.jsonl";

/// Where the next line goes: the file's length, the last line's `seq` and SHA-256.
#[derive(Debug, Clone, PartialEq)]
struct Tail {
    len: u64,
    seq: u64,
    prev: String,
}

/// The audit trail of one state folder, appended to.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    tail: Option<Tail>,
    failures: u64,
}

impl AuditLog {
    /// The trail at `path` (`<state_dir>/audit.jsonl`); nothing is read until the first append.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            tail: None,
            failures: 0,
        }
    }

    /// The trail's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends that failed so far ([`AuditLog::record`]).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Appends `event` by `who`, dated now; logs and counts a failure instead of returning it
    /// (the trail never stops the coordinator). True when the line is on disk.
    pub fn record(&mut self, who: &str, event: Event) -> bool {
        match self.append(&fedge_mqtt::now_rfc3339(), who, &event) {
            Ok(_) => true,
            Err(e) => {
                self.failures += 1;
                tracing::error!(path = %self.path.display(), error = %e, failures = self.failures, "audit line not written");
                false
            }
        }
    }

    /// Appends `event` by `who` dated `at` (RFC 3339), fsynced before it returns; its `seq`.
    pub fn append(&mut self, at: &str, who: &str, event: &Event) -> std::io::Result<u64> {
        let path = self.path.clone();
        let err =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let _held = fedge_daemon::lock(&path).map_err(err)?;
        let mut options = OpenOptions::new();
        options.read(true).append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        // Another writer appended (or the file changed): read where the chain stands.
        let mut tail = match self.tail.take() {
            Some(tail) if tail.len == len => tail,
            _ => reread(&mut file, &path, at).map_err(err)?,
        };
        let seq = write_line(&mut file, &mut tail, at, who, event).map_err(err)?;
        self.tail = Some(tail);
        Ok(seq)
    }
}

/// Where the chain of the open `file` ends; a torn last line is cut off and the cut recorded.
fn reread(file: &mut std::fs::File, path: &Path, at: &str) -> std::io::Result<Tail> {
    use std::io::Seek;
    let mut bytes = Vec::new();
    file.seek(std::io::SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    let (mut tail, torn) = tail_of(&bytes);
    if torn > 0 {
        file.set_len(tail.len).and_then(|()| file.sync_data())?;
        tracing::warn!(path = %path.display(), bytes = torn, "cut a torn line off the audit trail");
        let cut = Event::TornTailCut { bytes: torn };
        write_line(file, &mut tail, at, "coordinator", &cut)?;
    }
    Ok(tail)
}

/// Writes one line after `tail` and fsyncs it; on failure cuts the file back to `tail.len`.
fn write_line(
    file: &mut std::fs::File,
    tail: &mut Tail,
    at: &str,
    who: &str,
    event: &Event,
) -> std::io::Result<u64> {
    let seq = tail.seq + 1;
    let mut line = encode_line(seq, at, who, event, &tail.prev);
    let prev = sha256_hex(&line);
    line.push(b'\n');
    if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
        // No torn line in front of later ones.
        let _ = file.set_len(tail.len).and_then(|()| file.sync_data());
        return Err(e);
    }
    *tail = Tail {
        len: tail.len + line.len() as u64,
        seq,
        prev,
    };
    Ok(seq)
}

/// Where the chain of `bytes` ends, and how many bytes of a torn last line follow it.
fn tail_of(bytes: &[u8]) -> (Tail, u64) {
    let good = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let torn = (bytes.len() - good) as u64;
    let body = &bytes[..good];
    let Some(last) = body
        .strip_suffix(b"\n")
        .map(|b| match b.iter().rposition(|&c| c == b'\n') {
            Some(i) => &b[i + 1..],
            None => b,
        })
    else {
        let tail = Tail {
            len: 0,
            seq: 0,
            prev: GENESIS.into(),
        };
        return (tail, torn);
    };
    let lines = body.iter().filter(|&&b| b == b'\n').count() as u64;
    // A damaged last line still chains on; `verify` names it.
    let seq = serde_json::from_slice::<Head>(last).map_or(lines, |h| h.seq.max(lines));
    let tail = Tail {
        len: good as u64,
        seq,
        prev: sha256_hex(last),
    };
    (tail, torn)
}

#[cfg(test)]
mod tests;
