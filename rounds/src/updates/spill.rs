//! A memory-mapped file that holds a round's deltas when they outgrow `update_memory_mb`.
//!
//! The driver creates it at start (`spill_dir`, `spill_max_mb`) and hands it to the round
//! machine, which uses it as memory: the machine itself still does no I/O. The file is
//! anonymous (unlinked at creation) and sparse: only the pages a round writes take disk space,
//! and the kernel may write them back and drop them from RAM under memory pressure, so the
//! coordinator's anonymous memory stays at the budget while the deltas stream through the page
//! cache.
//!
//! Writing to a page of a sparse file the disk has no room for kills the process (SIGBUS), so
//! the disk space is reserved (`fallocate`) before any value is written past what was reserved
//! already, in steps of [`RESERVE_STEP`]: a full disk is then an error for that update
//! (`memory_budget`), never a crash.

use std::path::Path;

use memmap2::MmapMut;

/// Bytes reserved on disk at a time.
pub const RESERVE_STEP: usize = 64 << 20;

/// The mapped spill file.
pub struct SpillFile {
    map: MmapMut,
    file: std::fs::File,
    /// Bytes from the start whose disk space is reserved.
    reserved: usize,
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillFile")
            .field("bytes", &self.map.len())
            .finish()
    }
}

impl SpillFile {
    /// An anonymous file of `bytes` (rounded down to whole 4-byte words) in `dir`, mapped.
    pub fn create(dir: &Path, bytes: usize) -> std::io::Result<Self> {
        let bytes = bytes / 4 * 4;
        std::fs::create_dir_all(dir)?;
        let file = tempfile::tempfile_in(dir)?;
        file.set_len(bytes as u64)?;
        // SAFETY: mapping a file is unsafe because another process could change or truncate
        // it under the mapping. This file was created unlinked (`tempfile_in`), so no other
        // process can open it by name; this process never resizes it, and the mapping ends
        // before the file handle (the map keeps its own reference to the open file).
        #[allow(unsafe_code)]
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Self {
            map,
            file,
            reserved: 0,
        })
    }

    /// Reserves disk space for the first `words` words (and up to [`RESERVE_STEP`] more
    /// bytes), so that writing them cannot fault; an error (no space left) leaves them
    /// unwritable.
    pub fn reserve(&mut self, words: usize) -> std::io::Result<()> {
        let wanted = words.saturating_mul(4).min(self.map.len());
        if wanted <= self.reserved {
            return Ok(());
        }
        let end = wanted
            .saturating_add(RESERVE_STEP)
            .min(self.map.len())
            .max(wanted);
        let (offset, len) = (self.reserved as u64, (end - self.reserved) as u64);
        rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), offset, len)?;
        self.reserved = end;
        Ok(())
    }

    /// How many 4-byte words it holds.
    pub fn capacity_words(&self) -> usize {
        self.map.len() / 4
    }

    /// Its words (mapped pages are page-aligned, so the cast cannot fail).
    pub fn words(&self) -> &[u32] {
        bytemuck::cast_slice(&self.map[..])
    }

    /// Its words, writable.
    pub fn words_mut(&mut self) -> &mut [u32] {
        bytemuck::cast_slice_mut(&mut self.map[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spill_file_is_sparse_memory_that_keeps_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        // 1 GiB of address space: only the written pages are backed.
        let mut spill = SpillFile::create(dir.path(), 1 << 30).unwrap();
        assert_eq!(spill.capacity_words(), 1 << 28);
        spill.words_mut()[12_345_678] = 25;
        assert_eq!(spill.words()[12_345_678], 25);
        assert_eq!(spill.words()[0], 0);
        // Nothing is left in the folder: the file has no name.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn disk_space_is_reserved_in_steps_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = SpillFile::create(dir.path(), 1 << 30).unwrap();
        spill.reserve(1_000).unwrap();
        assert_eq!(spill.reserved, 4_000 + RESERVE_STEP);
        // Within what is reserved: nothing to do.
        spill.reserve(RESERVE_STEP / 4).unwrap();
        assert_eq!(spill.reserved, 4_000 + RESERVE_STEP);
        spill.reserve(RESERVE_STEP / 2).unwrap();
        assert_eq!(spill.reserved, 3 * RESERVE_STEP);
        // The reservation is real: the file's blocks are allocated, not just its length.
        use std::os::unix::fs::MetadataExt;
        let blocks = spill.file.metadata().unwrap().blocks() as usize * 512;
        assert!(blocks >= 3 * RESERVE_STEP, "{blocks} bytes allocated");
    }
}
