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
    /// left.
    Lease {
        index: u64,
        lease: LeaseName,
        record: Box<LeaseRecord>,
    },
    /// The entry at `index` (a `Reclaim`) removed these records.
    Reclaimed { index: u64, leases: Vec<LeaseName> },
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
/// table are one change, all at `index`.
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
                record: Box::new(record.clone()),
            });
        }
    }
    let mut leases = reclaimable;
    leases.retain(|lease| !table.leases.contains_key(lease));
    if !leases.is_empty() {
        changes.push(Change::Reclaimed { index, leases });
    }
    changes
}

#[cfg(test)]
mod tests {
    use palisade_names::FencingToken;

    use super::*;

    fn name(lease: &str) -> LeaseName {
        LeaseName::new(lease).expect("lease name")
    }

    /// Acquires `lease` at `index`, then releases it at `index + 1`.
    fn use_once(table: &mut LeaseTable, lease: &str, index: u64) {
        let acquire = Command::Acquire {
            lease: name(lease),
            holder: "w".into(),
            ttl_ms: 1000,
            secret: None,
            terms: Default::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        };
        table.apply(index, &acquire);
        let release = Command::Release {
            lease: name(lease),
            holder: "w".into(),
            token: FencingToken(index),
            grant_index: None,
            secret: None,
        };
        table.apply(index + 1, &release);
    }

    #[test]
    fn a_change_is_what_an_entry_did_and_a_reclaim_is_one_change_of_every_record_it_removed() {
        let mut table = LeaseTable::default();
        use_once(&mut table, "jobs.a", 1);
        use_once(&mut table, "jobs.b", 3);
        let acquire = Command::Acquire {
            lease: name("jobs.a"),
            holder: "w".into(),
            ttl_ms: 1000,
            secret: None,
            terms: Default::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        }
        .stamped(5);
        table.apply(5, &acquire);
        let made = changes(5, &table, &acquire, reclaimable(&table, &acquire));
        assert!(
            matches!(&made[..], [Change::Lease { index: 5, lease, record }]
                if lease.as_str() == "jobs.a" && record.holder.is_some()),
            "{made:?}"
        );
        // A second acquire by another holder changes nothing: no change.
        let refused = Command::Acquire {
            lease: name("jobs.a"),
            holder: "other".into(),
            ttl_ms: 1000,
            secret: None,
            terms: Default::default(),
            preempt: false,
            delay_seen: None,
            principal: None,
        };
        table.apply(6, &refused);
        assert!(changes(6, &table, &refused, Vec::new()).is_empty());
        // jobs.a is held again (not reclaimed), x never existed.
        let reclaim = Command::Reclaim {
            leases: vec![(name("jobs.a"), 2), (name("jobs.b"), 4), (name("x"), 1)],
        };
        let before = reclaimable(&table, &reclaim);
        table.apply(7, &reclaim);
        let made = changes(7, &table, &reclaim, before);
        assert!(
            matches!(&made[..], [Change::Reclaimed { index: 7, leases }]
                if *leases == vec![name("jobs.b")]),
            "{made:?}"
        );
    }
}
