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
//! What a chain cannot show on its own: lines cut off the end, and a file rewritten whole. The
//! chain is unkeyed, so whoever can write the state folder can change a line and recompute
//! every `prev` and `hash` after it, and [`verify`] passes the result. Both show only against
//! a head recorded before, where that writer cannot reach: [`verify_anchored`] checks that
//! line `seq` is there with the recorded SHA-256, as Haber and Stornetta publish their
//! chain's values and RFC 6962's logs sign their tree heads. The running coordinator puts each
//! new head in its retained status (`audit_head`, [`AuditLog::head`]), so the broker and every
//! dashboard that keeps the status hold a copy; [`verify`] prints the head for an operator to
//! record (a ticket, a second machine).
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

use fedge_wire::AuditHead;

pub use format::{Entry, Event, GENESIS, device, encode_line, operator, operator_id};
use format::{Head, sha256_hex};
pub use show::{Served, ServedRelease, served_at};
pub use verify::{
    Broken, Fault, Summary, VerifyError, parse_head, read_verified, verify, verify_anchored,
    verify_bytes, verify_bytes_anchored,
};

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
    /// Before the first append: the head read off the file's end, once ([`AuditLog::head`]).
    peeked: Option<Option<AuditHead>>,
    failures: u64,
}

impl AuditLog {
    /// The trail at `path` (`<state_dir>/audit.jsonl`); nothing is read until the first append.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            tail: None,
            peeked: None,
            failures: 0,
        }
    }

    /// The trail's head: the last line's `seq` and SHA-256 as this writer last appended it,
    /// in O(1). Before its first append, the head of the file as it stands, read once off the
    /// file's end (the lines another writer put there: `run`'s `run-started`); none while the
    /// file has no whole line or its last line is not a record. Lines another process appends
    /// later show from this writer's next append on.
    pub fn head(&mut self) -> Option<AuditHead> {
        if let Some(tail) = self.tail.as_ref().filter(|t| t.seq > 0) {
            return Some(AuditHead {
                seq: tail.seq,
                sha256: tail.prev.clone(),
            });
        }
        self.peeked
            .get_or_insert_with(|| match last_line(&self.path) {
                Ok(line) => line.and_then(|line| head_of(&line)),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "audit head not read");
                    None
                }
            })
            .clone()
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

/// The head a whole last line names: its `seq` and SHA-256; none when it is not a record.
fn head_of(line: &[u8]) -> Option<AuditHead> {
    let head = serde_json::from_slice::<Head>(line).ok()?;
    Some(AuditHead {
        seq: head.seq,
        sha256: sha256_hex(line),
    })
}

/// The last whole line of the file at `path` (without its newline; a torn end after it left
/// out), read backwards from the end: as many bytes as that line and the torn end hold, not
/// the file. None when the file is missing or holds no whole line.
fn last_line(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{Seek, SeekFrom};
    const CHUNK: u64 = 4096;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut start = file.metadata()?.len();
    // The file's bytes from `start` to its end.
    let mut read: Vec<u8> = Vec::new();
    loop {
        if let Some(end) = read.iter().rposition(|&b| b == b'\n') {
            match read[..end].iter().rposition(|&b| b == b'\n') {
                Some(before) => return Ok(Some(read[before + 1..end].to_vec())),
                None if start == 0 => return Ok(Some(read[..end].to_vec())),
                None => {}
            }
        } else if start == 0 {
            return Ok(None);
        }
        let from = start.saturating_sub(CHUNK);
        let mut chunk = vec![0; (start - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&read);
        read = chunk;
        start = from;
    }
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
