//! The page cache of one file: what processes see of it, kept apart from
//! what is on the disk (the backing file) until an fsync.
//!
//! A file with unsynced changes has a [`Pending`]: its size as processes
//! see it, the pages written since the last sync (whole 4 KiB pages, as a
//! kernel's page cache holds them), and how far it was truncated meanwhile
//! (bytes of the disk at or past that point are no longer part of the
//! file). Reads see the pending state; the disk changes only in
//! [`Pending::persist`] (fsync) or [`Pending::tear`] (a power cut during
//! the file's last write: what came before it reached the disk, and the
//! write itself only up to a sector boundary).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The page size of the model.
pub const PAGE: u64 = 4096;

/// The unit a disk writes atomically: a torn write keeps whole sectors.
pub const SECTOR: u64 = 512;

/// The unsynced state of one file.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The size processes see.
    size: u64,
    /// The smallest size the file had since the last sync: bytes of the
    /// disk at or past it are not part of the file (zeros unless a dirty
    /// page covers them). Never above `size`.
    floor: u64,
    /// Dirty pages by page number, each `PAGE` bytes; bytes past `size` are
    /// zero.
    pages: BTreeMap<u64, Box<[u8]>>,
    /// The last change, if it was a write: what a tearing cut applies in
    /// part.
    last_write: Option<LastWrite>,
}

/// A write, and what it replaced (to undo the part a tear loses).
#[derive(Debug, Clone)]
struct LastWrite {
    offset: u64,
    data: Vec<u8>,
    /// The size before the write.
    old_size: u64,
    /// The bytes it overwrote (those below `old_size`).
    before: Vec<u8>,
}

/// What a tearing cut applied: everything pending before the file's last
/// write, and `kept` bytes of that write (`len` at `offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Torn {
    /// Where the torn write started.
    pub offset: u64,
    /// How many of its bytes reached the disk: fewer than `len`, and a
    /// sector boundary (or the write's start).
    pub kept: u64,
    /// Its length.
    pub len: u64,
}

impl Pending {
    /// The state of a file whose disk copy is `disk_len` bytes long and
    /// which has no unsynced change yet.
    pub fn new(disk_len: u64) -> Self {
        Self {
            size: disk_len,
            floor: disk_len,
            pages: BTreeMap::new(),
            last_write: None,
        }
    }

    /// The size processes see.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held in dirty pages (what a cut throws away, at most).
    pub fn dirty_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// Fills `buf` with what the disk contributes at `offset`: its bytes
    /// below `floor`, zeros elsewhere.
    fn base(&self, disk: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.fill(0);
        if offset >= self.floor {
            return Ok(());
        }
        let wanted = usize::try_from((self.floor - offset).min(buf.len() as u64))
            .map_err(io::Error::other)?;
        let mut done = 0;
        while done < wanted {
            let n = disk.read_at(&mut buf[done..wanted], offset + done as u64)?;
            if n == 0 {
                break; // the disk is shorter: the rest reads as zeros
            }
            done += n;
        }
        Ok(())
    }

