//! The current snapshot in a file of its own, beside sled, replaced
//! atomically: written to `snapshot.tmp`, fsynced, renamed over
//! `snapshot`, and the directory fsynced.
//!
//! Why not in sled: a snapshot is one value of hundreds of KB to MB, which
//! sled keeps in a `blobs/` file of its own; sled writes the log record that
//! points at a blob and deletes the blob it replaced on its own schedule,
//! so no fsync we add after its flush orders them, and a power cut could
//! leave a log pointing at a torn blob (the fault suite's power cut found a
//! node that panicked in sled's recovery, and would not start). Here the
//! snapshot on the disk is always a whole one: the old or the new.
//!
//! Layout: `u32 meta length | meta JSON | data` (the data is
//! [`super::snapshot_codec`]'s encoding).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use openraft::alias::SnapshotMetaOf;

use super::types::TypeConfig;
use crate::io_error::io_err;

/// The snapshot file in a directory.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    dir: PathBuf,
}

impl SnapshotFile {
    /// The snapshot file of `dir` (created if missing).
    ///
    /// # Errors
    /// The filesystem's error.
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join("snapshot")
    }

    /// The stored snapshot's metadata only, if there is one.
    ///
    /// # Errors
    /// The filesystem's error, or a malformed file.
    pub fn meta(&self) -> io::Result<Option<SnapshotMetaOf<TypeConfig>>> {
        let Some(mut file) = self.file()? else {
            return Ok(None);
        };
        let meta = read_meta(&mut file)?;
        Ok(Some(meta))
    }

    /// The stored snapshot, if there is one.
    ///
    /// # Errors
    /// The filesystem's error, or a malformed file.
    pub fn read(&self) -> io::Result<Option<(SnapshotMetaOf<TypeConfig>, Vec<u8>)>> {
        let Some(mut file) = self.file()? else {
            return Ok(None);
        };
        let meta = read_meta(&mut file)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        Ok(Some((meta, data)))
    }

    /// Replaces the stored snapshot, durably (blocking).
    ///
    /// # Errors
    /// The filesystem's error; the stored snapshot is then unchanged.
    pub fn write(&self, meta: &SnapshotMetaOf<TypeConfig>, data: &[u8]) -> io::Result<()> {
        let meta = serde_json::to_vec(meta).map_err(io_err)?;
        let len = u32::try_from(meta.len()).map_err(io_err)?;
        let tmp = self.dir.join("snapshot.tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(&len.to_le_bytes())?;
        file.write_all(&meta)?;
        file.write_all(data)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, self.path())?;
        File::open(&self.dir)?.sync_all()
    }

    fn file(&self) -> io::Result<Option<File>> {
        match File::open(self.path()) {
            Ok(file) => Ok(Some(file)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }
}

fn read_meta(file: &mut File) -> io::Result<SnapshotMetaOf<TypeConfig>> {
    let mut len = [0u8; 4];
    file.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    // A snapshot's metadata is a log id and a membership: far below this.
    if len > 1 << 20 {
        return Err(io_err(format!("snapshot metadata of {len} bytes")));
    }
    let mut meta = vec![0u8; len];
    file.read_exact(&mut meta)?;
    serde_json::from_slice(&meta).map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_whole_snapshot_and_a_leftover_tmp_is_ignored() {
        let dir = tempfile::tempdir().expect("dir");
        let file = SnapshotFile::open(&dir.path().join("s")).expect("open");
        assert!(file.read().expect("read").is_none());
        let meta = SnapshotMetaOf::<TypeConfig>::default();
        file.write(&meta, b"first").expect("write");
        file.write(&meta, b"second").expect("write");
        // A write cut short leaves only its tmp file behind.
        std::fs::write(dir.path().join("s/snapshot.tmp"), b"\x05\x00").expect("tmp");
        let (read, data) = file.read().expect("read").expect("a snapshot");
        assert_eq!((read, data), (meta.clone(), b"second".to_vec()));
        assert_eq!(file.meta().expect("meta"), Some(meta));
        // A malformed file is an error, not a panic.
        std::fs::write(dir.path().join("s/snapshot"), b"\xff\xff\xff\x7f").expect("bad");
        assert!(file.read().is_err());
    }
}
