//! The Raft state machine: the [`LeaseTable`] in memory, snapshots in a file.
//!
//! Apply updates the in-memory table (shared with the API through
//! [`SharedState`]) and wakes watchers. The table reaches disk as snapshots,
//! built every `snapshot_every` entries and stored in [`SnapshotFile`]
//! (earlier versions kept them in sled's `raft_snapshot` tree: read when
//! there is no file, emptied once one is written); after a restart the node
//! loads the snapshot and openraft replays the log after it. Since fencing tokens are log indexes, a restarted node never
//! hands out a token at or below one it handed out before.

use std::io::{self, Cursor};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use palisade_plumbing::sync::lock;
use serde::Deserialize;
use tokio::sync::watch;

use super::applied::{AppliedState, SharedState};
use super::durable::Durable;
use super::feed;
use super::snapshot_codec;
use super::snapshot_file::SnapshotFile;
use super::types::TypeConfig;
use crate::group_id::GroupNames;
use crate::io_error::io_err;
use crate::lease_table::command::CommandResult;
use crate::metrics::ElectionMetrics;

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
    /// Where the current snapshot is.
    file: SnapshotFile,
    /// Earlier versions' snapshot tree: read when there is no file.
    snapshots: sled::Tree,
    /// Serializes "is the stored snapshot older?" and the write: a snapshot
    /// built before an install finished must not replace the installed one.
    store_lock: Arc<std::sync::Mutex<()>>,
}

/// Earlier versions' snapshot keys: its metadata (JSON), its data
/// ([`snapshot_codec`]), and an older JSON snapshot.
const META: &str = "meta";
const DATA: &str = "data";
const LEGACY: &str = "current";

impl StateMachine {
    /// Loads the latest snapshot of the group `names` names, if any: from
    /// the file in `snapshot_dir`, else from an earlier version's tree in
    /// `durable`.
    ///
    /// # Errors
    /// sled's, the filesystem's or the decoder's error.
    pub fn open(
        durable: &Durable,
        names: GroupNames,
        snapshot_dir: &std::path::Path,
        metrics: Arc<ElectionMetrics>,
    ) -> io::Result<Self> {
        let file = SnapshotFile::open(snapshot_dir)?;
        let snapshots = durable
            .db()
            .open_tree(names.tree("raft_snapshot"))
            .map_err(io_err)?;
        let state = match (
            file.read()?.map(|(_, data)| data),
            snapshots.get(DATA).map_err(io_err)?,
            snapshots.get(LEGACY).map_err(io_err)?,
        ) {
            (Some(data), _, _) => snapshot_codec::decode(&data)?,
            (None, Some(data), _) => snapshot_codec::decode(&data)?,
            (None, None, Some(legacy)) => {
                serde_json::from_slice::<LegacySnapshot>(&legacy)
                    .map_err(io_err)?
                    .state
            }
            (None, None, None) => AppliedState::default(),
        };
        let applied = state.last_applied.as_ref().map_or(0, |id| id.index);
        let (changes, _) = watch::channel(applied);
        Ok(Self {
            shared: SharedState::new(state, changes, metrics),
            file,
            snapshots,
            store_lock: Arc::default(),
        })
    }

    /// The state shared with the API.
    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    /// Stores a snapshot durably (and drops an earlier version's snapshot
    /// from sled) — unless the stored snapshot is newer (a snapshot built
    /// from the state before an install finishes after it: the state must
    /// never go back). True if stored.
    async fn store_snapshot(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        data: &[u8],
    ) -> io::Result<bool> {
        let this = self.clone();
        let (meta, data) = (meta.clone(), data.to_vec());
        tokio::task::spawn_blocking(move || this.store_blocking(&meta, &data))
            .await
            .map_err(io_err)?
    }

