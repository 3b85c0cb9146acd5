//! Group commit: many writers share one fsync.
//!
//! A writer finishes its in-memory transaction, then waits for a flush that
//! *started after* its transaction finished; such a flush covers its write. One
//! flusher task runs flushes back to back while anybody waits, so under load each
//! fsync carries every write that finished while the previous one was running.
//!
//! Readers use the same mechanism: a read that may have seen a write not yet
//! known durable waits for the next flush before answering, so nothing is ever
//! served that a crash could take back.
//!
//! Writers insert under a shared barrier that each flush takes exclusively
//! ([`GroupCommit::inserting`]): a large value goes to a sled blob file
//! written before the log record that points at it, and no insert may
//! create a blob between the flush's listing of new blobs (synced first)
//! and its fsync of the log, or the log could reach the disk pointing at a
//! torn blob and sled would drop everything after it (the power-cut test
//! lost acknowledged fences so, with 160 KiB objects).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use palisade_plumbing::sled_files::SledFiles;
use tokio::sync::{watch, Notify, RwLock, RwLockReadGuard};

use crate::error::StoreError;

/// Flushes `sled` on behalf of many waiters at once.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    /// Flushes started so far; a waiter needs one numbered above what it read.
    started: AtomicU64,
    /// The number of the last finished flush, watched by waiters.
    finished: watch::Sender<u64>,
    /// Wakes the flusher when somebody waits.
    wanted: Notify,
    /// Writes between the start of their transaction and the end of their
    /// durability wait. Zero means every write a reader can see is durable.
    pending_writes: AtomicU64,
    /// Set after a failed flush: the store is fail-stop from then on.
    failed: AtomicBool,
    /// Shared by inserts, exclusive for a flush's sync (see the module).
    barrier: Arc<RwLock<()>>,
}

/// Owns the flusher task; dropping it stops the task.
#[derive(Debug)]
pub(crate) struct FlusherTask(tokio::task::JoinHandle<()>);

impl Drop for FlusherTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Held from before a write's transaction until the write is durable. It
/// is owned (not borrowed), so the durability wait can outlive the request
/// that started the write: a writer that disconnects, or whose request hits
/// its deadline, while waiting for the flush must not let readers see its
/// write before it is on disk.
#[derive(Debug)]
pub(crate) struct PendingWrite(Arc<GroupCommit>);

impl PendingWrite {
    /// Waits until the write is durable, in a task of its own: the wait
    /// (and this guard) end with the flush, not with the caller's future.
    pub(crate) async fn durable(self) -> Result<(), StoreError> {
        let wait = tokio::spawn(async move {
            let result = self.0.wait_durable().await;
            drop(self);
            result
        });
        wait.await
            .map_err(|e| StoreError::Engine(format!("durability wait failed: {e}")))?
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        self.0.pending_writes.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GroupCommit {
    /// Starts the flusher task for `db`, whose `files` are synced after
    /// each flush (sled's own flush is not an fsync). The
    /// task stops when the returned [`FlusherTask`] is dropped.
    pub(crate) fn start(
        db: sled::Db,
        files: Arc<SledFiles>,
        on_flush: Option<Arc<dyn Fn(std::time::Duration) + Send + Sync>>,
    ) -> (Arc<Self>, FlusherTask) {
        let (finished, _) = watch::channel(0);
        let this = Arc::new(Self {
            started: AtomicU64::new(0),
            finished,
            wanted: Notify::new(),
            pending_writes: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            barrier: Arc::new(RwLock::new(())),
        });
        let shared = this.clone();
        let task = tokio::spawn(async move {
            loop {
                shared.wanted.notified().await;
                let number = shared.started.fetch_add(1, Ordering::SeqCst) + 1;
                let (db, files) = (db.clone(), files.clone());
                let barrier = shared.barrier.clone();
                let started = std::time::Instant::now();
                let result = tokio::task::spawn_blocking(move || {
                    let _no_inserts = barrier.blocking_write();
                    db.flush()?;
                    files.sync().map_err(sled::Error::Io)
                })
                .await;
                if let Some(on_flush) = &on_flush {
                    on_flush(started.elapsed());
                }
                let failure = match result {
                    Ok(Ok(_)) => None,
                    Ok(Err(err)) => Some(err.to_string()),
                    Err(err) => Some(err.to_string()),
                };
                if let Some(err) = failure {
                    tracing::error!(%err, "flush failed; refusing all further writes");
                    shared.failed.store(true, Ordering::SeqCst);
                }
                shared.finished.send_replace(number);
            }
        });
        (this, FlusherTask(task))
    }

    /// Marks a write as started; keep the guard until it is durable
    /// ([`PendingWrite::durable`]).
    pub(crate) fn begin_write(self: &Arc<Self>) -> Result<PendingWrite, StoreError> {
        self.pending_writes.fetch_add(1, Ordering::SeqCst);
        let guard = PendingWrite(self.clone());
        self.check_healthy()?;
        Ok(guard)
    }

    /// Held while a writer inserts into sled (never across an await): no
    /// flush syncs meanwhile (see the module).
    pub(crate) async fn inserting(&self) -> RwLockReadGuard<'_, ()> {
        self.barrier.read().await
    }

    /// Writes whose durability wait has not ended.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> u64 {
        self.pending_writes.load(Ordering::SeqCst)
    }

    /// Waits until everything finished before this call is on disk.
    pub(crate) async fn wait_durable(&self) -> Result<(), StoreError> {
        let needed = self.started.load(Ordering::SeqCst) + 1;
        let mut finished = self.finished.subscribe();
        self.wanted.notify_one();
        finished
            .wait_for(|&done| done >= needed)
            .await
            .map_err(|_| StoreError::Engine("flusher stopped".into()))?;
        self.check_healthy()
    }

    /// For a reader that has just read: waits only if what it read may include
    /// a write that is not durable yet.
    pub(crate) async fn wait_readable(&self) -> Result<(), StoreError> {
        if self.pending_writes.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        self.wait_durable().await
    }

    fn check_healthy(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(StoreError::Engine(
                "an earlier flush failed; restart the gateway".into(),
            ));
        }
        Ok(())
    }
}