    /// Up to `len` bytes at `offset`, as processes see them.
    ///
    /// # Errors
    /// Reading the disk failed.
    pub fn read(&self, disk: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0; usize::try_from(end - offset).map_err(io::Error::other)?];
        self.base(disk, offset, &mut buf)?;
        for (&number, page) in self.pages.range(offset / PAGE..=(end - 1) / PAGE) {
            let start = number * PAGE;
            let from = start.max(offset);
            let to = (start + PAGE).min(end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - start) as usize..(to - start) as usize]);
        }
        Ok(buf)
    }

    /// Writes `data` at `offset` into the cache.
    ///
    /// # Errors
    /// Reading the disk (to fill a page first touched) failed.
    pub fn write(&mut self, disk: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let last = LastWrite {
            offset,
            data: data.to_vec(),
            old_size: self.size,
            before: self.read(disk, offset, data.len() as u64)?,
        };
        self.apply(disk, offset, data)?;
        self.last_write = Some(last);
        Ok(())
    }

    /// Writes `data` at `offset` into the pages.
    fn apply(&mut self, disk: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        for number in offset / PAGE..=(end - 1) / PAGE {
            let start = number * PAGE;
            if !self.pages.contains_key(&number) {
                let mut page = self.read(disk, start, PAGE)?;
                page.resize(PAGE as usize, 0);
                self.pages.insert(number, page.into_boxed_slice());
            }
            let from = start.max(offset);
            let to = (start + PAGE).min(end);
            if let Some(page) = self.pages.get_mut(&number) {
                page[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            }
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Sets the size (ftruncate, O_TRUNC).
    pub fn truncate(&mut self, size: u64) {
        self.last_write = None;
        self.shrink_or_grow(size);
    }

    fn shrink_or_grow(&mut self, size: u64) {
        if size < self.size {
            self.floor = self.floor.min(size);
            let first_gone = size.div_ceil(PAGE);
            self.pages.retain(|&number, _| number < first_gone);
            if size % PAGE != 0 {
                if let Some(page) = self.pages.get_mut(&(size / PAGE)) {
                    page[(size % PAGE) as usize..].fill(0);
                }
            }
        }
        // Growing: everything past the old size already reads as zeros.
        self.size = size;
    }

    /// Writes the pending state to the disk (fsync).
    ///
    /// # Errors
    /// Writing the disk failed.
    pub fn persist(&self, disk: &File) -> io::Result<()> {
        if self.floor < disk.metadata()?.len() {
            disk.set_len(self.floor)?;
        }
        for (&number, page) in &self.pages {
            let start = number * PAGE;
            if start >= self.size {
                continue;
            }
            let n = (self.size - start).min(PAGE) as usize;
            disk.write_all_at(&page[..n], start)?;
        }
        if disk.metadata()?.len() != self.size {
            disk.set_len(self.size)?;
        }
        Ok(())
    }

    /// A power cut during this file's last write: everything pending before
    /// it reaches the disk (as the kernel may have written it back), and the
    /// write itself up to a sector boundary picked by `pick` (its start, or
    /// a boundary inside it: never all of it). The caller then drops the
    /// pending state. Nothing happens unless the last change was a write.
    ///
    /// # Errors
    /// Reading or writing the disk failed.
    pub fn tear(&self, disk: &File, pick: u64) -> io::Result<Option<Torn>> {
        let Some(last) = &self.last_write else {
            return Ok(None);
        };
        let len = last.data.len() as u64;
        let end = last.offset + len;
        // The cut points: the write's start and every sector boundary
        // strictly inside it.
        let first_boundary = (last.offset / SECTOR + 1) * SECTOR;
        let inside = if first_boundary < end {
            (end - 1 - first_boundary) / SECTOR + 1
        } else {
            0
        };
        let choice = pick % (inside + 1);
        let cut = if choice == 0 {
            last.offset
        } else {
            first_boundary + (choice - 1) * SECTOR
        };
        // The state with the write's suffix from `cut` undone.
        let mut torn = self.clone();
        let from = usize::try_from(cut - last.offset)
            .map_err(io::Error::other)?
            .min(last.before.len());
        torn.apply(disk, cut, &last.before[from..])?;
        let size = if last.old_size < end {
            last.old_size.max(cut)
        } else {
            self.size
        };
        torn.shrink_or_grow(size);
        torn.persist(disk)?;
        Ok(Some(Torn {
            offset: last.offset,
            kept: cut - last.offset,
            len,
        }))
    }

    /// Whether a tear of this file would apply anything.
    pub fn has_write(&self) -> bool {
        self.last_write.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write;

    use super::{Pending, PAGE, SECTOR};

    fn disk_with(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .expect("create")
            .write_all(bytes)
            .expect("write");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        (dir, file)
    }

    fn on_disk(file: &File) -> Vec<u8> {
        let mut out = vec![0; file.metadata().expect("meta").len() as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut out, 0).expect("read");
        out
    }

    #[test]
    fn unsynced_writes_are_seen_but_not_on_disk() {
        let (_dir, disk) = disk_with(b"hello world");
        let mut pending = Pending::new(11);
        pending.write(&disk, 6, b"there, friend").expect("write");
        assert_eq!(
            pending.read(&disk, 0, 100).expect("read"),
            b"hello there, friend"
        );
        assert_eq!(pending.size(), 19);
        // A cut drops `pending`: the disk never changed.
        assert_eq!(on_disk(&disk), b"hello world");
    }

    #[test]
    fn synced_writes_reach_the_disk() {
        let (_dir, disk) = disk_with(b"hello world");
        let mut pending = Pending::new(11);
        pending.write(&disk, 6, b"there").expect("write");
        pending.write(&disk, 3 * PAGE, b"far").expect("write");
        pending.persist(&disk).expect("persist");
        let mut expected = b"hello there".to_vec();
        expected.resize(3 * PAGE as usize, 0);
        expected.extend_from_slice(b"far");
        assert_eq!(on_disk(&disk), expected);
    }

    #[test]
    fn truncation_hides_the_disk_until_synced() {
        let (_dir, disk) = disk_with(&[7u8; 10_000]);
        let mut pending = Pending::new(10_000);
        pending.truncate(100);
        pending.truncate(5_000);
        let seen = pending.read(&disk, 0, 10_000).expect("read");
        assert_eq!(seen.len(), 5_000);
        assert!(seen[..100].iter().all(|&b| b == 7));
        assert!(
            seen[100..].iter().all(|&b| b == 0),
            "truncated bytes come back as zeros"
        );
        // A write after a truncation inside the same page keeps the zeros.
        pending.write(&disk, 200, b"x").expect("write");
        let seen = pending.read(&disk, 0, 10_000).expect("read");
        assert!(seen[100..200].iter().all(|&b| b == 0));
        assert_eq!(seen[200], b'x');
        assert_eq!(on_disk(&disk), vec![7u8; 10_000], "the disk is untouched");
        pending.persist(&disk).expect("persist");
        assert_eq!(on_disk(&disk), seen);
    }

    #[test]
    fn a_torn_write_keeps_what_came_before_and_whole_sectors_of_it() {
        let last: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut kept_seen = std::collections::BTreeSet::new();
        for pick in 0..40u64 {
            let (_dir, disk) = disk_with(b"0123456789");
            let mut pending = Pending::new(10);
            pending.write(&disk, 2, b"first").expect("write");
            pending.write(&disk, 5, &last).expect("write");
            let torn = pending.tear(&disk, pick).expect("tear").expect("torn");
            assert_eq!((torn.offset, torn.len), (5, 10_000));
            assert!(torn.kept < torn.len, "never the whole write");
            assert!(
                torn.kept == 0 || (5 + torn.kept) % SECTOR == 0,
                "cut at a sector boundary: {torn:?}"
            );
            kept_seen.insert(torn.kept);
            let kept = torn.kept as usize;
            let disk_now = on_disk(&disk);
            // The write before the torn one reached the disk whole.
            assert_eq!(&disk_now[..5], b"01fir");
            assert_eq!(&disk_now[5..5 + kept], &last[..kept]);
            if kept == 0 {
                assert_eq!(disk_now, b"01first789");
            } else {
                assert_eq!(disk_now.len(), 5 + kept, "the size it had reached");
            }
        }
        assert!(
            kept_seen.len() > 5,
            "picks spread over the cut points: {kept_seen:?}"
        );
    }

    #[test]
    fn a_torn_overwrite_keeps_the_old_bytes_past_the_cut() {
        let (_dir, disk) = disk_with(&[b'o'; 2048]);
        let mut pending = Pending::new(2048);
        pending.write(&disk, 100, &[b'n'; 1000]).expect("write");
        // Cut points: 100, 512, 1024; pick 1 is 512.
        let torn = pending.tear(&disk, 1).expect("tear").expect("torn");
        assert_eq!(torn.kept, 412);
        let disk_now = on_disk(&disk);
        assert_eq!(disk_now.len(), 2048);
        assert!(disk_now[..100].iter().all(|&b| b == b'o'));
        assert!(disk_now[100..512].iter().all(|&b| b == b'n'));
        assert!(disk_now[512..].iter().all(|&b| b == b'o'));
    }

    #[test]
    fn nothing_is_torn_after_a_truncation() {
        let (_dir, disk) = disk_with(b"abc");
        let mut pending = Pending::new(3);
        pending.write(&disk, 0, b"xyz").expect("write");
        pending.truncate(1);
        assert!(pending.tear(&disk, 7).expect("tear").is_none());
    }

    #[test]
    fn reads_past_the_end_are_short() {
        let (_dir, disk) = disk_with(b"abc");
        let mut pending = Pending::new(3);
        pending.write(&disk, 1, b"Z").expect("write");
        assert_eq!(pending.read(&disk, 2, 10).expect("read"), b"c");
        assert!(pending.read(&disk, 3, 10).expect("read").is_empty());
        assert!(pending.read(&disk, 100, 10).expect("read").is_empty());
    }
}
