//! Raft (openraft) around the lease table: the types, the log and the state
//! machine in sled, snapshots, and the two ways the rest of the node uses
//! Raft — proposing a command ([`propose`]), confirming leadership with a
//! quorum ([`read_batcher`]), and answering renewals on the leader lease
//! ([`lease`]).
//!
//! **Architecture Invariant:** nothing here reaches the client API (`api/`)
//! or the peer transport (`peer/`): storage is below both.

pub mod applied;
pub mod durable;
pub mod feed;
pub mod lease;
pub mod log_store;
pub mod propose;
pub mod read_batcher;
pub mod snapshot_codec;
pub mod snapshot_file;
pub mod state_machine;
pub mod types;

pub use types::{acting, applied_in_term, leads, Acting, NodeId, TypeConfig};

/// The Raft instance of a node.
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
