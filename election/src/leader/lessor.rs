//! Lease deadlines, kept by the Raft leader alone (etcd's lessor).
//!
//! - When a node becomes leader ([`Lessor::promote`]) it forgets every deadline;
//!   the next [`Lessor::reconcile`] gives every held lease a full ttl from now,
//!   so failover never expires a lease early.
//! - A follower ([`Lessor::demote`]) tracks nothing and expires nothing.
//! - Grants and renewals set `deadline = now + ttl` on the leader's monotonic
//!   clock, at a moment after the holder sent its request; the holder's own
//!   deadline (send time + ttl - margin) is therefore always earlier.
//! - [`Lessor::reconcile`] returns the grants whose deadline has passed; the
//!   caller proposes an `Expire` for each through Raft. From that moment a
//!   renewal of that grant is refused, even before the `Expire` commits.
//! - [`Lessor::leadership`] tells calls that wait on the leader (blocking
//!   acquires) the moment it stops leading, so they answer 503 at once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};
use tokio::time::Instant;

use crate::lease_table::table::LeaseTable;
use crate::raft::applied::Touched;

/// The most bytes of lease names one `Reclaim` entry carries. A log entry
/// over ~128 KiB would be a sled blob (a file of its own), which the log's
/// background flush can make durable after the record pointing at it: a
/// power cut then leaves the log unreadable (the twelfth session's fault).
/// 1 000 names of 128 bytes would be just that; 48 KiB stays far below.
pub const MAX_RECLAIM_BYTES: usize = 48 * 1024;

/// What a `Reclaim` entry spends per name besides the name (its length and
/// `modify_index`, with room to spare).
const RECLAIM_ENTRY_OVERHEAD: usize = 16;
/// One tracked grant.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    token: FencingToken,
    deadline: Instant,
    /// When this leader started tracking the grant (its start, for
    /// max-hold; a new leader starts it afresh, so a cap only lengthens).
    since: Instant,
    /// When the deadline was last set a full ttl ahead: the grant's start
    /// or takeover by this leader, or its last renewal (`timing.rs`).
    renewed: Instant,
    /// An `Expire` for this grant is being proposed.
    expiring: bool,
    /// The grant is a reservation (a handover's or a preemption's) not yet
    /// claimed. Its claim keeps the token, so the lessor tells the two
    /// apart by this: a claim is tracked afresh with the claimant's ttl.
    reserved: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The term this node leads, if it leads.
    leading: Option<u64>,
    deadlines: HashMap<LeaseName, Tracked>,
    /// When to look at a grant again, earliest first: an entry's time is
    /// never later than its grant's deadline (deadlines only move later,
    /// and every new deadline pushes an entry), so popping the due entries
    /// finds every passed deadline without walking the tracked grants.
    /// Stale entries (a renewed, released or replaced grant) are dropped or
    /// pushed back when popped.
    checks: BinaryHeap<Reverse<(Instant, LeaseName, FencingToken)>>,
    /// Free leases and when this leader saw them freed, with the
    /// `modify_index` of the change that freed them; `freed_order` is the
    /// same in order of that time (stale entries skipped when popped).
    freed: HashMap<LeaseName, (Instant, u64)>,
    freed_order: VecDeque<(Instant, LeaseName, u64)>,
    /// Incremental reconciles since the last full scan of the table.
    since_full_scan: u32,
    /// The next reconcile scans the whole table, whatever its size: set on
    /// promotion, when nothing is tracked yet.
    scan_now: bool,
    /// What the leases held at this leader's takeover get beyond a full
    /// ttl, until the first full scan has tracked them all.
    grace: Duration,
}

/// A full scan of the table at least every this many incremental
/// reconciles (1 s at the 10 ms tick): a safety net, the change feed is
/// complete by construction.
const FULL_SCAN_EVERY: u32 = 100;

/// Incremental reconciles between full scans of a table of `leases`:
/// [`FULL_SCAN_EVERY`] up to 10 000 leases, then one more per 100 leases
/// (10 s at 100 000), so a scan costs the ticks it spaces the same at any
/// size. A full scan holds the lessor, which every renewal needs, for its
/// whole length: at 100 000 leases once a second, it stalled renewals for
/// about 100 ms each time (p99.9 80-106 ms against 5 ms empty).
fn full_scan_every(leases: usize) -> u32 {
    u32::try_from(leases / 100)
        .unwrap_or(u32::MAX)
        .max(FULL_SCAN_EVERY)
}

