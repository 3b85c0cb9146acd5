//! The files of a sled 0.34 database, made durable after sled's flush.
//!
//! sled's `flush` stops at `sync_file_range`, which neither persists a
//! file's size nor reaches every filesystem, and it never syncs the files
//! it keeps beside its log: `conf`, written once at creation, and
//! `blobs/<lsn>`, one per page too large for a log segment (over ~128 KiB
//! at the default segment size: a Raft snapshot, a large object, a leaf of
//! large values). A power cut after a flush then loses what sled called
//! stable, and a log that points at a torn blob does not open again (sled
//! panics while recovering: found by the fault suite's power cut). Both
//! stores call [`SledFiles::sync`] after every `flush`.
//!
//! The order matters: new blobs and the `blobs` directory first, then the
//! data file, so the log that refers to a blob is never on the disk before
//! the blob (a cut in between leaves a blob nothing refers to, which sled
//! removes when it opens). What this cannot close: the kernel may write a
//! page of the data file back on its own before a blob of the same flush.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sync::lock;

/// A sled database directory's files, for fsync.
#[derive(Debug)]
pub struct SledFiles {
    /// `<dir>/blobs`.
    blobs: PathBuf,
    /// `<dir>/db`, sled's log and pages.
    data: File,
    /// Blobs already synced (pruned of the ones sled removed).
    synced: Mutex<HashSet<OsString>>,
}

impl SledFiles {
    /// Syncs what sled wrote when it opened (or created) the database in
    /// `dir` — `conf`, the data file, every blob, the directories — and
    /// keeps the data file open for [`SledFiles::sync`]. Call after sled's
    /// `open`.
    ///
    /// # Errors
    /// The filesystem's error.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let files = Self {
            blobs: dir.join("blobs"),
            data: File::open(dir.join("db"))?,
            synced: Mutex::new(HashSet::new()),
        };
        File::open(dir.join("conf"))?.sync_all()?;
        files.sync()?;
        File::open(dir)?.sync_all()?;
        Ok(files)
    }

    /// Makes everything sled flushed durable: blobs not synced yet and the
    /// `blobs` directory (if any appeared), then the data file. Blocking;
    /// call right after sled's `flush`.
    ///
    /// # Errors
    /// The filesystem's error.
    pub fn sync(&self) -> io::Result<()> {
        self.sync_blobs()?;
        self.data.sync_data()
    }

    fn sync_blobs(&self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        };
        let present = entries
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<io::Result<HashSet<OsString>>>()?;
        let mut synced = lock(&self.synced);
        synced.retain(|name| present.contains(name));
        let mut added = false;
        for name in present {
            if synced.contains(&name) {
                continue;
            }
            match File::open(self.blobs.join(&name)) {
                Ok(blob) => blob.sync_all()?,
                // Removed by sled since the listing: nothing to keep.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            }
            synced.insert(name);
            added = true;
        }
        if added {
            File::open(&self.blobs)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::SledFiles;

    #[test]
    fn new_blobs_are_synced_once_and_removed_ones_forgotten() {
        let dir = std::env::temp_dir().join(format!("sled-files-{}", std::process::id()));
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).expect("dirs");
        std::fs::write(dir.join("conf"), b"c").expect("conf");
        std::fs::write(dir.join("db"), b"d").expect("db");
        std::fs::write(blobs.join("7"), b"old").expect("blob");
        let files = SledFiles::open(&dir).expect("open");
        assert_eq!(files.synced.lock().expect("lock").len(), 1);
        std::fs::write(blobs.join("9"), b"new").expect("blob");
        std::fs::remove_file(blobs.join("7")).expect("rm");
        files.sync().expect("sync");
        let synced = files.synced.lock().expect("lock").clone();
        assert_eq!(synced, [std::ffi::OsString::from("9")].into());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
