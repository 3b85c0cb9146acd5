//! Waiting acquires: whose turn it is when a lease frees, waiting for it,
//! the lock-delay, and who a waiter is told holds the lease when its wait
//! ends.

use std::time::Duration;

use palisade_names::{FencingToken, LeaseName};

use super::super::state::ApiState;
use crate::error::ApiError;
use crate::lease_table::record::LeaseRecord;
use crate::waiters::Bell;

pub(in crate::api) fn is_free(state: &ApiState, lease: &LeaseName) -> bool {
    state
        .group(lease)
        .applied
        .read(|s| s.table.leases.get(lease).is_none_or(|r| r.holder.is_none()))
}

/// Who a waiting acquire is: its holder name and, under a policy, its
/// principal (a reservation opens only to both).
#[derive(Debug, Clone, Copy)]
pub(in crate::api) struct Claimant<'a> {
    pub(in crate::api) holder: &'a str,
    pub(in crate::api) principal: Option<&'a str>,
}

/// Whether `lease` is free, and whether it is reserved for `who` by a
/// handover or a preemption (which `who` takes whatever the queue).
pub(in crate::api) fn free_or_reserved_for(
    state: &ApiState,
    lease: &LeaseName,
    who: Claimant,
) -> (bool, bool) {
    state
        .group(lease)
        .applied
        .read(|s| match s.table.leases.get(lease) {
            None => (true, false),
            Some(r) => (
                r.holder.is_none(),
                r.reserved_for(who.holder, who.principal),
            ),
        })
}

/// Whether `lease` is held back by the lock-delay of the grant whose expiry
/// freed it: `Err(time left)`, or `Ok(what the acquire's `delay_seen`
/// carries)` — the freeing change's `modify_index` when it was lock-delayed
/// and the delay has passed, 0 when there was none. One read, so the two
/// agree.
pub(in crate::api) fn lock_delay_left(
    state: &ApiState,
    lease: &LeaseName,
) -> Result<u64, Duration> {
    let delayed = state.group(lease).applied.read(|s| {
        s.table
            .leases
            .get(lease)
            .filter(|r| r.holder.is_none() && r.lock_delayed)
            .map(|r| (r.modify_index, r.terms.lock_delay_ms))
    });
    let Some((modify_index, delay)) = delayed else {
        return Ok(0);
    };
    let left = state.group(lease).lessor.lock_delay_left(
        lease,
        modify_index,
        Duration::from_millis(delay),
    );
    if left.is_zero() {
        Ok(modify_index)
    } else {
        Err(left)
    }
}

/// Waits until `lease` is free and, with `Turn::Mine`, this call may
/// propose (it heads the queue, or nobody queues), or until it is reserved
/// for `who`; or until `deadline`. `Ok(true)` if that came, `Ok(false)` at
/// the deadline. Wakes only for changes to this lease and its queue, and
/// for a change of leadership: a node that stops leading while the call
/// waits answers it 503 at once (its queue means nothing now; the new
/// leader queues the call when the client asks again), rather than at the
/// end of the wait, when no time is left to ask again (found by the
/// one-hour soak).
///
/// # Errors
/// [`ApiError::NoQuorum`] once this node no longer leads the term it led
/// when the wait began.
pub(in crate::api) async fn wait_until(
    state: &ApiState,
    lease: &LeaseName,
    who: Claimant<'_>,
    bell: &mut Bell,
    turn: Turn,
    deadline: tokio::time::Instant,
) -> Result<bool, ApiError> {
    let mut leadership = state.group(lease).lessor.leadership();
    // The term this node leads; `None` on a fresh leader before its first
    // duties tick, which takes up the term it is promoted to.
    let mut led = *leadership.borrow_and_update();
    let mut watching = true;
    loop {
        let (free, reserved_for_me) = free_or_reserved_for(state, lease, who);
        if reserved_for_me || (free && (turn == Turn::Any || bell.may_propose())) {
            return Ok(true);
        }
        tokio::select! {
            rung = tokio::time::timeout_at(deadline, bell.rung()) => {
                if rung.is_err() {
                    return Ok(false);
                }
            }
            changed = leadership.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let now = *leadership.borrow_and_update();
                match (led, now) {
                    (None, Some(_)) => led = now,
                    (Some(_), _) if now != led => {
                        return Err(ApiError::NoQuorum(
                            "this node stopped leading while the call waited; retry (the new \
                             leader queues it)"
                                .into(),
                        ));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Whose turn a waiting acquire waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::api) enum Turn {
    /// Its own place in the queue.
    Mine,
    /// Anyone's: just the lease being free.
    Any,
}

/// 409 `held` for a call whose wait ended: the holder now, or (the lease
/// being free) the earlier waiter it is being handed to — never a holder
/// that has already left.
pub(in crate::api) fn held_now(
    state: &ApiState,
    lease: &LeaseName,
    bell: &Bell,
    holder: String,
    token: FencingToken,
) -> ApiError {
    let record = state
        .group(lease)
        .applied
        .read(|s| s.table.leases.get(lease).cloned());
    match record {
        Some(LeaseRecord {
            holder: Some(holder),
            token,
            ..
        }) => ApiError::Held {
            holder: holder.to_string(),
            token,
        },
        Some(record) => ApiError::Held {
            holder: bell.head_holder().unwrap_or(holder),
            token: record.token,
        },
        None => ApiError::Held {
            holder: bell.head_holder().unwrap_or(holder),
            token,
        },
    }
}

/// 409 `held` for a call that found the lease free but others queued first.
pub(in crate::api) fn handed_to_earlier_waiter(
    state: &ApiState,
    lease: &LeaseName,
    bell: &Bell,
) -> ApiError {
    let token = state
        .group(lease)
        .applied
        .read(|s| s.table.leases.get(lease).map(|r| r.token))
        .unwrap_or_default();
    held_now(state, lease, bell, String::new(), token)
}
