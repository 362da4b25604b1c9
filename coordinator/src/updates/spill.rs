//! A memory-mapped file that holds a round's deltas when they outgrow `update_memory_mb`.
//!
//! The driver creates it at start (`spill_dir`, `spill_max_mb`) and hands it to the round
//! machine, which uses it as memory: the machine itself still does no I/O. The file is
//! anonymous (unlinked at creation) and sparse: only the pages a round writes take disk space,
//! and the kernel may write them back and drop them from RAM under memory pressure, so the
//! coordinator's anonymous memory stays at the budget while the deltas stream through the page
//! cache.

use std::path::Path;

use memmap2::MmapMut;

/// The mapped spill file.
pub struct SpillFile {
    map: MmapMut,
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillFile")
            .field("bytes", &self.map.len())
            .finish()
    }
}

impl SpillFile {
    /// An anonymous file of `bytes` (rounded down to whole f32 values) in `dir`, mapped.
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
        Ok(Self { map })
    }

    /// How many f32 values it holds.
    pub fn capacity_floats(&self) -> usize {
        self.map.len() / 4
    }

    /// Its values (mapped pages are page-aligned, so the cast cannot fail).
    pub fn floats(&self) -> &[f32] {
        bytemuck::cast_slice(&self.map[..])
    }

    /// Its values, writable.
    pub fn floats_mut(&mut self) -> &mut [f32] {
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
        assert_eq!(spill.capacity_floats(), 1 << 28);
        spill.floats_mut()[12_345_678] = 2.5;
        assert_eq!(spill.floats()[12_345_678], 2.5);
        assert_eq!(spill.floats()[0], 0.0);
        // Nothing is left in the folder: the file has no name.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
