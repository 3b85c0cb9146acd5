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
}

impl SharedState {
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

/// A stored snapshot: the applied state and openraft's metadata.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMetaOf<TypeConfig>,
    state: AppliedState,
}

/// The state machine handed to openraft.
#[derive(Debug, Clone)]
pub struct StateMachine {
    shared: SharedState,
    db: sled::Db,
    snapshots: sled::Tree,
}

const CURRENT: &str = "current";

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
        let state = match snapshots.get(CURRENT).map_err(io_err)? {
            Some(bytes) => {
                let stored: StoredSnapshot = serde_json::from_slice(&bytes).map_err(io_err)?;
                stored.state
            }
            None => AppliedState::default(),
        };
        let applied = state.last_applied.as_ref().map_or(0, |id| id.index);
        let (changes, _) = watch::channel(applied);
        Ok(Self {
            shared: SharedState {
                state: Arc::new(RwLock::new(state)),
                changes,
            },
            db: db.clone(),
            snapshots,
        })
    }

    /// The state shared with the API.
    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    async fn store_snapshot(&self, stored: &StoredSnapshot) -> io::Result<()> {
        let bytes = serde_json::to_vec(stored).map_err(io_err)?;
        self.snapshots.insert(CURRENT, bytes).map_err(io_err)?;
        crate::log_store::flush(&self.db).await
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, Self::SnapshotData>, io::Error> {
        let state = self.shared.read(Clone::clone);
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
        };
        let data = serde_json::to_vec(&state).map_err(io_err)?;
        self.store_snapshot(&StoredSnapshot {
            meta: meta.clone(),
            state,
        })
        .await?;
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
                    EntryPayload::Normal(command) => state.table.apply(index, command),
                    EntryPayload::Membership(membership) => {
                        state.membership = StoredMembershipOf::<TypeConfig>::new(
                            Some(entry.log_id),
                            membership.clone(),
                        );
                        CommandResult::None
                    }
                }
            });
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
        let state: AppliedState = serde_json::from_slice(snapshot.get_ref()).map_err(io_err)?;
        self.store_snapshot(&StoredSnapshot {
            meta: meta.clone(),
            state: state.clone(),
        })
        .await?;
        let applied = state.last_applied.as_ref().map_or(0, |id| id.index);
        self.shared.write(|current| *current = state);
        self.shared.changes.send_replace(applied);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Self::SnapshotData>>, io::Error> {
        let Some(bytes) = self.snapshots.get(CURRENT).map_err(io_err)? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = serde_json::from_slice(&bytes).map_err(io_err)?;
        let data = serde_json::to_vec(&stored.state).map_err(io_err)?;
        Ok(Some(SnapshotOf::<TypeConfig, Self::SnapshotData> {
            meta: stored.meta,
            snapshot: Cursor::new(data),
        }))
    }
}
