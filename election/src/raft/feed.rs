//! [`Feed`]: the changes apply makes to lease records, as they happen, for
//! the prefix watches (`api/prefix_watch.rs`). A bounded broadcast: apply
//! never waits for a watcher, and a watcher that falls more than
//! [`FEED_CAPACITY`] changes behind finds out (`Lagged`) instead of making
//! the node buffer for it. Nothing is collected while nobody watches.

use std::sync::Arc;

use palisade_names::LeaseName;
use tokio::sync::broadcast;

use crate::lease_table::command::Command;
use crate::lease_table::record::LeaseRecord;
use crate::lease_table::table::LeaseTable;

/// How many changes the feed keeps for its slowest watcher (each an
/// `Arc`: a record's clone, shared by every watcher).
pub const FEED_CAPACITY: usize = 4096;

/// One change a watcher sees.
#[derive(Debug)]
pub enum Change {
    /// The entry at `index` changed `lease`: `record` is the record it
    /// left, `None` when it removed the record (a reclaim).
    Lease {
        index: u64,
        lease: LeaseName,
        record: Option<Box<LeaseRecord>>,
    },
    /// A snapshot replaced the whole table as of `index`: what changed in
    /// between is not in the feed, look at the table again.
    Reset { index: u64 },
}

/// The sending side, shared by the state machine and the API.
#[derive(Debug, Clone)]
pub struct Feed(broadcast::Sender<Arc<Change>>);

impl Default for Feed {
    fn default() -> Self {
        Self(broadcast::channel(FEED_CAPACITY).0)
    }
}

impl Feed {
    /// A new watcher's receiver: every change sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.0.subscribe()
    }

    /// Whether anyone watches (apply collects nothing otherwise).
    pub fn watched(&self) -> bool {
        self.0.receiver_count() > 0
    }

    /// Sends `changes` (with no watcher, they are dropped).
    pub fn send(&self, changes: Vec<Change>) {
        for change in changes {
            let _ = self.0.send(Arc::new(change));
        }
    }
}

/// Before `command` applies: the records a `Reclaim` may remove that the
/// table holds now (reclaiming an absent name changes nothing).
pub fn reclaimable(table: &LeaseTable, command: &Command) -> Vec<LeaseName> {
    match command.unstamped().1 {
        Command::Reclaim { leases } => leases
            .iter()
            .filter(|(lease, _)| table.leases.contains_key(lease))
            .map(|(lease, _)| lease.clone())
            .collect(),
        _ => Vec::new(),
    }
}

/// After `command` applied at `index`: what it changed. A command that
/// left its lease's record as it was (a refused acquire, a stale expiry)
/// is no change; reclaimed names (`reclaimable` before) that left the
/// table are.
pub fn changes(
    index: u64,
    table: &LeaseTable,
    command: &Command,
    reclaimable: Vec<LeaseName>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    if let Some(lease) = command.lease() {
        if let Some(record) = table.leases.get(lease).filter(|r| r.modify_index == index) {
            changes.push(Change::Lease {
                index,
                lease: lease.clone(),
                record: Some(Box::new(record.clone())),
            });
        }
    }
    for lease in reclaimable {
        if !table.leases.contains_key(&lease) {
            changes.push(Change::Lease {
                index,
                lease,
                record: None,
            });
        }
    }
    changes
}
