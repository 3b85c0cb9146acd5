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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};
use tokio::time::Instant;

use crate::lease_table::LeaseTable;

/// One tracked grant.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    token: FencingToken,
    deadline: Instant,
    /// An `Expire` for this grant is being proposed.
    expiring: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The term this node leads, if it leads.
    leading: Option<u64>,
    deadlines: HashMap<LeaseName, Tracked>,
}

/// Why a renewal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewRefused {
    /// This node is not the leader (any more).
    NotLeader,
    /// The grant's deadline has passed; it is being expired.
    Expired,
}

/// The leader's deadlines for held leases.
#[derive(Debug, Default)]
pub struct Lessor {
    state: Mutex<State>,
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
        }
    }

    /// This node does not lead: track nothing.
    pub fn demote(&self) {
        let mut state = self.state();
        state.leading = None;
        state.deadlines.clear();
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
            state.deadlines.insert(
                lease.clone(),
                Tracked {
                    token,
                    deadline: Instant::now() + ttl,
                    expiring: false,
                },
            );
        }
    }

    /// Extends the deadline of `lease`'s grant `token` to now + ttl, unless
    /// it has already passed. The caller has checked, after confirming
    /// leadership with a quorum, that the table shows this grant.
    ///
    /// # Errors
    /// [`RenewRefused`].
    pub fn renew(
        &self,
        lease: &LeaseName,
        token: FencingToken,
        ttl: Duration,
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
                tracked.deadline = now + ttl;
            }
            // Not tracked yet (fresh leader, or a grant committed by an
            // earlier leader): a full ttl from now, as reconcile would give.
            _ => {
                state.deadlines.insert(
                    lease.clone(),
                    Tracked {
                        token,
                        deadline: now + ttl,
                        expiring: false,
                    },
                );
            }
        }
        Ok(())
    }

    /// Brings the tracked grants in line with `table` and returns the grants
    /// whose deadline has passed, marking them as expiring. Returns nothing on
    /// a follower.
    pub fn reconcile(&self, table: &LeaseTable) -> Vec<(LeaseName, FencingToken)> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Vec::new();
        }
        let now = Instant::now();
        state.deadlines.retain(|lease, tracked| {
            table
                .leases
                .get(lease)
                .is_some_and(|r| r.holder.is_some() && r.token == tracked.token)
        });
        for (lease, record) in &table.leases {
            if record.holder.is_some() && !state.deadlines.contains_key(lease) {
                state.deadlines.insert(
                    lease.clone(),
                    Tracked {
                        token: record.token,
                        deadline: now + Duration::from_millis(record.ttl_ms),
                        expiring: false,
                    },
                );
            }
        }
        let mut expired = Vec::new();
        for (lease, tracked) in &mut state.deadlines {
            if !tracked.expiring && tracked.deadline <= now {
                tracked.expiring = true;
                expired.push((lease.clone(), tracked.token));
            }
        }
        expired
    }

    /// The `Expire` for `lease`/`token` could not be committed (leadership
    /// lost, no quorum): let the next reconcile try again.
    pub fn expire_failed(&self, lease: &LeaseName, token: FencingToken) {
        if let Some(tracked) = self.state().deadlines.get_mut(lease) {
            if tracked.token == token {
                tracked.expiring = false;
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
    use crate::command::Command;

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
            },
        );
        table
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
            lessor.renew(&name("a"), FencingToken(7), Duration::from_millis(1000)),
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
                .renew(&name("a"), FencingToken(3), Duration::from_millis(1000))
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
            lessor.renew(&name("a"), FencingToken(3), Duration::from_millis(1000)),
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
