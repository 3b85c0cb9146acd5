//! Local Palisade clusters as child processes of a `palisade` binary: what
//! `palisade dev`, the integration tests and the benches start. The caller
//! names the binary (`dev` its own executable, the tests
//! `CARGO_BIN_EXE_palisade`, the bench its `--palisade` path).
//!
//! - `spec.rs`: [`NodeSpec`], what one node is (an election node or a
//!   gateway, its address, data dir, extra flags, environment and logs), and
//!   [`NodeSpec::command_line`], the one place a node's flags are built.
//! - `node.rs`: [`Node`], one running child: wait for its `listening on`
//!   line, SIGSTOP/SIGCONT, kill -9 (also on drop), or [`stop_gracefully`].
//! - `cluster.rs`: [`Cluster`], the election nodes with their ports and data
//!   dirs: start, kill and restart one node, poll for a leader.
//! - `ready.rs`: the HTTP probes readiness is judged by.
//! - `certs.rs`: [`make_certs`], the certificates peers authenticate with.
//! - `postgres.rs`: [`PostgresServer`], a throwaway PostgreSQL (and its
//!   synchronous standby) from Debian's binaries.
//! - `ports.rs`: [`free_ports`]; `error.rs`: [`Error`].
//!
//! The dependency runs one way: `cluster → node → spec`.
//!
//! Ports: election nodes need theirs before any starts (each is in every
//! peer's `--peers`), so [`Cluster`] takes them or picks free ones
//! ([`free_ports`]); a gateway can take port 0 and report the one it got.

mod certs;
mod cluster;
mod error;
mod node;
mod ports;
mod postgres;
pub mod ready;
mod spec;

pub use certs::make_certs;
pub use cluster::{Cluster, ClusterConfig, NodeSetup};
pub use error::Error;
pub use node::{stop_gracefully, Node};
pub use ports::free_ports;
pub use postgres::{
    postgres_installed, shared_test_server, PostgresError, PostgresServer, PG_BIN, PG_INSTALL_HINT,
};
pub use spec::{GatewayKeys, Logs, NodeSpec, PeerAuth, Role};
