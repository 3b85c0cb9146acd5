//! The leader lease a renewal is answered under: no quorum round of its own
//! (CONTRACT, the renew rule; ARCHITECTURE, "Renewals ride the leader
//! lease").
//!
//! A leader may answer a renewal while a quorum acknowledged an append it
//! *sent* less than `lease − margin` ago, on its monotonic clock. Every
//! voter that acknowledged that append refuses to vote for another leader
//! until `lease` has passed since it *received* it (openraft's leader lease:
//! a follower's vote stays leased for its `election_timeout_max`), and a new
//! leader treats every live lease as renewed at its takeover. So a renewal
//! answered now extends a grant no further than the next leader's first
//! deadline for it. The `margin` covers the two clocks running at different
//! rates over one lease (see [`RenewLease::margin`]).
//!
//! Leadership moved *without* waiting out the lease — a transfer, whose
//! vote request the voters grant inside it — must stop renewals first:
//! [`Handoff`], set before placement asks openraft to transfer.
//!
//! A renewal whose leader's last acknowledgement is older than that (a
//! stalled follower, a busy core) waits for the next one — the heartbeat
//! every waiting renewal shares, none starts a round of its own — up to the
//! node's patience, and is refused after: its followers can have elected
//! another leader by then.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::Instant as _;
use tokio::time::Instant;

use super::{applied_in_term, leads, NodeId, Raft, TypeConfig};

/// When renewals may be answered, from the timing every voter shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewLease {
    /// The shortest vote lease any voter keeps: every voter's openraft
    /// leader lease is its `election_timeout_max`, which is at least the
    /// configured minimum election timeout (with or without a timing seed);
    /// [`crate::peer::settings::PeerSettings::renew_lease`] lowers it to the
    /// shortest any voter announced.
    pub lease: Duration,
    /// Taken off `lease` for clock-rate drift: the leader measures from its
    /// send, a voter from its receipt, each on its own monotonic clock; a
    /// margin `m` covers a rate difference of up to `m / (2 · lease)`
    /// between any two nodes (the default, a tenth of the lease, covers
    /// 5%).
    pub margin: Duration,
    /// How long past its last acknowledgement a leader waits for the next
    /// one before it refuses renewals (a loaded machine's stalls are
    /// waited out, a cut-off leader is refused).
    pub patience: Duration,
    /// How long a leader with no acknowledgement yet in its term waits for
    /// its first one.
    pub first_ack: Duration,
}

impl RenewLease {
    /// How old the last quorum acknowledgement may be for a renewal to be
    /// answered at once.
    pub fn usable(&self) -> Duration {
        self.lease.saturating_sub(self.margin)
    }

    /// What a renewal arriving now may do, given `facts`.
    pub fn judge(&self, facts: Facts) -> Standing {
        if !facts.leads {
            return Standing::Refused(Refusal::Follows);
        }
        if let Some(to) = facts.handing_to {
            return Standing::Refused(Refusal::HandingOff { to });
        }
        let fresh = facts.sole_voter || facts.ack_age.is_some_and(|age| age < self.usable());
        if fresh && facts.applied_in_term {
            return Standing::Holds;
        }
        let left = match facts.ack_age {
            _ if facts.sole_voter => self.first_ack,
            Some(age) => self.patience.saturating_sub(age),
            None => self.first_ack,
        };
        if left.is_zero() {
            Standing::Refused(Refusal::Lapsed {
                since: facts.ack_age,
            })
        } else {
            Standing::Waits { at_most: left }
        }
    }
}

/// What a renewal's answer depends on, read from this node's Raft metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The node's Raft state says it leads.
    pub leads: bool,
    /// It is the only voter: its own log is the quorum.
    pub sole_voter: bool,
    /// It applied an entry of its own term (its first, the blank one), so
    /// everything earlier leaders committed is in its table.
    pub applied_in_term: bool,
    /// Since the send time of the last append a quorum acknowledged
    /// (`None`: none yet in this term).
    pub ack_age: Option<Duration>,
    /// Leadership is being transferred to this node, in this term.
    pub handing_to: Option<NodeId>,
}

