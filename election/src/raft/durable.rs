//! [`Durable`]: the node's sled database and its files, so that a flush
//! really reaches the disk: sled's own `flush` does not (a power cut loses
//! what it "flushed", and a torn snapshot blob left a node that would not
//! start: `tests/power_cut.rs`, the fault suite). Each flush is followed by
//! [`SledFiles::sync`] (new blobs, then the data file); at open, what sled
//! wrote at creation is synced too, so a cut right after creation leaves a
//! database that opens.

use std::io;
use std::path::Path;
use std::sync::Arc;

use palisade_plumbing::sled_files::SledFiles;

use crate::io_error::io_err;

/// The node's sled database, flushed durably.
#[derive(Debug, Clone)]
pub struct Durable {
    db: sled::Db,
    /// sled's files, fsynced after every flush.
    files: Arc<SledFiles>,
}

impl Durable {
    /// Opens (or creates) the database in `dir` and syncs what sled wrote at
    /// creation.
    ///
    /// # Errors
    /// sled's or the filesystem's error.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(64 * 1024 * 1024)
            .flush_every_ms(Some(1000))
            .open()
            .map_err(io_err)?;
        let files = Arc::new(SledFiles::open(dir)?);
        Ok(Self { db, files })
    }

    /// The database, for its trees.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Flushes sled's buffers and fsyncs its files; blocking.
    ///
    /// # Errors
    /// sled's or the filesystem's error.
    pub fn flush_blocking(&self) -> io::Result<()> {
        self.db.flush().map_err(io_err)?;
        self.files.sync()
    }

    /// [`Durable::flush_blocking`] off the async threads.
    ///
    /// # Errors
    /// As [`Durable::flush_blocking`].
    pub async fn flush(&self) -> io::Result<()> {
        let durable = self.clone();
        tokio::task::spawn_blocking(move || durable.flush_blocking())
            .await
            .map_err(io_err)?
    }
}

/// The tree and key the cluster's partition count is kept under.
const META_TREE: &str = "palisade_meta";
const PARTITIONS_KEY: &[u8] = b"partitions";

impl Durable {
    /// The partitions this data dir's cluster runs: stored when the dir is
    /// made (`asked`), and from then on the only count it opens with. A dir
    /// written before partitions (a Raft log or vote, no count) is 1.
    ///
    /// # Errors
    /// `asked` differs from the stored count (one line naming both), or
    /// sled's error.
    pub fn partitions(&self, asked: u32) -> io::Result<u32> {
        let meta = self.db.open_tree(META_TREE).map_err(io_err)?;
        let stored = match meta.get(PARTITIONS_KEY).map_err(io_err)? {
            Some(bytes) => {
                let bytes: [u8; 4] = bytes.as_ref().try_into().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "stored partition count is torn")
                })?;
                Some(u32::from_be_bytes(bytes))
            }
            None if self.holds_raft_state()? => Some(1),
            None => None,
        };
        match stored {
            Some(stored) if stored != asked => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "this data dir holds a cluster of {stored} partition(s); it cannot be \
                     started with --partitions {asked} (the count is fixed when a cluster is made)"
                ),
            )),
            Some(stored) => Ok(stored),
            None => {
                meta.insert(PARTITIONS_KEY, &asked.to_be_bytes())
                    .map_err(io_err)?;
                self.flush_blocking()?;
                Ok(asked)
            }
        }
    }

    /// Whether group 0 has written anything (a vote, a log entry, applied
    /// state): a data dir from before partitions were counted.
    fn holds_raft_state(&self) -> io::Result<bool> {
        let names = crate::group_id::GroupId::ZERO.names();
        for tree in ["raft_log", "raft_meta", "raft_snapshot"] {
            let name = names.tree(tree);
            if self
                .db
                .tree_names()
                .iter()
                .any(|t| t.as_ref() == name.as_bytes())
                && !self.db.open_tree(&name).map_err(io_err)?.is_empty()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use crate::raft::durable::Durable;

    /// The count is stored when the dir is made and refused when another is
    /// asked; a dir with group 0's state and no count is 1.
    #[test]
    fn the_partition_count_is_fixed_when_the_data_dir_is_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = dir.path().join("fresh");
        {
            let durable = Durable::open(&fresh).expect("open");
            assert_eq!(durable.partitions(6).expect("made"), 6);
        }
        let durable = Durable::open(&fresh).expect("reopen");
        assert_eq!(durable.partitions(6).expect("same"), 6);
        let refused = durable.partitions(2).expect_err("another count");
        assert!(
            refused
                .to_string()
                .contains("holds a cluster of 6 partition(s)")
                && refused.to_string().contains("--partitions 2"),
            "{refused}"
        );
        let old = dir.path().join("old");
        let durable = Durable::open(&old).expect("open");
        let log = durable.db().open_tree("raft_log").expect("tree");
        log.insert(b"1", b"an entry").expect("insert");
        assert!(durable.partitions(3).is_err(), "an old data dir is 1");
        assert_eq!(durable.partitions(1).expect("one"), 1);
    }
}
