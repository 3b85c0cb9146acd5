//! The Raft state machine: the [`LeaseTable`] in memory, snapshots in sled.
//!
//! Apply updates the in-memory table (shared with the API through
//! [`SharedState`]) and wakes watchers. The table reaches disk as snapshots,
//! built every `snapshot_every` entries and stored in the `raft_snapshot`
//! tree; after a restart the node loads the snapshot and openraft replays the
//! log after it. Since fencing tokens are log indexes, a restarted node never
//! hands out a token at or below one it handed out before.

use std::io::{self, Cursor};
use std::sync::{Arc, RwLock};

use futures::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::command::CommandResult;
use crate::lease_table::LeaseTable;
use crate::snapshot_codec;
use crate::TypeConfig;

/// The applied state, as the API reads it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct AppliedState {
    /// The last applied log id.
    pub last_applied: Option<LogIdOf<TypeConfig>>,
    /// The membership as of the last applied membership entry.
    pub membership: StoredMembershipOf<TypeConfig>,
    /// The leases and the signing key.
    pub table: LeaseTable,
}

/// The state shared between the state machine and the API: read it under the
/// lock; wait on `changes` for the next apply.
#[derive(Debug, Clone)]
pub struct SharedState {
    /// The applied state.
    pub state: Arc<RwLock<AppliedState>>,
    /// The last applied index, bumped after every apply batch.
    pub changes: watch::Sender<u64>,
    /// Which leases applies changed since the lessor last looked
    /// ([`SharedState::take_touched`]), so it need not scan the table.
    touched: Arc<std::sync::Mutex<Touched>>,
    /// Per-lease wakeups (and acquire queues): apply rings the leases it
    /// changes, so a waiter wakes only for its own lease.
    pub bells: Arc<crate::waiters::Bells>,
    /// The node's metrics (apply counts grants, releases, expiries...).
    pub metrics: Arc<crate::metrics::ElectionMetrics>,
}

/// Leases changed since the last [`SharedState::take_touched`].
#[derive(Debug, Default)]
pub struct Touched {
    /// Everything may have changed (a snapshot was installed, or more
    /// changed than [`MAX_TOUCHED`]): look at the whole table.
    pub all: bool,
    /// The leases changed, in apply order (repeats possible).
    pub names: Vec<palisade_names::LeaseName>,
}

/// More changes than this between two looks collapse into `all` (memory
/// stays bounded when nobody looks, as on a follower between ticks).
const MAX_TOUCHED: usize = 65_536;

impl SharedState {
    /// The leases changed since the last call (everything, the first time).
    pub fn take_touched(&self) -> Touched {
        std::mem::take(
            &mut *self
                .touched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn touch(&self, lease: Option<&palisade_names::LeaseName>) {
        let mut touched = self
            .touched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match lease {
            _ if touched.all => {}
            Some(lease) if touched.names.len() < MAX_TOUCHED => touched.names.push(lease.clone()),
            _ => {
                touched.all = true;
                touched.names = Vec::new();
            }
        }
    }

    /// Reads the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&AppliedState) -> T) -> T {
        let guard = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&guard)
    }

    fn write<T>(&self, f: impl FnOnce(&mut AppliedState) -> T) -> T {
        let mut guard = self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }
}

/// A snapshot as earlier versions stored it (one JSON document under
/// [`LEGACY`]); read at open, never written.
#[derive(Deserialize)]
struct LegacySnapshot {
    meta: SnapshotMetaOf<TypeConfig>,
    state: AppliedState,
}

/// The state machine handed to openraft.
#[derive(Debug, Clone)]
pub struct StateMachine {
    shared: SharedState,
    db: sled::Db,
    snapshots: sled::Tree,
    /// Serializes "is the stored snapshot older?" and the write: a snapshot
    /// built before an install finished must not replace the installed one.
    store_lock: Arc<std::sync::Mutex<()>>,
}

/// The current snapshot's metadata (JSON) and data ([`snapshot_codec`]),
/// written together in one batch.
const META: &str = "meta";
const DATA: &str = "data";
const LEGACY: &str = "current";

fn io_err(err: impl std::fmt::Display) -> io::Error {
    io::Error::other(err.to_string())
}

