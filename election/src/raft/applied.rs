//! The applied state — the lease table and membership as of the last
//! applied entry — and [`SharedState`], through which the API, the lessor
//! and watchers read it and learn of changes.

use std::sync::{Arc, Mutex, RwLock};

use openraft::alias::{LogIdOf, StoredMembershipOf};
use palisade_plumbing::sync::{lock, read, write};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::feed::Feed;
use super::types::TypeConfig;
use crate::lease_table::table::LeaseTable;
use crate::metrics::ElectionMetrics;
use crate::waiters::Bells;

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
    touched: Arc<Mutex<Touched>>,
    /// Per-lease wakeups (and acquire queues): apply rings the leases it
    /// changes, so a waiter wakes only for its own lease.
    pub bells: Arc<Bells>,
    /// The node's metrics, handed in by the node (`ApiState::metrics`):
    /// apply counts grants, releases, expiries... into them.
    pub metrics: Arc<ElectionMetrics>,
    /// Every change to a lease record, for the prefix watches.
    pub feed: Feed,
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
    /// The shared state of a state machine opened with `state`, whose last
    /// applied index `changes` carries, counting into the node's `metrics`.
    pub(super) fn new(
        state: AppliedState,
        changes: watch::Sender<u64>,
        metrics: Arc<ElectionMetrics>,
    ) -> Self {
        Self {
            state: Arc::new(RwLock::new(state)),
            changes,
            touched: Arc::new(Mutex::new(Touched {
                all: true,
                names: Vec::new(),
            })),
            bells: Arc::default(),
            metrics,
            feed: Feed::default(),
        }
    }

    /// The leases changed since the last call (everything, the first time).
    pub fn take_touched(&self) -> Touched {
        std::mem::take(&mut *lock(&self.touched))
    }

    pub(super) fn touch(&self, lease: Option<&palisade_names::LeaseName>) {
        let mut touched = lock(&self.touched);
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
        f(&read(&self.state))
    }

    pub(super) fn write<T>(&self, f: impl FnOnce(&mut AppliedState) -> T) -> T {
        f(&mut write(&self.state))
    }
}
