//! The open round's journal: which round is open, with whom, and every update accepted in it.
//!
//! The checkpoint holds the state after the last aggregation; the journal holds what happened
//! since, so a coordinator killed mid-round resumes the same round with the updates it had
//! already accepted (they count, and none is applied twice: the machine drops a second update
//! from the same client as a duplicate).
//!
//! File: a sequence of records `len u32 LE | CRC-32 u32 LE of the body | postcard(Record)`.
//! [`Journal::write`] rewrites the file with an `Opened` record (write, fsync, rename, fsync
//! the folder) and appends an `Accepted` record, fsynced before it returns. [`read`] stops at the first torn or damaged record: a crash in the middle of an
//! append loses at most that update, which its device then still has to send.
//! Only this module touches the file; the round machine emits and consumes [`Record`] values.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::round::saved::{OpenRoundLog, Record};

/// Slice-by-16 tables: 2.3 GiB/s against 0.37 GiB/s for the byte-wise table on a 134 KB frame
/// (`cargo bench --workspace --bench crc`).
const CRC: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
/// Largest record read back (a record holds one update frame).
const MAX_RECORD: usize = fedge_wire::MAX_MESSAGE_BYTES + 1024;

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
    // Room for the length and CRC, then the body serialised straight after them.
    let mut out = postcard::to_extend(record, vec![0u8; 8]).expect("a journal record serialises");
    let body_len = (out.len() - 8) as u32;
    let crc = CRC.checksum(&out[8..]);
    out[..4].copy_from_slice(&body_len.to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
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

    /// Writes a record: an `Opened` record atomically replaces the journal (a new round starts
    /// a fresh one), an `Accepted` record is appended and fsynced before this returns.
    pub fn write(&mut self, record: &Record) -> std::io::Result<()> {
        let bytes = encode(record);
        let path = self.path.clone();
        if let Record::Opened { .. } = record {
            self.file = None;
            fedge_daemon::write_atomically(&path, &bytes, fedge_daemon::Visibility::Shared)
                .map_err(|e| io_error(&path, e))?;
        }
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
        if let Record::Accepted { .. } = record {
            file.write_all(&bytes).map_err(|e| io_error(&path, e))?;
            file.sync_data().map_err(|e| io_error(&path, e))?;
        }
        Ok(())
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
        let accepted = |round, client: &str, frame: &[u8]| Record::Accepted {
            round,
            client: client.into(),
            frame: frame.to_vec(),
        };
        let opened = |round, selected: &[&str]| Record::Opened {
            round,
            selected: selected.iter().map(|s| s.to_string()).collect(),
        };
        journal.write(&opened(4, &["a", "b"])).unwrap();
        journal.write(&accepted(4, "a", b"frame-a")).unwrap();
        journal.write(&accepted(3, "z", b"stale")).unwrap();
        journal.write(&accepted(4, "b", b"frame-b")).unwrap();
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
        journal.write(&opened(5, &["b"])).unwrap();
        let (log, _) = read(&path).unwrap();
        assert_eq!(
            (log.opened, log.accepted.len()),
            (Some((5, vec!["b".into()])), 0)
        );
    }
}
