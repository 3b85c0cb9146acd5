//! A lease's history: its last transitions (who got it,
//! who lost it, and why), kept in its `LeaseRecord` and so replicated,
//! snapshotted and restored like the rest of the record.
//!
//! Recorded by [`LeaseTable::apply`](super::table::LeaseTable::apply) from
//! the difference a command made to the record (holder, token, revoked,
//! reserved), not by each handler: one place, and a command that changed
//! nothing leaves no entry. The time is the proposer's wall clock, carried
//! in the entry ([`Command::Stamped`]); entries written before stamps
//! existed have none. So is the bound on the history's length (the
//! leader's `--history-len`, [`HISTORY_LEN`] in older entries): trimming
//! depends on the entry alone, never on a node's own flag.

use std::collections::VecDeque;

use palisade_names::{FencingToken, Holder};
use serde::{Deserialize, Serialize};

use super::command::Command;

/// How many transitions a lease keeps (the oldest drops out first) when
/// its entry names no bound: the default of `--history-len`, and what
/// entries written before the flag keep.
pub const HISTORY_LEN: usize = 8;

/// The largest `--history-len`: the snapshot stores a history's length in
/// one byte (`raft/snapshot_codec.rs`).
pub const MAX_HISTORY_LEN: usize = 255;

/// Why a lease changed hands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A free lease granted (`holder`, `token`: the new grant).
    Acquire,
    /// A reserved grant (a handover's, a preemptor's) taken by its holder.
    Claim,
    /// Handed over to `holder`, reserved for it (a new token).
    Handover,
    /// Released by `holder` (the ended grant's token); a preempted grant's
    /// release passes the lease to the preemptor, reserved.
    Release,
    /// `holder`'s grant ran out on the leader's clock.
    Expire,
    /// `holder`'s grant was preempted by a higher priority: revoked, it ends
    /// at its deadline or release.
    Preempt,
    /// `holder`'s grant was revoked by an operator.
    Revoke,
}

impl Cause {
    /// Every cause, in declaration order (the snapshot's byte for each is
    /// its position).
    pub const ALL: [Cause; 7] = [
        Cause::Acquire,
        Cause::Claim,
        Cause::Handover,
        Cause::Release,
        Cause::Expire,
        Cause::Preempt,
        Cause::Revoke,
    ];
}

/// One transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The log index of the entry that made it.
    pub index: u64,
    /// When it was proposed, on the proposer's clock (ms since the Unix
    /// epoch); `None` for entries written before commands were stamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// Why.
    pub cause: Cause,
    /// The grant it is about: the new one (acquire, claim, handover) or the
    /// one that ended or was revoked (the other causes).
    pub holder: Option<Holder>,
    /// That grant's token.
    pub token: FencingToken,
}

/// What of a record a transition changes (`LeaseRecord::standing`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub holder: Option<Holder>,
    pub token: FencingToken,
    pub revoked: bool,
    pub reserved: bool,
}

/// The transition `command` made at `index`, from `before` to `after`, if
/// it made one.
pub fn transition(
    index: u64,
    at_ms: Option<u64>,
    command: &Command,
    before: Option<&Standing>,
    after: &Standing,
) -> Option<Transition> {
    let changed_hands = before.is_none_or(|b| b.holder != after.holder || b.token != after.token);
    let revoked = after.revoked && !before.is_some_and(|b| b.revoked);
    let claimed = !after.reserved && before.is_some_and(|b| b.reserved) && !changed_hands;
    let ended = |cause| {
        let b = before?;
        Some((cause, b.holder.clone(), b.token))
    };
    let started = |cause| Some((cause, after.holder.clone(), after.token));
    let (cause, holder, token) = match command {
        Command::Acquire { .. } if changed_hands && after.holder.is_some() => {
            started(Cause::Acquire)
        }
        Command::Acquire { .. } if claimed => started(Cause::Claim),
        Command::Acquire { .. } if revoked => started(Cause::Preempt),
        Command::Handover { .. } if changed_hands => started(Cause::Handover),
        Command::Release { .. } if changed_hands => ended(Cause::Release),
        Command::Expire { .. } if changed_hands => ended(Cause::Expire),
        Command::Revoke { .. } if revoked => started(Cause::Revoke),
        _ => None,
    }?;
    Some(Transition {
        index,
        at_ms,
        cause,
        holder,
        token,
    })
}

/// Appends `transition`, dropping the oldest beyond `keep` (the bound the
/// entry carries, so every node trims alike: a bound lowered since drops
/// the surplus here, one raised lets the history grow).
pub fn push(history: &mut VecDeque<Transition>, transition: Transition, keep: usize) {
    history.push_back(transition);
    while history.len() > keep.max(1) {
        history.pop_front();
    }
}
