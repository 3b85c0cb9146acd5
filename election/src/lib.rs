//! The election cluster: Raft (openraft) over a replicated lease table.
//!
//! A client request reaches [`api`] on any node; followers forward it to the
//! leader. The leader proposes a [`command::Command`] through Raft; once
//! committed, every node applies it to its [`lease_table::LeaseTable`]
//! ([`state_machine`]), deterministically, and the fencing token of a grant is
//! the log index of its entry. Expiry is the leader's business alone
//! ([`lessor`]): it tracks deadlines on its monotonic clock, restarts them all
//! when it takes over, and proposes an `Expire` when one passes. Grants come
//! with a JWT signed by the cluster's Ed25519 key ([`signing`]), which is
//! itself replicated through the log.
//!
//! Storage ([`log_store`], snapshots in [`state_machine`]) is one sled database
//! per node; node-to-node RPC is HTTP ([`network`]). [`node`] wires it all up.

pub mod api;
pub mod command;
pub mod config;
pub mod error;
pub mod incarnation;
pub mod lease_table;
pub mod lessor;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod node;
pub mod placement;
pub mod propose;
pub mod read_batcher;
pub mod retirement;

pub mod signing;
pub mod snapshot_codec;
pub mod state_machine;
pub mod waiters;

openraft::declare_raft_types!(
    /// Palisade's Raft types: lease commands in, command results out.
    pub TypeConfig:
        D = command::Command,
        R = command::CommandResult,
        Node = openraft::BasicNode,
);

/// A node id, as in `--id` and `--peers`.
pub type NodeId = u64;
/// The Raft instance of a node.
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;

/// Whether `metrics` (a node's own) say that node leads.
pub(crate) fn leads(metrics: &openraft::RaftMetrics<TypeConfig>) -> bool {
    metrics.state == openraft::ServerState::Leader && metrics.current_leader == Some(metrics.id)
}

pub use config::ElectionConfig;
pub use node::ElectionNode;
