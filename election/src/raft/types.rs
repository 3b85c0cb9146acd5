//! Palisade's Raft types, and the one question asked of Raft's metrics
//! everywhere: does this node lead?

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
