//! Group commit: many writers share one fsync.
//!
//! A writer finishes its in-memory transaction, then waits for a flush that
//! *started after* its transaction finished; such a flush covers its write. One
//! flusher thread runs flushes back to back while anybody waits, so under load each
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
use std::sync::{Arc, Condvar, Mutex};

use palisade_plumbing::sled_files::SledFiles;
use palisade_plumbing::sync::lock;
use tokio::sync::{watch, RwLock, RwLockReadGuard};

use crate::error::StoreError;

/// Flushes `sled` on behalf of many waiters at once.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    /// Flushes started so far; a waiter needs one numbered above what it read.
    started: AtomicU64,
    /// The number of the last finished flush, watched by waiters.
    finished: watch::Sender<u64>,
    /// Whether somebody waits for a flush (and whether the flusher should
    /// stop), with the condition the flusher thread sleeps on.
    wanted: (Mutex<Wanted>, Condvar),
    /// Writes between the start of their transaction and the end of their
    /// durability wait. Zero means every write a reader can see is durable.
    pending_writes: AtomicU64,
    /// Set after a failed flush: the store is fail-stop from then on.
    failed: AtomicBool,
    /// Shared by inserts, exclusive for a flush's sync (see the module).
    barrier: Arc<RwLock<()>>,
}

/// What the flusher thread is asked.
#[derive(Debug, Default)]
struct Wanted {
    /// A waiter needs a flush that starts from now.
    flush: bool,
    /// The store is gone: end the thread.
    stop: bool,
}

/// Owns the flusher thread; dropping it ends the thread (after the flush
/// under way, if any).
#[derive(Debug)]
pub(crate) struct FlusherTask(Arc<GroupCommit>);

impl Drop for FlusherTask {
    fn drop(&mut self) {
        let (wanted, wake) = &self.0.wanted;
        lock(wanted).stop = true;
        wake.notify_one();
    }
}

/// Held from before a write's transaction until the write is durable. It
/// is owned (not borrowed), so the durability wait can outlive the request
/// that started the write: a writer that disconnects, or whose request hits
/// its deadline, while waiting for the flush must not let readers see its
/// write before it is on disk (dropped early, the guard waits for the flush
/// in a task of its own).
#[derive(Debug)]
pub(crate) struct PendingWrite {
    commit: Arc<GroupCommit>,
    /// Something may have reached the trees: readers wait for its flush.
    wrote: bool,
    /// Its flush finished (or it wrote nothing): readers need not wait.
    settled: bool,
}

impl PendingWrite {
    /// Something may have reached the trees (even a failed effect's fence):
    /// it stays pending for readers until a flush covers it.
    pub(crate) fn wrote(&mut self) {
        self.wrote = true;
    }

    /// Waits until the write is durable. Its caller's future may be dropped
    /// meanwhile: the guard then keeps readers waiting until the flush.
    pub(crate) async fn durable(mut self) -> Result<(), StoreError> {
        let result = self.commit.wait_durable().await;
        self.settled = true;
        result
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if self.wrote && !self.settled {
            // Dropped before its flush: readers go on waiting for it, in a
            // task of its own (with no runtime left, nobody reads either).
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let commit = self.commit.clone();
                runtime.spawn(async move {
                    let _ = commit.wait_durable().await;
                    commit.pending_writes.fetch_sub(1, Ordering::SeqCst);
                });
                return;
            }
        }
        self.commit.pending_writes.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GroupCommit {
    /// Starts the flusher for `db`, whose `files` are synced after each
    /// flush (sled's own flush is not an fsync): an OS thread of its own,
    /// so a flush is one wake of that thread and one of its waiters, not a
    /// hop through tokio's blocking pool and back (each PUT took some 21
    /// futex calls that way). It stops when the returned [`FlusherTask`] is
    /// dropped.
    ///
    /// # Panics
    /// If the thread cannot be spawned.
    pub(crate) fn start(
        db: sled::Db,
        files: Arc<SledFiles>,
        on_flush: Option<Arc<dyn Fn(std::time::Duration) + Send + Sync>>,
    ) -> (Arc<Self>, FlusherTask) {
        let (finished, _) = watch::channel(0);
        let this = Arc::new(Self {
            started: AtomicU64::new(0),
            finished,
            wanted: (Mutex::default(), Condvar::new()),
            pending_writes: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            barrier: Arc::new(RwLock::new(())),
        });
        let shared = this.clone();
        std::thread::Builder::new()
            .name("store-flusher".into())
            .spawn(move || shared.flush_while_wanted(&db, &files, on_flush.as_deref()))
            .expect("spawn the store's flusher thread");
        (this.clone(), FlusherTask(this))
    }

    /// The flusher thread: a flush whenever one is wanted, until stopped.
    fn flush_while_wanted(
        &self,
        db: &sled::Db,
        files: &SledFiles,
        on_flush: Option<&(dyn Fn(std::time::Duration) + Send + Sync)>,
    ) {
        loop {
            {
                let (wanted, wake) = &self.wanted;
                let mut wanted = lock(wanted);
                while !wanted.flush && !wanted.stop {
                    wanted = wake
                        .wait(wanted)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if wanted.stop {
                    return;
                }
                wanted.flush = false;
            }
            let number = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            let started = std::time::Instant::now();
            let result = {
                let _no_inserts = self.barrier.blocking_write();
                db.flush()
                    .and_then(|_| files.sync().map_err(sled::Error::Io))
            };
            if let Some(on_flush) = on_flush {
                on_flush(started.elapsed());
            }
            if let Err(err) = result {
                tracing::error!(%err, "flush failed; refusing all further writes");
                self.failed.store(true, Ordering::SeqCst);
            }
            self.finished.send_replace(number);
        }
    }

    /// Marks a write as started; keep the guard until it is durable
    /// ([`PendingWrite::durable`]).
    pub(crate) fn begin_write(self: &Arc<Self>) -> Result<PendingWrite, StoreError> {
        self.pending_writes.fetch_add(1, Ordering::SeqCst);
        let guard = PendingWrite {
            commit: self.clone(),
            wrote: false,
            settled: false,
        };
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
        {
            let (wanted, wake) = &self.wanted;
            let mut wanted = lock(wanted);
            if !wanted.flush {
                wanted.flush = true;
                wake.notify_one();
            }
        }
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
