//! The renewal rule: the one place a grant is extended (renew, a repeated
//! acquire).

use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};

use super::super::state::ApiState;
use crate::leader::lessor::RenewRefused;
use crate::lease_table::command::SecretHash;

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
    state.shared.read(|s| match s.table.leases.get(lease) {
        Some(r)
            if r.holder.as_deref() == Some(holder) && r.token == token && r.opens(presented) =>
        {
            if let Some(by) = &r.preempted_by {
                return Extended::Preempted(by.to_string());
            }
            if r.revoked {
                return Extended::Revoked;
            }
            let ttl = Duration::from_millis(r.ttl_ms);
            let max_hold =
                (r.terms.max_hold_ms > 0).then(|| Duration::from_millis(r.terms.max_hold_ms));
            match state.lessor.renew(lease, token, ttl, max_hold) {
                Ok(()) => Extended::Yes {
                    ttl_ms: r.ttl_ms,
                    grant_index: r.grant_index,
                },
                Err(refused) => Extended::No(refused),
            }
        }
        _ => Extended::NotHeld,
    })
}
