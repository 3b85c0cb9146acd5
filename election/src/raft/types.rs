//! Palisade's Raft types, and the questions asked of Raft's metrics
//! everywhere: does this node lead ([`leads`]), and does it still act as the
//! leader ([`acting`])?

use std::time::Duration;

use openraft::Instant as _;

use crate::lease_table::command::{Command, CommandResult};

openraft::declare_raft_types!(
    /// Palisade's Raft types: lease commands in, command results out.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        Node = openraft::BasicNode,
);

/// A node id, as in `--id` and `--peers`.
pub type NodeId = u64;

/// Whether `metrics` (a node's own) say that node leads.
pub fn leads(metrics: &openraft::RaftMetrics<TypeConfig>) -> bool {
    metrics.state == openraft::ServerState::Leader && metrics.current_leader == Some(metrics.id)
}

/// Whether the node of `metrics` applied an entry of its current term (a
/// leader's first is its blank one), so its table holds everything earlier
/// leaders committed.
pub fn applied_in_term(metrics: &openraft::RaftMetrics<TypeConfig>) -> bool {
    metrics
        .last_applied
        .as_ref()
        .is_some_and(|id| id.leader_id.term == metrics.current_term)
}

/// What a node's own metrics say of its leadership, with openraft's leader
/// lease taken into account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting {
    /// It leads, and a quorum acknowledged an append it sent less than the
    /// leader lease ago: it may serve as the leader.
    Leads,
    /// It is not the leader.
    Follows,
    /// Its Raft state says leader, but no quorum acknowledged anything it
    /// sent within the lease (cut off, or just woken from a pause): openraft
    /// refuses its proposals and voters may already elect another. It must
    /// not act, nor say it leads.
    Lapsed {
        /// Since the send time of the last append a quorum acknowledged
        /// (`None`: none yet in this term).
        since: Option<Duration>,
    },
}

/// Whether the node of `metrics` acts as the leader: it leads, and its
/// leader lease (`lease`: openraft's is `election_timeout_max`) holds. A
/// sole voter is its own quorum and always holds it.
pub fn acting(metrics: &openraft::RaftMetrics<TypeConfig>, lease: Duration) -> Acting {
    if !leads(metrics) {
        return Acting::Follows;
    }
    let mut voters = metrics.membership_config.membership().voter_ids();
    if voters.next() == Some(metrics.id) && voters.next().is_none() {
        return Acting::Leads;
    }
    let since = metrics
        .last_quorum_acked
        .as_ref()
        .map(|acked| acked.elapsed());
    match since {
        Some(age) if age < lease => Acting::Leads,
        since => Acting::Lapsed { since },
    }
}
