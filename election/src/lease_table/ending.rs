//! Apply of the commands that end or mark a grant: `Handover`, `Release`,
//! `Expire`, `Revoke`, and `Reclaim` of leases long free.

use palisade_names::{FencingToken, Holder, LeaseName};

use super::command::{CommandResult, Presented};
use super::table::LeaseTable;

impl LeaseTable {
    /// The holder ends its grant with one reserved for `to`, with the
    /// entry's (higher) token, for `window_ms`.
    pub(super) fn hand_over(
        &mut self,
        index: u64,
        lease: &LeaseName,
        grant: Presented,
        to: (&Holder, Option<&String>),
        window_ms: u64,
    ) -> CommandResult {
        match self.leases.get_mut(lease) {
            Some(record) if record.handed_over_by(grant) => {
                record.reserve(to.0.clone(), to.1.cloned(), index, window_ms);
                CommandResult::HandedOver {
                    token: FencingToken(index),
                }
            }
            _ => CommandResult::Lost,
        }
    }

    /// The holder lets go: the lease is free, or reserved for its preemptor.
    /// A release naming a grant index older than the record's comes from a
    /// handle the holder has since replaced, and frees nothing.
    pub(super) fn release(
        &mut self,
        index: u64,
        lease: &LeaseName,
        grant: Presented,
        grant_index: Option<u64>,
    ) -> CommandResult {
        match self.leases.get_mut(lease) {
            Some(record) if record.releasable_by(grant, grant_index) => {
                if !record.reserve_for_preemptor(index) {
                    record.free(index);
                    record.lock_delayed = false;
                }
                CommandResult::Freed
            }
            _ => CommandResult::Lost,
        }
    }

    /// The leader saw the grant's deadline pass. `unclaimed`: the leader
    /// tracked it as a reservation nobody claimed, so a claim that committed
    /// first is spared.
    pub(super) fn expire(
        &mut self,
        index: u64,
        lease: &LeaseName,
        token: FencingToken,
        unclaimed: bool,
    ) -> CommandResult {
        match self.leases.get_mut(lease) {
            Some(record)
                if record.holder.is_some()
                    && record.token == token
                    && (!unclaimed || record.reserved) =>
            {
                // An unclaimed handover asked for no lock-delay. A preempted
                // grant that ran out goes to its preemptor, unless it asked
                // for a lock-delay: that is kept (the preemptor heads the
                // queue when it ends).
                let delay = !record.reserved && record.terms.lock_delay_ms > 0;
                if delay || !record.reserve_for_preemptor(index) {
                    record.lock_delayed = delay;
                    record.free(index);
                }
                CommandResult::Freed
            }
            _ => CommandResult::Lost,
        }
    }

    /// An operator revokes the grant: never extended again, it ends at its
    /// deadline.
    pub(super) fn revoke(
        &mut self,
        index: u64,
        lease: &LeaseName,
        token: FencingToken,
    ) -> CommandResult {
        match self.leases.get_mut(lease) {
            Some(record) if record.holder.is_some() && record.token == token => {
                record.revoked = true;
                record.modify_index = index;
                CommandResult::Revoked
            }
            _ => CommandResult::Lost,
        }
    }

    /// Forgets leases that are still free and unchanged since the leader
    /// listed them (their tokens keep rising: the next grant's index is
    /// higher anyway).
    pub(super) fn reclaim(&mut self, leases: &[(LeaseName, u64)]) -> CommandResult {
        for (lease, modify_index) in leases {
            if self
                .leases
                .get(lease)
                .is_some_and(|r| r.holder.is_none() && r.modify_index == *modify_index)
            {
                let owner = self.leases.remove(lease).and_then(|r| r.owner);
                self.recount(owner, None);
            }
        }
        CommandResult::None
    }
}
