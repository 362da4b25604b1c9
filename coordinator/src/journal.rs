//! The open round's journal: which round is open, with whom, and every update accepted in it.
//!
//! The checkpoint holds the state after the last aggregation; the journal holds what happened
//! since, so a coordinator killed mid-round resumes the same round with the updates it had
//! already accepted (they count, and none is applied twice: the machine drops a second update
//! from the same client as a duplicate).
//!
//! File: a sequence of records `len u32 LE | CRC-32 u32 LE of the body | postcard(Record)`.
//! [`Journal::open_round`] rewrites the file with one `Opened` record (write, fsync, rename,
//! fsync the folder); [`Journal::append`] adds an `Accepted` record and fsyncs before it
//! returns. [`read`] stops at the first torn or damaged record: a crash in the middle of an
//! append loses at most that update, which its device then still has to send.
//! Only this module touches the file; the round machine emits and consumes [`Record`] values.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
/// Largest record read back (a record holds one update frame).
const MAX_RECORD: usize = fedge_wire::MAX_MESSAGE_BYTES + 1024;

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A round was opened with these clients; starts a fresh journal.
    Opened {
        /// Round number.
        round: u64,
        /// Selected clients, sorted.
        selected: Vec<String>,
    },
    /// An update was accepted in `round`: its plain frame (tag already checked).
    Accepted {
        /// Round number.
        round: u64,
        /// Client id.
        client: String,
        /// The framed `ClientUpdate`.
        #[serde(with = "serde_bytes")]
        frame: Vec<u8>,
    },
}

/// The journal of an open round, as read back at start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenRoundLog {
    /// Round number and selected clients, when a round was open.
    pub opened: Option<(u64, Vec<String>)>,
    /// Accepted updates of that round, in arrival order: client and frame.
    pub accepted: Vec<(String, Vec<u8>)>,
}

/// An appendable journal file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Option<File>,
}

fn io_error(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn encode(record: &Record) -> Vec<u8> {
    let body = postcard::to_stdvec(record).expect("a journal record serialises");
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(CRC.checksum(&body).to_le_bytes());
    out.extend(body);
    out
}

impl Journal {
    /// A journal at `path`; nothing is written until a round opens.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            file: None,
        }
    }

    /// Starts a fresh journal for a newly opened round (atomically replaces the old one).
    pub fn open_round(&mut self, round: u64, selected: &[String]) -> std::io::Result<()> {
        self.file = None;
        let tmp = self.path.with_extension("tmp");
        let record = encode(&Record::Opened {
            round,
            selected: selected.to_vec(),
        });
        let mut file = File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
        file.write_all(&record).map_err(|e| io_error(&tmp, e))?;
        file.sync_all().map_err(|e| io_error(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io_error(&self.path, e))?;
        if let Some(dir) = self.path.parent()
            && let Ok(dir) = File::open(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })
        {
            let _ = dir.sync_all();
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| io_error(&self.path, e))?;
        self.file = Some(file);
        Ok(())
    }

    /// Appends an accepted update and fsyncs it.
    pub fn append(&mut self, round: u64, client: &str, frame: &[u8]) -> std::io::Result<()> {
        let record = encode(&Record::Accepted {
            round,
            client: client.to_owned(),
            frame: frame.to_vec(),
        });
        let path = self.path.clone();
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(
                OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&path)
                    .map_err(|e| io_error(&path, e))?,
            ),
        };
        file.write_all(&record).map_err(|e| io_error(&path, e))?;
        file.sync_data().map_err(|e| io_error(&path, e))
    }
}

/// Reads a journal; a missing file is an empty log. Records after the first damaged one are
/// ignored (and counted in the second value), as are `Accepted` records of another round.
pub fn read(path: &Path) -> std::io::Result<(OpenRoundLog, usize)> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(io_error(path, e)),
    };
    Ok(parse(&bytes))
}

/// Parses journal bytes: the log and the number of bytes ignored after a damaged record.
pub fn parse(bytes: &[u8]) -> (OpenRoundLog, usize) {
    let mut log = OpenRoundLog::default();
    let mut at = 0;
    while bytes.len() - at >= 8 {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let crc = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        let len = len as usize;
        if len > MAX_RECORD || bytes.len() - at - 8 < len {
            break;
        }
        let body = &bytes[at + 8..at + 8 + len];
        if CRC.checksum(body) != crc {
            break;
        }
        match postcard::from_bytes::<Record>(body) {
            Ok(Record::Opened { round, selected }) => {
                log = OpenRoundLog {
                    opened: Some((round, selected)),
                    accepted: Vec::new(),
                };
            }
            Ok(Record::Accepted {
                round,
                client,
                frame,
            }) => {
                if log.opened.as_ref().is_some_and(|(r, _)| *r == round) {
                    log.accepted.push((client, frame));
                }
            }
            Err(_) => break,
        }
        at += 8 + len;
    }
    (log, bytes.len() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_reads_back_its_round_and_updates_and_survives_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.bin");
        assert_eq!(read(&path).unwrap(), (OpenRoundLog::default(), 0));
        let mut journal = Journal::new(&path);
        journal.open_round(4, &["a".into(), "b".into()]).unwrap();
        journal.append(4, "a", b"frame-a").unwrap();
        journal.append(3, "z", b"stale").unwrap();
        journal.append(4, "b", b"frame-b").unwrap();
        let (log, ignored) = read(&path).unwrap();
        assert_eq!(ignored, 0);
        assert_eq!(log.opened, Some((4, vec!["a".into(), "b".into()])));
        assert_eq!(
            log.accepted,
            vec![
                ("a".to_owned(), b"frame-a".to_vec()),
                ("b".to_owned(), b"frame-b".to_vec())
            ]
        );
        // Every possible torn write keeps the complete records before it.
        let bytes = std::fs::read(&path).unwrap();
        let full = parse(&bytes).0;
        for cut in 0..bytes.len() {
            let (partial, _) = parse(&bytes[..cut]);
            assert!(partial.accepted.len() <= full.accepted.len());
            assert_eq!(
                partial.accepted[..],
                full.accepted[..partial.accepted.len()]
            );
        }
        // A flipped bit in the last record drops that record only.
        let mut damaged = bytes.clone();
        let last = damaged.len() - 2;
        damaged[last] ^= 1;
        let (log, ignored) = parse(&damaged);
        assert_eq!(log.accepted.len(), 1);
        assert!(ignored > 0);
        // A new round starts a fresh journal.
        journal.open_round(5, &["b".into()]).unwrap();
        let (log, _) = read(&path).unwrap();
        assert_eq!(
            (log.opened, log.accepted.len()),
            (Some((5, vec!["b".into()])), 0)
        );
    }
}
