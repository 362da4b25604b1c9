//! `fedge-coordinator audit verify`: every line's hash, link and number checked, the first bad
//! line named; with an anchored head (a line's number and SHA-256 kept outside the state
//! folder), that line's SHA-256 too.
//!
//! The chain is unkeyed: whoever can write the state folder can rewrite the whole file and
//! recompute every `prev` and `hash`, and the result verifies on its own. Only a head recorded
//! before the rewrite, where that writer cannot change it (the coordinator's retained status
//! carries each new one as `audit_head`), tells it apart, and tells a trail cut before it.

use std::path::Path;

use fedge_wire::AuditHead;

use super::format::{Entry, GENESIS, Head, sha256_hex, split_hash};

/// Why a line breaks the trail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    /// The file ends inside a line.
    #[error("does not end in a newline: a torn write or a truncated file")]
    Torn,
    /// Not a record of this format.
    #[error("is not an audit record ({0}): it was edited")]
    Unreadable(String),
    /// The content does not hash to `hash`.
    #[error("its hash does not match its content: the line was edited")]
    Hash,
    /// `prev` is not the SHA-256 of the line before.
    #[error(
        "prev is not the SHA-256 of the line before it: {}",
        chain_cause(*seq, *expected)
    )]
    Chain {
        /// The line's `seq`.
        seq: u64,
        /// The `seq` the line's position calls for.
        expected: u64,
    },
    /// Chained, but numbered wrong: the chain was rewritten from here.
    #[error("seq {seq} where {expected} was expected: the chain was rewritten")]
    Sequence {
        /// The line's `seq`.
        seq: u64,
        /// The `seq` its position calls for.
        expected: u64,
    },
    /// The anchored head's line hashes otherwise than recorded.
    #[error(
        "has SHA-256 {found} where the anchored head records {recorded}: the trail was \
         rewritten at or before this line (its lines recomputed so that the chain holds), or \
         the head was recorded from another trail"
    )]
    Anchor {
        /// The SHA-256 the anchored head records.
        recorded: String,
        /// The SHA-256 of the line on the trail.
        found: String,
    },
    /// The trail ends before the anchored head's line.
    #[error(
        "is not there: the trail ends at line {lines}, before the anchored head: lines were cut \
         off its end, or the head was recorded from another trail"
    )]
    Cut {
        /// Lines on the trail.
        lines: u64,
    },
}

fn chain_cause(seq: u64, expected: u64) -> String {
    use std::cmp::Ordering;
    match seq.cmp(&expected) {
        Ordering::Greater => format!(
            "seq {seq} where {expected} was expected, a line before it was deleted or lines \
             were reordered"
        ),
        Ordering::Less => {
            format!("seq {seq} where {expected} was expected, lines reordered or inserted")
        }
        Ordering::Equal => "the line before was edited, or lines were replaced".into(),
    }
}

/// The first line that breaks the trail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line} {fault}")]
pub struct Broken {
    /// Its number, from 1.
    pub line: u64,
    /// What is wrong with it.
    pub fault: Fault,
}

/// A sound trail.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Lines.
    pub lines: u64,
    /// The SHA-256 of the last line (the head to record elsewhere), [`GENESIS`] when empty.
    pub head: String,
    /// The first and last lines' `at`.
    pub first: Option<String>,
    /// See `first`.
    pub last: Option<String>,
}

impl Summary {
    /// The head to record elsewhere: the last line's number and SHA-256; none for an empty
    /// trail.
    pub fn head(&self) -> Option<AuditHead> {
        (self.lines > 0).then(|| AuditHead {
            seq: self.lines,
            sha256: self.head.clone(),
        })
    }
}

/// Reads `SEQ:SHA256` (a line number from 1, a colon, 64 hex digits), the form `audit verify`
/// prints its head in; what to fix when it is not.
pub fn parse_head(text: &str) -> Result<AuditHead, String> {
    let wanted = "give the head as SEQ:SHA256, the line number, a colon and 64 hex digits, as \
                  `audit verify` prints it or the coordinator status's audit_head has it";
    let (seq, sha256) = text
        .trim()
        .split_once(':')
        .ok_or_else(|| format!("{text:?} has no colon: {wanted}"))?;
    let seq: u64 = seq
        .parse()
        .map_err(|_| format!("{seq:?} is not a line number: {wanted}"))?;
    if seq == 0 {
        return Err(format!(
            "line 0 is no line (an empty trail anchors nothing): {wanted}"
        ));
    }
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{sha256:?} is not 64 hex digits: {wanted}"));
    }
    Ok(AuditHead {
        seq,
        sha256: sha256.to_ascii_lowercase(),
    })
}