impl StateMachine {
    /// Opens the snapshot tree and loads the latest snapshot, if any.
    ///
    /// # Errors
    /// sled's or the decoder's error.
    pub fn open(db: &sled::Db) -> io::Result<Self> {
        let snapshots = db.open_tree("raft_snapshot").map_err(io_err)?;
        let state = match (
            snapshots.get(DATA).map_err(io_err)?,
            snapshots.get(LEGACY).map_err(io_err)?,
        ) {
            (Some(data), _) => snapshot_codec::decode(&data)?,
            (None, Some(legacy)) => {
                serde_json::from_slice::<LegacySnapshot>(&legacy)
                    .map_err(io_err)?
                    .state
            }
            (None, None) => AppliedState::default(),
        };
        let applied = state.last_applied.as_ref().map_or(0, |id| id.index);
        let (changes, _) = watch::channel(applied);
        Ok(Self {
            shared: SharedState {
                state: Arc::new(RwLock::new(state)),
                changes,
                touched: Arc::new(std::sync::Mutex::new(Touched {
                    all: true,
                    names: Vec::new(),
                })),
                bells: Arc::default(),
                metrics: Arc::default(),
            },
            db: db.clone(),
            snapshots,
            store_lock: Arc::default(),
        })
    }

    /// The state shared with the API.
    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    /// Stores a snapshot's metadata and encoded data in one batch (and
    /// drops an earlier version's JSON snapshot), durably — unless the
    /// stored snapshot is newer (a snapshot built from the state before an
    /// install finishes after it: the state must never go back). True if
    /// stored.
    async fn store_snapshot(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        data: &[u8],
    ) -> io::Result<bool> {
        {
            let _one_at_a_time = self
                .store_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let stored = self.snapshots.get(META).map_err(io_err)?;
            let stored: Option<SnapshotMetaOf<TypeConfig>> = stored
                .map(|bytes| serde_json::from_slice(&bytes))
                .transpose()
                .map_err(io_err)?;
            if stored.is_some_and(|stored| stored.last_log_id > meta.last_log_id) {
                tracing::info!(
                    stale = ?meta.last_log_id,
                    "a snapshot older than the stored one was not stored"
                );
                return Ok(false);
            }
            let mut batch = sled::Batch::default();
            batch.insert(META, serde_json::to_vec(meta).map_err(io_err)?);
            batch.insert(DATA, data);
            batch.remove(LEGACY);
            self.snapshots.apply_batch(batch).map_err(io_err)?;
        }
        crate::log_store::flush(&self.db).await?;
        Ok(true)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, Self::SnapshotData>, io::Error> {
        // Encoded under the read lock: apply waits for the encoding (tens
        // of ms per 100k leases), not for the copy, the write or the fsync.
        let (meta, data) = self.shared.read(|state| {
            let meta = SnapshotMetaOf::<TypeConfig> {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
            };
            snapshot_codec::encode(state).map(|data| (meta, data))
        })?;
        if !self.store_snapshot(&meta, &data).await? {
            // An install overtook this build: hand openraft the newer one.
            if let Some(current) = self.get_current_snapshot().await? {
                return Ok(current);
            }
        }
        Ok(SnapshotOf::<TypeConfig, Self::SnapshotData> {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>), io::Error> {
        Ok(self.shared.read(|s| (s.last_applied, s.membership.clone())))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut last_index = None;
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id.index;
            let result = self.shared.write(|state| {
                state.last_applied = Some(entry.log_id);
                match &entry.payload {
                    EntryPayload::Blank => CommandResult::None,
                    EntryPayload::Normal(command) => {
                        if let Some(lease) = command.lease() {
                            self.shared.touch(Some(lease));
                        }
                        let before = state.table.leases.len();
                        let result = state.table.apply(index, command);
                        let removed = before.saturating_sub(state.table.leases.len());
                        self.shared.metrics.applied(command, &result, removed);
                        result
                    }
                    EntryPayload::Membership(membership) => {
                        state.membership = StoredMembershipOf::<TypeConfig>::new(
                            Some(entry.log_id),
                            membership.clone(),
                        );
                        CommandResult::None
                    }
                }
            });
            // Rung after the write lock is released: a woken waiter reads
            // the table with this entry applied.
            if let EntryPayload::Normal(command) = &entry.payload {
                if let Some(lease) = command.lease() {
                    self.shared.bells.ring(lease);
                }
            }
            if let Some(responder) = responder {
                responder.send(result);
            }
            last_index = Some(index);
        }
        if let Some(index) = last_index {
            self.shared.changes.send_replace(index);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let state = snapshot_codec::decode(snapshot.get_ref())?;
        // Stored in this version's encoding, whatever the sender used.
        let data = if snapshot.get_ref().starts_with(b"PALSNAP") {
            snapshot.into_inner()
        } else {
            snapshot_codec::encode(&state)?
        };
        if !self.store_snapshot(meta, &data).await? {
            return Err(io_err(format!(
                "refused to install snapshot {:?}: older than the stored one",
                meta.last_log_id
            )));
        }
        let applied = state.last_applied.as_ref().map_or(0, |id| id.index);
        self.shared.write(|current| *current = state);
        self.shared.touch(None);
        self.shared.changes.send_replace(applied);
        self.shared.bells.ring_all();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Self::SnapshotData>>, io::Error> {
        let (meta, data) = match (
            self.snapshots.get(META).map_err(io_err)?,
            self.snapshots.get(DATA).map_err(io_err)?,
        ) {
            (Some(meta), Some(data)) => (
                serde_json::from_slice(&meta).map_err(io_err)?,
                data.to_vec(),
            ),
            _ => match self.snapshots.get(LEGACY).map_err(io_err)? {
                Some(legacy) => {
                    let legacy: LegacySnapshot = serde_json::from_slice(&legacy).map_err(io_err)?;
                    (legacy.meta, snapshot_codec::encode(&legacy.state)?)
                }
                None => return Ok(None),
            },
        };
        Ok(Some(SnapshotOf::<TypeConfig, Self::SnapshotData> {
            meta,
            snapshot: Cursor::new(data),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot_codec::tests::state;

    fn meta_of(state: &AppliedState) -> SnapshotMetaOf<TypeConfig> {
        SnapshotMetaOf::<TypeConfig> {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
        }
    }

    /// Install, then a snapshot built from the state before the install
    /// finishes late: the newer snapshot stays, in memory, on disk and after
    /// a restart; the late build hands back the installed snapshot.
    #[tokio::test]
    async fn a_snapshot_built_before_an_install_never_replaces_it() {
        let dir = tempfile::tempdir().expect("dir");
        let db = sled::open(dir.path()).expect("sled");
        let mut machine = StateMachine::open(&db).expect("open");
        // A build reads the current (older) state under the read lock...
        let older = state(100);
        machine.shared.write(|s| *s = older.clone());
        let builder = machine.clone();
        let late = snapshot_codec::encode(&older).expect("encode");
        // ...and an install of a newer snapshot completes before it stores.
        let newer = state(300);
        let data = snapshot_codec::encode(&newer).expect("encode");
        machine
            .install_snapshot(&meta_of(&newer), Cursor::new(data))
            .await
            .expect("install");
        assert_eq!(machine.shared.read(|s| s.table.leases.len()), 300);
        assert!(!builder
            .store_snapshot(&meta_of(&older), &late)
            .await
            .expect("store"));
        let current = machine
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("a snapshot");
        assert_eq!(current.meta.last_log_id, newer.last_applied);
        assert_eq!(
            snapshot_codec::decode(current.snapshot.get_ref())
                .expect("decode")
                .table,
            newer.table
        );
        // A build now snapshots the installed state.
        let built = machine.clone().build_snapshot().await.expect("build");
        assert_eq!(built.meta.last_log_id, newer.last_applied);
        // An older snapshot offered for install is refused, state untouched.
        let stale = snapshot_codec::encode(&older).expect("encode");
        assert!(machine
            .install_snapshot(&meta_of(&older), Cursor::new(stale))
            .await
            .is_err());
        assert_eq!(machine.shared.read(|s| s.table.leases.len()), 300);
        // Restart: the installed state comes back.
        drop((machine, builder));
        drop(db);
        let db = sled::open(dir.path()).expect("reopen");
        let machine = StateMachine::open(&db).expect("open");
        let (applied, leases) = machine.shared.read(|s| (s.last_applied, s.table.clone()));
        assert_eq!(applied, newer.last_applied);
        assert_eq!(leases, newer.table);
    }
}
