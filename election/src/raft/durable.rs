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
