//! The election cluster: Raft (openraft) over a replicated lease table.
//!
//! A client request reaches [`api`] on any node; followers forward it to the
//! leader over [`peer`]. The leader proposes a
//! [`lease_table::command::Command`] through Raft ([`raft`]); once committed,
//! every node applies it to its [`lease_table::table::LeaseTable`],
//! deterministically, and the fencing token of a grant is the log index of
//! its entry. Expiry is the leader's business alone ([`leader`]): it tracks
//! deadlines on its monotonic clock, restarts them all when it takes over,
//! and proposes an `Expire` when one passes. Grants come with a JWT signed by
//! the cluster's Ed25519 key ([`signing`]), which is itself replicated
//! through the log.
//!
//! All of that per Raft group is one [`group::Group`] (the node runs group
//! 0 alone for now; [`group_id`] names a group's trees, snapshot and
//! routes). A lease never changes group, and its token is that group's log
//! index.
//!
//! [`node`] wires it all up; this file only declares the modules.

pub mod api;
pub mod config;
pub mod error;
pub mod group;
pub mod group_id;
pub mod io_error;
pub mod leader;
pub mod lease_table;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod raft;
pub mod series;
pub mod signing;
pub mod waiters;

pub use config::ElectionConfig;
pub use node::ElectionNode;