/// Checks a trail's bytes: every line's hash, link and number.
///
/// A trail rewritten whole (every line recomputed) or cut short passes: see
/// [`verify_bytes_anchored`].
pub fn verify_bytes(bytes: &[u8]) -> Result<Summary, Broken> {
    check(bytes, None)
}

/// [`verify_bytes`], and line `head.seq` must be there with SHA-256 `head.sha256`: a trail
/// rewritten at or before that line, or cut before it, fails there.
pub fn verify_bytes_anchored(bytes: &[u8], head: &AuditHead) -> Result<Summary, Broken> {
    check(bytes, Some(head))
}

fn check(bytes: &[u8], anchor: Option<&AuditHead>) -> Result<Summary, Broken> {
    let mut prev = GENESIS.to_owned();
    let mut summary = Summary {
        lines: 0,
        head: GENESIS.into(),
        first: None,
        last: None,
    };
    let mut rest = bytes;
    while !rest.is_empty() {
        let line_no = summary.lines + 1;
        let broken = |fault| Broken {
            line: line_no,
            fault,
        };
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return Err(broken(Fault::Torn));
        };
        let line = &rest[..end];
        rest = &rest[end + 1..];
        let (content, hash) = split_hash(line)
            .ok_or_else(|| broken(Fault::Unreadable("no hash as its last member".into())))?;
        let head: Head = serde_json::from_slice(&content)
            .map_err(|e| broken(Fault::Unreadable(e.to_string())))?;
        if sha256_hex(&content) != hash {
            return Err(broken(Fault::Hash));
        }
        let expected = line_no;
        if head.prev != prev {
            return Err(broken(Fault::Chain {
                seq: head.seq,
                expected,
            }));
        }
        if head.seq != expected {
            return Err(broken(Fault::Sequence {
                seq: head.seq,
                expected,
            }));
        }
        prev = sha256_hex(line);
        if let Some(anchored) = anchor.filter(|a| a.seq == line_no)
            && anchored.sha256 != prev
        {
            return Err(broken(Fault::Anchor {
                recorded: anchored.sha256.clone(),
                found: prev,
            }));
        }
        summary.lines = line_no;
        summary.first.get_or_insert_with(|| head.at.clone());
        summary.last = Some(head.at);
    }
    if let Some(anchored) = anchor.filter(|a| a.seq > summary.lines) {
        return Err(Broken {
            line: anchored.seq,
            fault: Fault::Cut {
                lines: summary.lines,
            },
        });
    }
    summary.head = prev;
    Ok(summary)
}

/// Why a trail cannot be read or does not hold.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// There is no trail at the path.
    #[error(
        "{path}: no audit trail here; the coordinator writes it in its state_dir while it runs \
         (unless its configuration says audit = false): check --state-dir or --config"
    )]
    Missing {
        /// File.
        path: String,
    },
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A line breaks the chain.
    #[error("{path}: {broken}")]
    Broken {
        /// File.
        path: String,
        /// The first bad line.
        broken: Broken,
    },
}

fn read_file(path: &Path) -> Result<Vec<u8>, VerifyError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => VerifyError::Missing {
            path: path.display().to_string(),
        },
        _ => VerifyError::Io {
            path: path.display().to_string(),
            source,
        },
    })
}

/// Verifies the trail at `path` ([`verify_bytes`]).
pub fn verify(path: &Path) -> Result<Summary, VerifyError> {
    verify_bytes(&read_file(path)?).map_err(|broken| VerifyError::Broken {
        path: path.display().to_string(),
        broken,
    })
}

/// Verifies the trail at `path` against an anchored head ([`verify_bytes_anchored`]).
pub fn verify_anchored(path: &Path, head: &AuditHead) -> Result<Summary, VerifyError> {
    verify_bytes_anchored(&read_file(path)?, head).map_err(|broken| VerifyError::Broken {
        path: path.display().to_string(),
        broken,
    })
}

/// The entries of a verified trail (lines of an event kind this version does not know are
/// left out); fails on a trail that does not verify (an answer read from a broken trail
/// proves nothing).
pub fn read_verified(path: &Path) -> Result<Vec<Entry>, VerifyError> {
    let bytes = read_file(path)?;
    verify_bytes(&bytes).map_err(|broken| VerifyError::Broken {
        path: path.display().to_string(),
        broken,
    })?;
    // Every line parsed as an entry during verification.
    Ok(bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| split_hash(l).and_then(|(c, _)| serde_json::from_slice(&c).ok()))
        .collect())
}
