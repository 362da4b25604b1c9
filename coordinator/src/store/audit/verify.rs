//! `fedge-coordinator audit verify`: every line's hash, link and number checked, the first bad
//! line named.

use std::path::Path;

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

/// Checks a trail's bytes: every line's hash, link and number.
pub fn verify_bytes(bytes: &[u8]) -> Result<Summary, Broken> {
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
        summary.lines = line_no;
        summary.first.get_or_insert_with(|| head.at.clone());
        summary.last = Some(head.at);
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