/// The most grants one reconcile marks expiring (the duties reconcile every
/// 10 ms: at most 10 000 `Expire` proposals a second). A new leader gives
/// every held lease a full ttl at the same instant, so leases whose holders
/// are gone all fall due together: unbounded, that is one proposal per
/// lease in one tick, a burst that delays everyone else's calls (etcd caps
/// its revocations the same way). The rest stay due and go out in the next
/// ticks; their renewals are refused meanwhile, their deadline having
/// passed, so the cap delays only when they are free again.
pub const MAX_EXPIRIES_PER_RECONCILE: usize = 100;

/// Why a renewal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewRefused {
    /// This node is not the leader (any more).
    NotLeader,
    /// The grant's deadline has passed; it is being expired.
    Expired,
    /// Renewing would hold the grant past its max-hold.
    MaxHold,
}

/// The leader's deadlines for held leases.
#[derive(Debug, Default)]
pub struct Lessor {
    state: Mutex<State>,
    /// Added to the full ttl a new leader gives the leases it finds held
    /// (`Lessor::with_takeover_grace`).
    takeover_grace: Duration,
    /// The term this node leads (`None`: it does not), as
    /// [`Lessor::promote`] and [`Lessor::demote`] last set it.
    leadership: tokio::sync::watch::Sender<Option<u64>>,
}

impl State {
    /// Tracks `lease`'s grant `token` with a deadline `ttl` from `now`.
    fn track(
        &mut self,
        lease: &LeaseName,
        token: FencingToken,
        now: Instant,
        ttl: Duration,
        reserved: bool,
    ) {
        let deadline = now + ttl;
        self.deadlines.insert(
            lease.clone(),
            Tracked {
                token,
                deadline,
                since: now,
                renewed: now,
                expiring: false,
                reserved,
            },
        );
        self.checks.push(Reverse((deadline, lease.clone(), token)));
    }

    /// Notes that `lease` is free since `modify_index` (a no-op if already
    /// noted for that change).
    fn note_free(&mut self, lease: &LeaseName, modify_index: u64, now: Instant) {
        if self
            .freed
            .get(lease)
            .is_some_and(|(_, m)| *m == modify_index)
        {
            return;
        }
        self.freed.insert(lease.clone(), (now, modify_index));
        self.freed_order
            .push_back((now, lease.clone(), modify_index));
    }

    /// Drops check entries of grants no longer tracked once they outnumber
    /// the tracked grants by far (renewals only move deadlines later, so
    /// entries pile up only under churn of grants).
    fn compact(&mut self) {
        if self.checks.len() > 2 * self.deadlines.len() + 1024 {
            let deadlines = &self.deadlines;
            self.checks.retain(|Reverse((_, lease, token))| {
                deadlines.get(lease).is_some_and(|t| t.token == *token)
            });
        }
    }
}

