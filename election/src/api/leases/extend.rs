//! The renewal rule: the one place a grant is extended (renew, a repeated
//! acquire).

use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};

use super::super::state::ApiState;
use crate::leader::lessor::RenewRefused;
use crate::lease_table::command::SecretHash;
use crate::lease_table::record::Extension;

/// How [`extend`] went.
pub(in crate::api) enum Extended {
    Yes {
        ttl_ms: u64,
        grant_index: u64,
    },
    NotHeld,
    /// The grant was revoked: it runs out at its deadline.
    Revoked,
    /// The grant was preempted (by this holder): it runs out at its
    /// deadline.
    Preempted(String),
    No(RenewRefused),
}

/// Extends `holder`'s grant `token` of `lease` by its ttl (a renewal, or a
/// repeated acquire), if `presented` opens it. The table check and the lessor's decision happen in
/// one step under the applied state's read lock, so no `Expire` can apply
/// in between: otherwise the lessor, which stops tracking a grant once the
/// table shows it freed, would start that freed grant afresh and the holder
/// would be told it holds a lease another may be granted next (found by a
/// targeted test under CPU load).
pub(in crate::api) fn extend(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    token: FencingToken,
    presented: Option<&SecretHash>,
) -> Extended {
    state.group(lease).applied.read(|s| {
        let Some(r) = s.table.leases.get(lease) else {
            return Extended::NotHeld;
        };
        match r.extension(holder, Some(token), presented) {
            Extension::Open => {}
            Extension::Preempted(by) => return Extended::Preempted(by.to_string()),
            Extension::Revoked => return Extended::Revoked,
            Extension::NotHeld => return Extended::NotHeld,
        }
        let ttl = Duration::from_millis(r.ttl_ms);
        let max_hold =
            (r.terms.max_hold_ms > 0).then(|| Duration::from_millis(r.terms.max_hold_ms));
        match state.group(lease).lessor.renew(lease, token, ttl, max_hold) {
            Ok(()) => Extended::Yes {
                ttl_ms: r.ttl_ms,
                grant_index: r.grant_index,
            },
            Err(refused) => Extended::No(refused),
        }
    })
}

/// `holder`'s grant `token` of `lease`, if the applied table shows it ended
/// for good — preempted or revoked, which no later entry undoes (a revoked
/// grant is never extended) — as [`extend`] would report it; `None` when it
/// may still be extended, or is unknown here. Committed facts need no
/// quorum round: a preempted holder is told at once, however slow the
/// rounds of a loaded leader are (the fault suite's late preemptions,
/// TESTING.md). "Not held" is not such a fact: a fresh leader may not have
/// applied a grant yet.
pub(in crate::api) fn ended(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    token: FencingToken,
    presented: Option<&SecretHash>,
) -> Option<Extended> {
    state.group(lease).applied.read(|s| {
        match s
            .table
            .leases
            .get(lease)?
            .extension(holder, Some(token), presented)
        {
            Extension::Preempted(by) => Some(Extended::Preempted(by.to_string())),
            Extension::Revoked => Some(Extended::Revoked),
            Extension::Open | Extension::NotHeld => None,
        }
    })
}
