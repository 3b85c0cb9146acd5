//! The PostgreSQL the store's tests run against: one throwaway server per
//! test binary (stopped when the binary exits), a fresh database per store.
//!
//! Without PostgreSQL's binaries the tests are skipped with a message,
//! unless `PALISADE_PG_STRICT` is set: then they fail.

use std::sync::atomic::{AtomicU32, Ordering};

use palisade_local_cluster::PostgresServer;

use super::config::PostgresStoreConfig;
use super::PostgresStore;

static DATABASES: AtomicU32 = AtomicU32::new(0);

/// The shared server, started on first use; `None` when skipped.
pub(crate) fn server() -> Option<&'static PostgresServer> {
    palisade_local_cluster::shared_test_server("palisade-store-pg-")
}

/// A URL of a new, empty database on the shared server.
pub(crate) async fn fresh_database() -> Option<String> {
    let server = server()?;
    let name = format!(
        "store_{}_{}",
        std::process::id(),
        DATABASES.fetch_add(1, Ordering::SeqCst)
    );
    let (client, connection) =
        tokio_postgres::connect(&server.url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("connect to the test server");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a database");
    Some(server.url(&name))
}

/// A store on a new database, values up to `max` bytes.
pub(crate) async fn store(max: usize) -> Option<(PostgresStore, ())> {
    let url = fresh_database().await?;
    let mut config = PostgresStoreConfig::new(url);
    config.max_value_bytes = max;
    config.pool_size = 8;
    Some((PostgresStore::connect(&config).await.expect("connect"), ()))
}
