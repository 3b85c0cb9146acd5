//! Reclaiming free lease records: which are due, and since when a record a
//! new leader finds free counts as free.

use std::collections::VecDeque;
use std::time::Duration;

use palisade_names::LeaseName;
use tokio::time::Instant;

use super::{Lessor, MAX_RECLAIM_BYTES, RECLAIM_ENTRY_OVERHEAD};
use crate::lease_table::record::LeaseRecord;
use crate::lease_table::table::LeaseTable;

/// Since when a leader that finds `record` free (`now`, a full scan) counts
/// it as free, for its reclaim: since the wall-clock stamp of the change
/// that freed it, as far back as this clock goes. Before, each new leader
/// counted from its own first look, so under leader changes more frequent
/// than `reclaim_after` nothing was ever reclaimed and the table grew
/// without end (the one-hour soak's growing memory, disk and snapshots).
///
/// A skewed clock only moves when a free name is forgotten (its history
/// and its count in its owner's quota). A record held back by a lock-delay
/// counts from `now`: a new leader waits the whole delay again, and the
/// delay is measured from the same time.
pub(super) fn free_since(record: &LeaseRecord, now: Instant) -> Instant {
    if record.lock_delayed {
        return now;
    }
    let Some(freed_ms) = record.history.back().and_then(|t| t.at_ms) else {
        return now;
    };
    let age = crate::signing::unix_ms().saturating_sub(freed_ms);
    now.checked_sub(Duration::from_millis(age)).unwrap_or(now)
}

impl Lessor {
    /// Up to `max` leases free since at least `after` ago (on this leader's
    /// clock), each with the `modify_index` that freed it, for a `Reclaim`,
    /// their names at most [`MAX_RECLAIM_BYTES`] in all (the rest wait for
    /// the next batch). Each is handed out once; one whose `Reclaim` did
    /// not commit is found again by the next full scan and waits `after`
    /// again.
    pub fn reclaimable(
        &self,
        table: &LeaseTable,
        after: Duration,
        max: usize,
    ) -> Vec<(LeaseName, u64)> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut out = Vec::new();
        let mut bytes = 0;
        while out.len() < max {
            match state.freed_order.front() {
                Some((at, _, _)) if *at + after <= now => {}
                _ => break,
            }
            let Some((at, lease, modify_index)) = state.freed_order.pop_front() else {
                break;
            };
            if state.freed.get(&lease) != Some(&(at, modify_index)) {
                continue; // superseded by a later change
            }
            let size = lease.as_str().len() + RECLAIM_ENTRY_OVERHEAD;
            if bytes + size > MAX_RECLAIM_BYTES {
                state.freed_order.push_front((at, lease, modify_index));
                break;
            }
            state.freed.remove(&lease);
            let still_free = table
                .leases
                .get(&lease)
                .is_some_and(|r| r.holder.is_none() && r.modify_index == modify_index)
                // Forgetting a lease would end its lock-delay early.
                && !table.leases.get(&lease).is_some_and(|r| {
                    r.lock_delayed && at + Duration::from_millis(r.terms.lock_delay_ms) > now
                });
            if still_free {
                bytes += size;
                out.push((lease, modify_index));
            }
        }
        if state.freed_order.len() > 2 * state.freed.len() + 1024 {
            let freed = &state.freed;
            let kept: VecDeque<_> = state
                .freed_order
                .iter()
                .filter(|(at, lease, m)| freed.get(lease) == Some(&(*at, *m)))
                .cloned()
                .collect();
            state.freed_order = kept;
        }
        out
    }
}
