//! Apply of `Acquire`: grant a free lease, let the same client in again,
//! hand a reservation to the one it waits for, or preempt for a higher
//! priority.

use palisade_names::LeaseName;

use super::command::{Ask, CommandResult};
use super::record::LeaseRecord;
use super::table::LeaseTable;

impl LeaseTable {
    /// Applies an acquire of `lease` at `index`, and moves the record's
    /// count to the new grant's principal.
    pub(super) fn acquire(&mut self, index: u64, lease: &LeaseName, ask: &Ask) -> CommandResult {
        let before = self.leases.get(lease).and_then(|r| r.owner.clone());
        let result = self.acquire_record(index, lease, ask);
        let after = self.leases.get(lease).and_then(|r| r.owner.clone());
        self.recount(before, after.as_ref());
        result
    }

    fn acquire_record(&mut self, index: u64, lease: &LeaseName, ask: &Ask) -> CommandResult {
        let record = self
            .leases
            .entry(lease.clone())
            .or_insert_with(|| LeaseRecord::never_granted(index, ask.ttl_ms));
        let Some(current) = record.holder.clone() else {
            return grant_free(record, index, ask);
        };
        if record.reserved_for(ask.holder, ask.principal) {
            record.claim(index, ask.ttl_ms, ask.secret, ask.terms);
            record.owner = ask.principal.map(str::to_owned);
            return CommandResult::Granted {
                token: record.token,
                ttl_ms: ask.ttl_ms,
                new_grant: true,
                grant_index: index,
            };
        }
        // The same client again (a retry, or a holder asking to hold on):
        // the same grant, never a shorter ttl.
        if record.extensible_by(ask.holder, ask.secret.as_ref()) {
            record.ttl_ms = record.ttl_ms.max(ask.ttl_ms);
            record.grant_index = index;
            return CommandResult::Granted {
                token: record.token,
                ttl_ms: record.ttl_ms,
                new_grant: false,
                grant_index: index,
            };
        }
        // A higher priority preempts a preemptible grant: it is revoked (its
        // holder learns it on its next renewal and it ends at its deadline,
        // or sooner by a release).
        if record.preemptible_by(&ask.terms, ask.preempt) {
            record.preempt(index, ask.holder, ask.principal);
            return CommandResult::Preempting {
                holder: current,
                token: record.token,
            };
        }
        CommandResult::Held {
            holder: current,
            token: record.token,
        }
    }
}

/// Grants the free lease of `record`, unless a lock-delay the caller did not
/// wait out still holds it.
fn grant_free(record: &mut LeaseRecord, index: u64, ask: &Ask) -> CommandResult {
    if record.lock_delay_unseen(ask.delay_seen) {
        return CommandResult::LockDelayed;
    }
    record.grant(index, ask.holder, ask.ttl_ms, ask.secret, ask.terms);
    record.owner = ask.principal.map(str::to_owned);
    CommandResult::Granted {
        token: record.token,
        ttl_ms: ask.ttl_ms,
        new_grant: true,
        grant_index: index,
    }
}
