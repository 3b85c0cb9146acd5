//! The Raft log and vote in sled.
//!
//! Entries live in the `raft_log` tree keyed by big-endian index; the vote, the
//! last purged log id and the committed log id in `raft_meta`. An append is
//! visible as soon as `append` returns and acknowledged (its `IOFlushed`
//! callback) once a flush covering it has finished. Flushes run on one thread
//! of their own, so a slow fsync never blocks the Raft core, and each flush
//! acknowledges every append that arrived while the previous one ran.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;

use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::durable::Durable;
use super::types::TypeConfig;
use crate::group_id::GroupNames;
use crate::io_error::io_err;

const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";
const COMMITTED: &str = "committed";

/// The log store. Clones share the trees and the flusher.
#[derive(Debug, Clone)]
pub struct SledLogStore {
    /// The database, flushed durably (votes, and the flusher thread's).
    durable: Durable,
    log: sled::Tree,
    meta: sled::Tree,
    /// Hands append callbacks to the flusher thread.
    flushes: mpsc::Sender<IOFlushed<TypeConfig>>,
}

impl SledLogStore {
    /// Opens the log trees in `durable` and starts the flusher thread, which ends
    /// when the last clone is dropped.
    ///
    /// # Errors
    /// sled's error, as `io::Error`.
    pub fn open(
        durable: &Durable,
        names: GroupNames,
        fsync_seconds: prometheus_client::metrics::histogram::Histogram,
    ) -> io::Result<Self> {
        let db = durable.db();
        let (flushes, pending) = mpsc::channel::<IOFlushed<TypeConfig>>();
        let flusher = durable.clone();
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || {
                while let Ok(first) = pending.recv() {
                    let mut batch = vec![first];
                    batch.extend(pending.try_iter());
                    let started = std::time::Instant::now();
                    let result = flusher.flush_blocking();
                    fsync_seconds.observe(started.elapsed().as_secs_f64());
                    for callback in batch {
                        callback.io_completed(result.as_ref().map(|_| ()).map_err(io_err));
                    }
                }
            })?;
        Ok(Self {
            durable: durable.clone(),
            log: db.open_tree(names.tree("raft_log")).map_err(io_err)?,
            meta: db.open_tree(names.tree("raft_meta")).map_err(io_err)?,
            flushes,
        })
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        self.meta
            .get(key)
            .map_err(io_err)?
            .map(|bytes| serde_json::from_slice(&bytes).map_err(io_err))
            .transpose()
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(io_err)?;
        self.meta.insert(key, bytes).map_err(io_err)?;
        Ok(())
    }

    /// Removes every entry with index in `range`.
    fn remove_range(&self, from: u64, to_inclusive: u64) -> io::Result<()> {
        for key in self
            .log
            .range(from.to_be_bytes()..=to_inclusive.to_be_bytes())
            .keys()
        {
            self.log.remove(key.map_err(io_err)?).map_err(io_err)?;
        }
        Ok(())
    }

    /// Bytes sled reports on disk (for measurements).
    pub fn size_on_disk(&self) -> u64 {
        self.durable.db().size_on_disk().unwrap_or(0)
    }
}

impl RaftLogReader<TypeConfig> for SledLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        for item in self.log.range(start.to_be_bytes()..) {
            let (key, value) = item.map_err(io_err)?;
            let index = u64::from_be_bytes(key.as_ref().try_into().map_err(io_err)?);
            if !range.contains(&index) {
                break;
            }
            entries.push(serde_json::from_slice(&value).map_err(io_err)?);
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<TypeConfig>>, io::Error> {
        self.get_meta(VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for SledLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogIdOf<TypeConfig>> = self.get_meta(LAST_PURGED)?;
        let last = match self.log.last().map_err(io_err)? {
            Some((_, bytes)) => {
                let entry: EntryOf<TypeConfig> = serde_json::from_slice(&bytes).map_err(io_err)?;
                Some(entry.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> Result<(), io::Error> {
        self.put_meta(VOTE, vote)?;
        // A vote must be on disk before it is acted on.
        self.durable.flush().await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        // Not flushed: losing it only means re-learning commit from the leader.
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<TypeConfig>>, io::Error> {
        Ok(self
            .get_meta::<Option<LogIdOf<TypeConfig>>>(COMMITTED)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(io_err)?;
            self.log
                .insert(entry.log_id.index.to_be_bytes(), bytes)
                .map_err(io_err)?;
        }
        self.flushes
            .send(callback)
            .map_err(|_| io_err("the log flusher has stopped"))
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        self.remove_range(from, u64::MAX)
    }

    async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> Result<(), io::Error> {
        // Record the purge point first: entries at or below it are ignored
        // from then on, so a crash in the middle leaves nothing inconsistent.
        self.put_meta(LAST_PURGED, &log_id)?;
        self.remove_range(0, log_id.index)
    }
}