    fn store_blocking(&self, meta: &SnapshotMetaOf<TypeConfig>, data: &[u8]) -> io::Result<bool> {
        let _one_at_a_time = lock(&self.store_lock);
        let stored = match self.file.meta()? {
            Some(stored) => Some(stored),
            None => self
                .snapshots
                .get(META)
                .map_err(io_err)?
                .map(|bytes| serde_json::from_slice(&bytes))
                .transpose()
                .map_err(io_err)?,
        };
        if stored
            .is_some_and(|stored: SnapshotMetaOf<TypeConfig>| stored.last_log_id > meta.last_log_id)
        {
            tracing::info!(
                stale = ?meta.last_log_id,
                "a snapshot older than the stored one was not stored"
            );
            return Ok(false);
        }
        self.file.write(meta, data)?;
        // The file is durable: the old tree is no longer read.
        if !self.snapshots.is_empty() {
            self.snapshots.clear().map_err(io_err)?;
        }
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
            let watched = self.shared.feed.watched();
            let mut changes = Vec::new();
            let result = self.shared.write(|state| {
                state.last_applied = Some(entry.log_id);
                match &entry.payload {
                    EntryPayload::Blank => CommandResult::None,
                    EntryPayload::Normal(command) => {
                        if let Some(lease) = command.lease() {
                            self.shared.touch(Some(lease));
                        }
                        let before = state.table.leases.len();
                        let reclaimable = if watched {
                            feed::reclaimable(&state.table, command)
                        } else {
                            Vec::new()
                        };
                        let result = state.table.apply(index, command);
                        if watched {
                            changes = feed::changes(index, &state.table, command, reclaimable);
                        }
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
            // the table with this entry applied. The feed goes out before
            // `changes` names this index (a prefix watch relies on it).
            self.shared.feed.send(changes);
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
        self.shared
            .feed
            .send(vec![feed::Change::Reset { index: applied }]);
        self.shared.changes.send_replace(applied);
        self.shared.bells.ring_all();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Self::SnapshotData>>, io::Error> {
        if let Some((meta, data)) = self.file.read()? {
            return Ok(Some(SnapshotOf::<TypeConfig, Self::SnapshotData> {
                meta,
                snapshot: Cursor::new(data),
            }));
        }
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
    use crate::raft::snapshot_codec::tests::state;

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
        let db = Durable::open(dir.path()).expect("sled");
        let mut machine = StateMachine::open(
            &db,
            crate::group_id::GroupId::ZERO.names(),
            &dir.path().join("snap"),
            Arc::default(),
        )
        .expect("open");
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
        // sled lets go of its lock once its last handle is gone, and a
        // flush task may still hold one for a moment: bounded retries.
        let mut reopened = Durable::open(dir.path());
        for _ in 0..250 {
            if reopened.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            reopened = Durable::open(dir.path());
        }
        let db = reopened.expect("reopen");
        let machine = StateMachine::open(
            &db,
            crate::group_id::GroupId::ZERO.names(),
            &dir.path().join("snap"),
            Arc::default(),
        )
        .expect("open");
        let (applied, leases) = machine.shared.read(|s| (s.last_applied, s.table.clone()));
        assert_eq!(applied, newer.last_applied);
        assert_eq!(leases, newer.table);
    }

    /// An earlier version's snapshot in sled loads; the next store writes
    /// the file and empties the tree (no large value left in sled).
    #[tokio::test]
    async fn a_snapshot_in_the_old_tree_loads_and_moves_to_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let db = Durable::open(dir.path()).expect("sled");
        let old = state(50);
        let tree = db.db().open_tree("raft_snapshot").expect("tree");
        let meta = serde_json::to_vec(&meta_of(&old)).expect("meta");
        tree.insert(META, meta).expect("meta");
        tree.insert(DATA, snapshot_codec::encode(&old).expect("encode"))
            .expect("data");
        let snap = dir.path().join("snap");
        let mut machine = StateMachine::open(
            &db,
            crate::group_id::GroupId::ZERO.names(),
            &snap,
            Arc::default(),
        )
        .expect("open");
        assert_eq!(machine.shared.read(|s| s.table.clone()), old.table);
        let built = machine.build_snapshot().await.expect("build");
        assert_eq!(built.meta.last_log_id, old.last_applied);
        assert!(tree.is_empty(), "the old tree is emptied");
        drop(machine);
        let machine = StateMachine::open(
            &db,
            crate::group_id::GroupId::ZERO.names(),
            &snap,
            Arc::default(),
        )
        .expect("reopen");
        assert_eq!(machine.shared.read(|s| s.table.clone()), old.table);
    }
}
