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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};
use tokio::time::Instant;

use crate::lease_table::LeaseTable;
use crate::state_machine::Touched;

/// One tracked grant.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    token: FencingToken,
    deadline: Instant,
    /// When this leader started tracking the grant (its start, for
    /// max-hold; a new leader starts it afresh, so a cap only lengthens).
    since: Instant,
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
}

/// A full scan of the table at least every this many incremental
/// reconciles (1 s at the 10 ms tick): a safety net, the change feed is
/// complete by construction.
const FULL_SCAN_EVERY: u32 = 100;

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
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            // The next reconcile scans the whole table.
            state.since_full_scan = FULL_SCAN_EVERY;
        }
    }

    /// This node does not lead: track nothing.
    pub fn demote(&self) {
        let mut state = self.state();
        state.leading = None;
        state.deadlines.clear();
        state.checks.clear();
        state.freed = HashMap::new();
        state.freed_order = VecDeque::new();
    }

    /// The term this node leads, if any.
    pub fn leading(&self) -> Option<u64> {
        self.state().leading
    }

    /// A new grant was committed: its deadline is now + ttl. (A repeated
    /// acquire by the holder goes through [`Lessor::renew`], so it cannot
    /// revive a grant whose deadline has passed.)
    pub fn granted(&self, lease: &LeaseName, token: FencingToken, ttl: Duration) {
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
                if earlier {
                    // Check entries must not be later than the deadline.
                    state
                        .checks
                        .push(Reverse((now + ttl, lease.clone(), token)));
                }
            }
            // Not tracked yet (fresh leader, or a grant committed by an
            // earlier leader): a full ttl from now, as reconcile would give.
            _ => state.track(lease, token, now, ttl, false),
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
            state.since_full_scan += 1;
            touched.all || state.since_full_scan >= FULL_SCAN_EVERY
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
        for (lease, record) in &table.leases {
            if record.holder.is_none() {
                state.note_free(lease, record.modify_index, now);
            } else if !state.deadlines.contains_key(lease) {
                let ttl = Duration::from_millis(record.ttl_ms);
                state.track(lease, record.token, now, ttl, record.reserved);
            }
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
            if *at > now {
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

    /// Up to `max` leases free since at least `after` ago (on this leader's
    /// clock), each with the `modify_index` that freed it, for a `Reclaim`.
    /// Each is handed out once; one whose `Reclaim` did not commit is found
    /// again by the next full scan and waits `after` again.
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

    /// Milliseconds until `lease`'s grant `token` expires, as the leader sees
    /// it; `None` on a follower or for an untracked grant.
    pub fn remaining_ms(&self, lease: &LeaseName, token: FencingToken) -> Option<u64> {
        let state = self.state();
        state.leading?;
        let tracked = state.deadlines.get(lease).filter(|t| t.token == token)?;
        Some(
            tracked
                .deadline
                .saturating_duration_since(Instant::now())
                .as_millis() as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Terms};

    fn name(lease: &str) -> LeaseName {
        LeaseName::new(lease).expect("lease name")
    }

    fn table_with(lease: &str, holder: &str, index: u64, ttl_ms: u64) -> LeaseTable {
        let mut table = LeaseTable::default();
        table.apply(
            index,
            &Command::Acquire {
                lease: name(lease),
                holder: holder.into(),
                ttl_ms,
                secret: None,
                terms: Terms::default(),
                preempt: false,
                delay_seen: None,
            },
        );
        table
    }

    fn touched(names: &[&str]) -> Touched {
        Touched {
            all: false,
            names: names.iter().map(|n| name(n)).collect(),
        }
    }

    /// A reservation (unclaimed handover) is tracked as one; its claim keeps
    /// the token but is tracked afresh with the claimant's ttl, so an
    /// `Expire` already due for the reservation is not proposed for the
    /// claim, and one in flight says `unclaimed` (and misses the claim).
    #[tokio::test(start_paused = true)]
    async fn a_claimed_reservation_is_tracked_afresh() {
        let lessor = Lessor::default();
        lessor.promote(1);
        let mut table = table_with("a", "x", 5, 60_000);
        if let Some(record) = table.leases.get_mut(&name("a")) {
            record.token = FencingToken(6);
            record.reserved = true;
            record.ttl_ms = 1000;
        }
        let _ = lessor.reconcile(&table);
        assert!(lessor.is_reservation(&name("a"), FencingToken(6)));
        tokio::time::advance(Duration::from_millis(1001)).await;
        // Due: the Expire goes out for the unclaimed reservation...
        let due = lessor.reconcile_changes(&table, &touched(&[]));
        assert_eq!(due, vec![(name("a"), FencingToken(6))]);
        assert!(lessor.is_reservation(&name("a"), FencingToken(6)));
        // ...and the claim commits first (same token, 3 s ttl).
        if let Some(record) = table.leases.get_mut(&name("a")) {
            record.reserved = false;
            record.ttl_ms = 3000;
        }
        assert!(lessor
            .reconcile_changes(&table, &touched(&["a"]))
            .is_empty());
        assert!(!lessor.is_reservation(&name("a"), FencingToken(6)));
        // The Expire did not apply (it was for the reservation): re-armed,
        // the claim's own deadline holds.
        lessor.expire_failed(&name("a"), FencingToken(6));
        assert!(lessor.reconcile_changes(&table, &touched(&[])).is_empty());
        assert!(lessor
            .renew(&name("a"), FencingToken(6), Duration::from_secs(3), None)
            .is_ok());
        tokio::time::advance(Duration::from_millis(3001)).await;
        assert_eq!(
            lessor.reconcile_changes(&table, &touched(&[])),
            vec![(name("a"), FencingToken(6))]
        );
        assert!(!lessor.is_reservation(&name("a"), FencingToken(6)));
    }

    /// Between full scans the lessor looks only at the leases applies
    /// touched: a grant it was told about is tracked and expires, a release
    /// it was told about is dropped, and an untold change waits for the
    /// periodic full scan (which the change feed makes unnecessary).
    #[tokio::test(start_paused = true)]
    async fn incremental_reconciles_follow_the_touched_leases() {
        let lessor = Lessor::default();
        lessor.promote(1);
        let empty = LeaseTable::default();
        assert!(
            lessor.reconcile_changes(&empty, &touched(&[])).is_empty(),
            "full scan after promotion"
        );
        let table = table_with("a", "h", 7, 1000);
        assert!(lessor
            .reconcile_changes(&table, &touched(&["a"]))
            .is_empty());
        assert!(
            lessor.remaining_ms(&name("a"), FencingToken(7)).is_some(),
            "tracked"
        );
        // "b" is granted, but nobody says so: not tracked until a full scan.
        let mut both = table.clone();
        both.apply(
            8,
            &Command::Acquire {
                lease: name("b"),
                holder: "h".into(),
                ttl_ms: 1000,
                secret: None,
                terms: Terms::default(),
                preempt: false,
                delay_seen: None,
            },
        );
        assert!(lessor.reconcile_changes(&both, &touched(&[])).is_empty());
        assert!(lessor.remaining_ms(&name("b"), FencingToken(8)).is_none());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            lessor.reconcile_changes(&both, &touched(&[])),
            vec![(name("a"), FencingToken(7))],
            "the touched grant expires"
        );
        for _ in 0..FULL_SCAN_EVERY {
            let _ = lessor.reconcile_changes(&both, &touched(&[]));
        }
        assert!(
            lessor.remaining_ms(&name("b"), FencingToken(8)).is_some(),
            "the full scan found b"
        );
        // A release it is told about drops the grant at once.
        let mut released = both.clone();
        released.leases.remove(&name("b"));
        assert!(lessor
            .reconcile_changes(&released, &touched(&["b"]))
            .is_empty());
        assert!(lessor.remaining_ms(&name("b"), FencingToken(8)).is_none());
        // A follower tracks nothing, whatever it is told.
        lessor.demote();
        assert!(lessor
            .reconcile_changes(
                &both,
                &Touched {
                    all: true,
                    names: Vec::new()
                }
            )
            .is_empty());
    }

    fn table_of(held: &HashMap<LeaseName, (FencingToken, tokio::time::Instant)>) -> LeaseTable {
        let mut table = LeaseTable::default();
        for (lease, (token, _)) in held {
            table.leases.insert(
                lease.clone(),
                crate::lease_table::LeaseRecord {
                    holder: Some("h".into()),
                    token: *token,
                    ttl_ms: 1000,
                    transitions: 1,
                    modify_index: token.0,
                    grant_index: token.0,
                    secret: None,
                    revoked: false,
                    terms: Terms::default(),
                    reserved: false,
                    preempted_by: None,
                    lock_delayed: false,
                },
            );
        }
        table
    }

    /// The deadline-ordered checks find exactly the passed deadlines, as a
    /// walk over every tracked grant would, through grants, renewals with
    /// varied ttls, releases and newer grants.
    #[tokio::test(start_paused = true)]
    async fn due_grants_match_a_full_walk() {
        let lessor = Lessor::default();
        lessor.promote(1);
        let mut expected: HashMap<LeaseName, (FencingToken, tokio::time::Instant)> = HashMap::new();
        let mut next_token = 1;
        let mut seed = 7u64;
        let mut random = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _round in 0..200 {
            for _ in 0..20 {
                let lease = name(&format!("l{}", random(300)));
                let ttl = Duration::from_millis(50 + random(500));
                let now = tokio::time::Instant::now();
                match expected.get(&lease).copied() {
                    Some((token, deadline)) if deadline > now && random(2) == 0 => {
                        lessor.renew(&lease, token, ttl, None).expect("renew");
                        expected.insert(lease, (token, now + ttl));
                    }
                    Some((token, deadline)) if deadline > now => {
                        // Released: the feed tells the lessor.
                        let _ = token;
                        expected.remove(&lease);
                        let table = table_of(&expected);
                        let _ = lessor.reconcile_changes(&table, &touched(&[lease.as_str()]));
                    }
                    Some(_) => {}
                    None => {
                        next_token += 1;
                        lessor.granted(&lease, FencingToken(next_token), ttl);
                        expected.insert(lease, (FencingToken(next_token), now + ttl));
                    }
                }
            }
            tokio::time::advance(Duration::from_millis(random(60))).await;
            let now = tokio::time::Instant::now();
            let mut due = lessor.reconcile_changes(&table_of(&expected), &touched(&[]));
            due.sort();
            let mut want: Vec<_> = expected
                .iter()
                .filter(|(_, (_, deadline))| *deadline <= now)
                .map(|(lease, (token, _))| (lease.clone(), *token))
                .collect();
            want.sort();
            assert_eq!(due, want);
            for (lease, _) in want {
                expected.remove(&lease);
                // The Expire applied: the feed drops it.
                let table = table_of(&expected);
                let _ = lessor.reconcile_changes(&table, &touched(&[lease.as_str()]));
            }
        }
    }

    /// A lease freed (release or expiry, through the feed) is handed out for
    /// reclaiming once `after` has passed, once; one granted again in
    /// between, or changed since, is not.
    #[tokio::test(start_paused = true)]
    async fn free_leases_are_reclaimable_after_the_delay() {
        let after = Duration::from_secs(60);
        let lessor = Lessor::default();
        lessor.promote(1);
        let mut table = table_with("a", "x", 3, 1000);
        table.apply(
            4,
            &Command::Acquire {
                lease: name("b"),
                holder: "x".into(),
                ttl_ms: 1000,
                secret: None,
                terms: Terms::default(),
                preempt: false,
                delay_seen: None,
            },
        );
        let _ = lessor.reconcile_changes(&table, &touched(&["a", "b"]));
        for (lease, token, index) in [("a", 3, 5), ("b", 4, 6)] {
            table.apply(
                index,
                &Command::Expire {
                    lease: name(lease),
                    token: FencingToken(token),
                    unclaimed: false,
                },
            );
        }
        let _ = lessor.reconcile_changes(&table, &touched(&["a", "b"]));
        tokio::time::advance(after - Duration::from_millis(1)).await;
        assert!(lessor.reclaimable(&table, after, 10).is_empty(), "not yet");
        // "b" is granted again before the delay ends.
        table.apply(
            7,
            &Command::Acquire {
                lease: name("b"),
                holder: "y".into(),
                ttl_ms: 100_000,
                secret: None,
                terms: Terms::default(),
                preempt: false,
                delay_seen: None,
            },
        );
        let _ = lessor.reconcile_changes(&table, &touched(&["b"]));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(lessor.reclaimable(&table, after, 10), vec![(name("a"), 5)]);
        assert!(
            lessor.reclaimable(&table, after, 10).is_empty(),
            "handed out once"
        );
        // A full scan finds a free lease whose Reclaim never committed; the
        // delay starts again from the scan.
        let _ = lessor.reconcile(&table);
        assert!(lessor.reclaimable(&table, after, 10).is_empty());
        tokio::time::advance(after).await;
        assert_eq!(lessor.reclaimable(&table, after, 10), vec![(name("a"), 5)]);
        // A follower reclaims nothing.
        lessor.demote();
        let _ = lessor.reconcile(&table);
        assert!(lessor.reclaimable(&table, Duration::ZERO, 10).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_expires_after_its_ttl_and_not_before() {
        let lessor = Lessor::default();
        lessor.promote(1);
        let table = table_with("a", "x", 7, 1000);
        lessor.granted(&name("a"), FencingToken(7), Duration::from_millis(1000));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(lessor.reconcile(&table).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(lessor.reconcile(&table), vec![(name("a"), FencingToken(7))]);
        assert!(lessor.reconcile(&table).is_empty(), "proposed once");
        assert_eq!(
            lessor.renew(
                &name("a"),
                FencingToken(7),
                Duration::from_millis(1000),
                None
            ),
            Err(RenewRefused::Expired)
        );
        lessor.expire_failed(&name("a"), FencingToken(7));
        assert_eq!(
            lessor.reconcile(&table),
            vec![(name("a"), FencingToken(7))],
            "retried after a failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_push_the_deadline() {
        let lessor = Lessor::default();
        lessor.promote(1);
        let table = table_with("a", "x", 3, 1000);
        lessor.granted(&name("a"), FencingToken(3), Duration::from_millis(1000));
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(600)).await;
            lessor
                .renew(
                    &name("a"),
                    FencingToken(3),
                    Duration::from_millis(1000),
                    None,
                )
                .expect("renew");
            assert!(lessor.reconcile(&table).is_empty());
        }
        assert_eq!(lessor.remaining_ms(&name("a"), FencingToken(3)), Some(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_gives_every_held_lease_a_full_ttl() {
        let lessor = Lessor::default();
        let table = table_with("a", "x", 3, 1000);
        lessor.promote(1);
        lessor.granted(&name("a"), FencingToken(3), Duration::from_millis(1000));
        tokio::time::advance(Duration::from_millis(900)).await;
        // Leadership moves away and comes back in a later term.
        lessor.demote();
        assert!(
            lessor.reconcile(&table).is_empty(),
            "a follower expires nothing"
        );
        assert_eq!(
            lessor.renew(
                &name("a"),
                FencingToken(3),
                Duration::from_millis(1000),
                None
            ),
            Err(RenewRefused::NotLeader)
        );
        lessor.promote(2);
        assert!(lessor.reconcile(&table).is_empty());
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(
            lessor.reconcile(&table).is_empty(),
            "deadline restarted at promotion"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(lessor.reconcile(&table).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_grant_is_not_expired_by_an_older_deadline() {
        let lessor = Lessor::default();
        lessor.promote(1);
        lessor.granted(&name("a"), FencingToken(3), Duration::from_millis(1000));
        let newer = table_with("a", "y", 9, 5000);
        tokio::time::advance(Duration::from_millis(2000)).await;
        assert!(
            lessor.reconcile(&newer).is_empty(),
            "token 3 is gone, 9 gets its own ttl"
        );
        tokio::time::advance(Duration::from_millis(5000)).await;
        assert_eq!(lessor.reconcile(&newer), vec![(name("a"), FencingToken(9))]);
    }
}
