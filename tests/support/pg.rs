//! A throwaway PostgreSQL for the integration tests: `local-cluster`'s
//! [`PostgresServer`] in a temp dir under /tmp, stopped (immediate) and
//! removed when dropped.
//!
//! [`PgServer::start`] answers `None` (with a message) only when
//! PostgreSQL's binaries are missing and `PALISADE_PG_STRICT` is unset;
//! under that variable a missing PostgreSQL fails the test.

use std::path::PathBuf;

use palisade_client::postgres::tokio_postgres;
pub use palisade_local_cluster::PostgresServer;
use palisade_local_cluster::{postgres_installed, PG_INSTALL_HINT};

/// The settings of a test server: quick (no fsync: the tests crash
/// processes, never the machine, so the page cache survives), loopback.
pub const QUICK: &[&str] = &["fsync=off", "full_page_writes=off", "max_connections=200"];

/// A started server in its own temp dir.
pub struct PgServer {
    server: PostgresServer,
    dir: PathBuf,
}

impl PgServer {
    /// Started with [`QUICK`] and `settings` (`name=value`).
    pub fn start_with(settings: &[&str]) -> Option<Self> {
        if !postgres_installed() {
            assert!(
                std::env::var_os("PALISADE_PG_STRICT").is_none(),
                "PALISADE_PG_STRICT is set but PostgreSQL is missing: {PG_INSTALL_HINT}"
            );
            eprintln!("SKIPPED: {PG_INSTALL_HINT}; set PALISADE_PG_STRICT to fail instead");
            return None;
        }
        let dir = new_dir();
        let all: Vec<&str> = QUICK.iter().chain(settings).copied().collect();
        let mut server = PostgresServer::init(&dir, &all).expect("initdb");
        server.start(0).expect("start PostgreSQL");
        Some(Self { server, dir })
    }

    /// Started with the settings the fenced-transaction tests use.
    pub fn start() -> Option<Self> {
        Self::start_with(&["synchronous_commit=off"])
    }

    /// A synchronous standby of this server, in its own temp dir.
    pub fn standby(&self, name: &str) -> Self {
        let dir = new_dir();
        let server = PostgresServer::standby(&self.server, &dir, name).expect("start a standby");
        Self { server, dir }
    }

    /// The `postgres` database's URL.
    pub fn url(&self) -> String {
        self.server.url("postgres")
    }

    /// The server itself: stop, start, kill -9, promote, psql.
    pub fn server(&mut self) -> &mut PostgresServer {
        &mut self.server
    }

    /// A connection to the `postgres` database, driven on its own task.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(connection);
        client
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.server.stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn new_dir() -> PathBuf {
    tempfile::Builder::new()
        .prefix("palisade-pg-")
        .tempdir_in("/tmp")
        .expect("tempdir")
        .keep()
}
