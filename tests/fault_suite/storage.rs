//! Where a fault-suite run keeps its objects, and the faults of that
//! storage: one gateway on sled (the embedded default), or two gateways on
//! one PostgreSQL the run starts itself (Debian's binaries, as in
//! `tests/gateway_postgres.rs`), with the workers spread over both, so the
//! checker's S1 and per-key linearizability hold across gateways.
//!
//! Faults: kill -9 of a gateway mid-write (either engine); on PostgreSQL
//! also a gateway paused (SIGSTOP) mid-write while the other keeps
//! serving, and PostgreSQL itself stopped in immediate mode and started
//! again (every gateway answers 503 meanwhile; nothing acknowledged may be
//! lost, which the checker's final reads verify).

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_local_cluster::{GatewayKeys, NodeSpec};

use crate::support::pg::PgServer;
use crate::support::{free_ports, spawn_node, Access, Cluster, Process};

/// The storage engine under the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sled,
    Postgres,
}

/// The running gateways (and their database).
pub struct Gateways {
    procs: Vec<Process>,
    /// Dropped after the gateways (field order): stopped and removed.
    pg: Option<PgServer>,
}

impl Gateways {
    /// One gateway on sled, or two on a fresh PostgreSQL; `None` when
    /// PostgreSQL is missing and `PALISADE_PG_STRICT` is unset (skipped,
    /// with a message). Fixed ports, so a restart keeps the address the
    /// workers know.
    /// `sled_data`: the sled gateway's data dir (default: in `dir`).
    pub fn start(
        engine: Engine,
        access: &Access,
        cluster: &Cluster,
        dir: &Path,
        sled_data: Option<PathBuf>,
    ) -> Option<Self> {
        let sled = |i: usize| {
            let data = match (&sled_data, i) {
                (Some(data), 1) => data.clone(),
                _ => dir.join(format!("gateway-{i}")),
            };
            NodeSpec {
                listen: format!("127.0.0.1:{}", free_ports(1)[0]),
                ..access.gateway_for(cluster, &data)
            }
        };
        let (specs, pg) = match engine {
            Engine::Sled => (vec![sled(1)], None),
            Engine::Postgres => {
                let pg = PgServer::start_with(&[])?;
                let specs = (1..=2)
                    .map(|i| {
                        let tls_and_policy = sled(i);
                        let mut spec = NodeSpec::gateway_on_postgres(
                            tls_and_policy.listen,
                            pg.url(),
                            GatewayKeys::Election(cluster.urls()),
                        );
                        spec.args = tls_and_policy.args;
                        spec
                    })
                    .collect();
                (specs, Some(pg))
            }
        };
        let procs = specs.into_iter().map(spawn_node).collect();
        Some(Self { procs, pg })
    }

    /// How many gateways run.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// The URL of gateway `i` (modulo their number: workers are spread
    /// round-robin).
    pub fn url(&self, i: usize) -> &str {
        &self.procs[i % self.procs.len()].url
    }

    /// kill -9 gateway `victim` (mid-write: the workers write every 50 ms)
    /// and start it again with the same flags.
    pub fn kill_and_restart(&mut self, victim: usize) {
        self.kill_and_restart_after(victim, || {});
    }

    /// As [`Gateways::kill_and_restart`], running `between` while it is
    /// down (a power cut of its disk).
    pub fn kill_and_restart_after(&mut self, victim: usize, between: impl FnOnce()) {
        let gateway = &mut self.procs[victim];
        let spec = gateway.node.spec().clone();
        gateway.kill();
        between();
        *gateway = spawn_node(spec);
    }

    /// SIGSTOP gateway `victim` for `pause`, then SIGCONT. The other
    /// gateway must keep serving meanwhile (the victim holds no row lock
    /// between statements), and the victim's writes, resumed, are checked
    /// against the fence again by the database.
    pub async fn pause(&self, victim: usize, pause: Duration) {
        let node = &self.procs[victim].node;
        node.pause().expect("SIGSTOP gateway");
        tokio::time::sleep(pause).await;
        node.resume().expect("SIGCONT gateway");
    }

    /// PostgreSQL stopped in immediate mode (no checkpoint: a crash as far
    /// as the database is concerned), down for `down`, then started on the
    /// same port.
    pub async fn restart_postgres(&mut self, down: Duration) {
        let pg = self.pg.as_mut().expect("a PostgreSQL run");
        let port = pg.server().port();
        pg.server().stop("immediate");
        tokio::time::sleep(down).await;
        pg.server().start(port).expect("PostgreSQL starts again");
    }
}