/// What [`RenewLease::judge`] says of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Answer it now.
    Holds,
    /// Wait for the next acknowledgement (or apply), at most this long.
    Waits {
        /// The wait left before the leader's patience runs out.
        at_most: Duration,
    },
    /// Refuse it.
    Refused(Refusal),
}

/// Why a renewal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This node does not lead.
    Follows,
    /// It is handing leadership to `to`.
    HandingOff {
        /// The transfer's target.
        to: NodeId,
    },
    /// No quorum acknowledged it within its patience.
    Lapsed {
        /// Since the last acknowledgement, if there was one this term.
        since: Option<Duration>,
    },
}

/// Where [`confirm`] reads the facts and learns they may have changed.
pub trait FactSource {
    /// The facts now.
    fn facts(&self) -> Facts;
    /// Resolves when the facts may have changed.
    fn changed(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

/// Waits until a renewal may be answered under the rule `rule` gives at
/// that moment (at once on a leader whose lease holds), or says why not.
///
/// # Errors
/// The [`Refusal`]: not the leader, handing leadership off, or no quorum
/// acknowledgement within the leader's patience.
pub async fn confirm(
    rule: impl Fn() -> RenewLease,
    source: &mut impl FactSource,
) -> Result<(), Refusal> {
    let mut until: Option<Instant> = None;
    loop {
        let facts = source.facts();
        // Asked again on every turn: the voters' announced timing may have
        // shortened the lease while this renewal waited.
        let at_most = match rule().judge(facts) {
            Standing::Holds => return Ok(()),
            Standing::Refused(refusal) => return Err(refusal),
            Standing::Waits { at_most } => at_most,
        };
        let now = Instant::now();
        let deadline = until.map_or(now + at_most, |u| u.min(now + at_most));
        until = Some(deadline);
        if tokio::time::timeout_at(deadline, source.changed())
            .await
            .is_err()
        {
            return Err(Refusal::Lapsed {
                since: source.facts().ack_age,
            });
        }
    }
}

/// Stops renewals on a leader about to hand leadership over: set before
/// the transfer starts, for the rest of the term it was set in (a transfer
/// that fails leaves openraft's leader refusing writes and heartbeats for
/// that term too; a new term starts clean).
#[derive(Debug, Default)]
pub struct Handoff {
    /// The term and the target of the last handoff begun.
    begun: std::sync::Mutex<Option<(u64, NodeId)>>,
}

impl Handoff {
    /// Renewals stop on this node for `term`: leadership goes to `to`.
    pub fn begin(&self, term: u64, to: NodeId) {
        *palisade_plumbing::sync::lock(&self.begun) = Some((term, to));
    }

    /// The target of a handoff begun in `term`, if one was.
    pub fn during(&self, term: u64) -> Option<NodeId> {
        let begun = *palisade_plumbing::sync::lock(&self.begun);
        begun.filter(|(t, _)| *t == term).map(|(_, to)| to)
    }
}

/// The facts of a node's Raft: its metrics and its handoff.
pub struct RaftFacts<'a> {
    metrics: openraft::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>>,
    handoff: &'a Handoff,
}

impl std::fmt::Debug for RaftFacts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftFacts")
            .field("handoff", self.handoff)
            .finish_non_exhaustive()
    }
}

impl<'a> RaftFacts<'a> {
    /// The facts of `raft`, whose transfers `handoff` announces.
    pub fn new(raft: &Raft, handoff: &'a Handoff) -> Self {
        Self {
            metrics: raft.metrics(),
            handoff,
        }
    }
}

impl FactSource for RaftFacts<'_> {
    fn facts(&self) -> Facts {
        let metrics = self.metrics.borrow_watched();
        let term = metrics.current_term;
        let mut voters = metrics.membership_config.membership().voter_ids();
        let sole_voter = voters.next() == Some(metrics.id) && voters.next().is_none();
        Facts {
            leads: leads(&metrics),
            sole_voter,
            applied_in_term: applied_in_term(&metrics),
            ack_age: metrics.last_quorum_acked.as_ref().map(|at| at.elapsed()),
            handing_to: self.handoff.during(term),
        }
    }

    async fn changed(&mut self) {
        // A closed channel (Raft shut down) changes no more: the wait runs
        // to its deadline and the renewal is refused.
        if self.metrics.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests;