impl Lessor {
    /// A lessor whose new leader gives the leases it finds held a full ttl
    /// *and* `grace` from its takeover (etcd's `lessor.Promote` adds its
    /// election timeout the same way). Renewals are answered on the leader
    /// lease (`raft::lease`), which a voter keeps only in memory: one that
    /// restarts can vote at once (openraft's own TODO), so a new leader may
    /// take over before the old leader's lease has passed; the grace (at
    /// least that lease) keeps every deadline the old leader gave short of
    /// the new leader's.
    pub fn with_takeover_grace(grace: Duration) -> Self {
        Self {
            takeover_grace: grace,
            ..Self::default()
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        palisade_plumbing::sync::lock(&self.state)
    }

    /// This node leads `term`: start over, every held lease gets a full ttl at
    /// the next reconcile.
    pub fn promote(&self, term: u64) {
        let mut state = self.state();
        if state.leading != Some(term) {
            state.leading = Some(term);
            state.deadlines.clear();
            state.checks.clear();
            state.freed.clear();
            state.freed_order.clear();
            // The next reconcile scans the whole table: until it does,
            // no lease of this term can expire.
            state.scan_now = true;
            state.grace = self.takeover_grace;
        }
        drop(state);
        self.leadership
            .send_if_modified(|led| led.replace(term) != Some(term));
    }

    /// This node does not lead: track nothing.
    pub fn demote(&self) {
        let mut state = self.state();
        state.leading = None;
        state.deadlines.clear();
        state.checks.clear();
        state.freed = HashMap::new();
        state.freed_order = VecDeque::new();
        drop(state);
        self.leadership.send_if_modified(|led| led.take().is_some());
    }

    /// Follows the term this node leads (`None`: it does not).
    pub fn leadership(&self) -> tokio::sync::watch::Receiver<Option<u64>> {
        self.leadership.subscribe()
    }

    /// The term this node leads, if any.
    pub fn leading(&self) -> Option<u64> {
        self.state().leading
    }

    /// A new grant was committed: its deadline is now + ttl. (A repeated
    /// acquire by the holder goes through [`Lessor::renew`], so it cannot
    /// revive a grant whose deadline has passed.)
    pub fn track_grant(&self, lease: &LeaseName, token: FencingToken, ttl: Duration) {
        let mut state = self.state();
        if state.leading.is_some() {
            state.track(lease, token, Instant::now(), ttl, false);
        }
    }

    /// Whether the lessor tracks `lease`'s grant `token` as an unclaimed
    /// reservation (what an `Expire` of it says, so that a claim committed
    /// first is left alone).
    pub fn is_reservation(&self, lease: &LeaseName, token: FencingToken) -> bool {
        self.state()
            .deadlines
            .get(lease)
            .is_some_and(|t| t.token == token && t.reserved)
    }

    /// Extends the deadline of `lease`'s grant `token` to now + ttl, unless
    /// it has already passed. The caller has checked, after confirming
    /// leadership with a quorum, that the table shows this grant.
    ///
    /// # Errors
    /// [`RenewRefused`].
    /// With `max_hold`, a renewal that would hold the grant past that long
    /// after it started is refused (the grant then ends at its deadline).
    pub fn renew(
        &self,
        lease: &LeaseName,
        token: FencingToken,
        ttl: Duration,
        max_hold: Option<Duration>,
    ) -> Result<(), RenewRefused> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Err(RenewRefused::NotLeader);
        }
        let now = Instant::now();
        match state.deadlines.get_mut(lease) {
            Some(tracked) if tracked.token == token => {
                if tracked.expiring || tracked.deadline <= now {
                    return Err(RenewRefused::Expired);
                }
                if max_hold.is_some_and(|max| now + ttl > tracked.since + max) {
                    return Err(RenewRefused::MaxHold);
                }
                let earlier = now + ttl < tracked.deadline;
                tracked.deadline = now + ttl;
                tracked.renewed = now;
                if earlier {
                    // Check entries must not be later than the deadline.
                    state
                        .checks
                        .push(Reverse((now + ttl, lease.clone(), token)));
                }
            }
            // Not tracked yet (fresh leader, or a grant committed by an
            // earlier leader): a full ttl from now, and the takeover's grace
            // before the first scan, as reconcile would give.
            _ => {
                let grace = state.grace;
                state.track(lease, token, now, ttl + grace, false)
            }
        }
        Ok(())
    }

    /// How long `lease`, freed by the change at `modify_index` from a grant
    /// with a lock-delay of `delay`, must stay free yet: `delay` after this
    /// leader first saw it free (a new leader waits the whole delay again,
    /// so failover only lengthens it).
    pub fn lock_delay_left(
        &self,
        lease: &LeaseName,
        modify_index: u64,
        delay: Duration,
    ) -> Duration {
        let mut state = self.state();
        let now = Instant::now();
        state.note_free(lease, modify_index, now);
        let since = state.freed.get(lease).map_or(now, |(since, _)| *since);
        (since + delay).saturating_duration_since(now)
    }

    /// As [`Lessor::reconcile`], looking only at the leases `touched` names
    /// (what applies changed since the last call) instead of the whole
    /// table — O(changes + tracked) rather than O(table) every tick. Scans
    /// the whole table when `touched.all`, after a promotion (nothing is
    /// tracked yet), and every [`FULL_SCAN_EVERY`] calls.
    pub fn reconcile_changes(
        &self,
        table: &LeaseTable,
        touched: &Touched,
    ) -> Vec<(LeaseName, FencingToken)> {
        let full = {
            let mut state = self.state();
            if state.leading.is_none() {
                return Vec::new();
            }
            state.since_full_scan = state.since_full_scan.saturating_add(1);
            touched.all
                || state.scan_now
                || state.since_full_scan >= full_scan_every(table.leases.len())
        };
        if full {
            return self.reconcile(table);
        }
        let mut state = self.state();
        let now = Instant::now();
        for lease in &touched.names {
            match table.leases.get(lease) {
                Some(record) if record.holder.is_some() => {
                    // A claimed reservation keeps its token: it is a new
                    // grant all the same.
                    let current = state
                        .deadlines
                        .get(lease)
                        .is_some_and(|t| t.token == record.token && t.reserved == record.reserved);
                    if !current {
                        let ttl = Duration::from_millis(record.ttl_ms);
                        state.track(lease, record.token, now, ttl, record.reserved);
                    }
                }
                Some(record) => {
                    state.deadlines.remove(lease);
                    state.note_free(lease, record.modify_index, now);
                }
                None => {
                    state.deadlines.remove(lease);
                }
            }
            if table.leases.get(lease).is_some_and(|r| r.holder.is_some()) {
                state.freed.remove(lease);
            }
        }
        Self::due(&mut state, now)
    }

    /// Brings the tracked grants in line with `table` and returns the grants
    /// whose deadline has passed, marking them as expiring. Returns nothing on
    /// a follower.
    pub fn reconcile(&self, table: &LeaseTable) -> Vec<(LeaseName, FencingToken)> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Vec::new();
        }
        state.since_full_scan = 0;
        state.scan_now = false;
        let grace = std::mem::take(&mut state.grace);
        let now = Instant::now();
        state.deadlines.retain(|lease, tracked| {
            table.leases.get(lease).is_some_and(|r| {
                r.holder.is_some() && r.token == tracked.token && r.reserved == tracked.reserved
            })
        });
        state.freed.retain(|lease, (_, m)| {
            table
                .leases
                .get(lease)
                .is_some_and(|r| r.holder.is_none() && r.modify_index == *m)
        });
        let mut freed = Vec::new();
        for (lease, record) in &table.leases {
            if record.holder.is_none() {
                let known = state.freed.get(lease).map(|(_, m)| *m);
                if known != Some(record.modify_index) {
                    freed.push((reclaim::free_since(record, now), lease, record.modify_index));
                }
            } else if !state.deadlines.contains_key(lease) {
                let ttl = Duration::from_millis(record.ttl_ms) + grace;
                state.track(lease, record.token, now, ttl, record.reserved);
            }
        }
        // Oldest first: the reclaim queue is in order of time.
        freed.sort_unstable_by_key(|(since, _, _)| *since);
        for (since, lease, modify_index) in freed {
            state.note_free(lease, modify_index, since);
        }
        state.compact();
        Self::due(&mut state, now)
    }

    /// The tracked grants whose deadline has passed, marked as expiring:
    /// O(due entries · log n), not O(tracked).
    fn due(state: &mut State, now: Instant) -> Vec<(LeaseName, FencingToken)> {
        let mut expired = Vec::new();
        let mut later = Vec::new();
        while let Some(Reverse((at, _, _))) = state.checks.peek() {
            if *at > now || expired.len() >= MAX_EXPIRIES_PER_RECONCILE {
                break;
            }
            let Some(Reverse((_, lease, token))) = state.checks.pop() else {
                break;
            };
            match state.deadlines.get_mut(&lease) {
                Some(tracked) if tracked.token == token && !tracked.expiring => {
                    if tracked.deadline <= now {
                        tracked.expiring = true;
                        expired.push((lease, token));
                    } else {
                        // Renewed since this entry was pushed.
                        later.push(Reverse((tracked.deadline, lease, token)));
                    }
                }
                // Released, replaced by a newer grant, or already expiring.
                _ => {}
            }
        }
        state.checks.extend(later);
        state.compact();
        expired
    }

    /// The `Expire` for `lease`/`token` could not be committed (leadership
    /// lost, no quorum): let the next reconcile try again.
    pub fn expire_failed(&self, lease: &LeaseName, token: FencingToken) {
        let mut state = self.state();
        if let Some(tracked) = state.deadlines.get_mut(lease) {
            if tracked.token == token {
                tracked.expiring = false;
                let deadline = tracked.deadline;
                state.checks.push(Reverse((deadline, lease.clone(), token)));
            }
        }
    }
}

mod reclaim;
#[cfg(test)]
mod tests;
mod timing;
