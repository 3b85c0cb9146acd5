//! The PostgreSQL engine's own checks, beyond the conformance suite: the
//! schema's version, and faults answered as [`StoreError::Unavailable`]
//! within their bound, never a hang.

use std::time::{Duration, Instant};

use palisade_names::{FencingToken, ObjectKey};

use super::config::PostgresStoreConfig;
use super::test_server::fresh_database;
use super::PostgresStore;
use crate::error::StoreError;
use crate::fenced_store::FencedStore;

fn key(s: &str) -> ObjectKey {
    ObjectKey::new(s).expect("test key")
}

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_an_older_one_migrated_once() {
    let Some(url) = fresh_database().await else {
        return;
    };
    let config = PostgresStoreConfig::new(&url);
    let (a, b) = tokio::join!(
        PostgresStore::connect(&config),
        PostgresStore::connect(&config)
    );
    a.expect("first gateway");
    b.expect("second gateway, at the same time");
    raw(&url)
        .await
        .batch_execute("UPDATE palisade_gateway.schema_version SET version = 99")
        .await
        .expect("pretend a newer gateway migrated");
    let refused = PostgresStore::connect(&config).await;
    match refused {
        Err(StoreError::Engine(message)) => {
            assert!(message.contains("version 99"), "{message}");
        }
        other => panic!("a newer schema must be refused: {other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_within_the_connect_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut config = PostgresStoreConfig::new(format!("postgres://postgres@127.0.0.1:{port}/x"));
    config.connect_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let refused = PostgresStore::connect(&config).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_locked_lease_and_an_exhausted_pool_are_unavailable_in_bounded_time() {
    let Some(url) = fresh_database().await else {
        return;
    };
    let mut config = PostgresStoreConfig::new(&url);
    config.pool_size = 1;
    config.pool_wait = Duration::from_millis(200);
    config.lock_timeout = Duration::from_millis(800);
    config.statement_timeout = Duration::from_secs(2);
    let store = PostgresStore::connect(&config).await.expect("connect");
    store
        .put(&key("jobs/a"), b"1".to_vec(), FencingToken(1))
        .await
        .expect("put");

    // Another session holds the lease's lock, as a stuck raise would.
    let mut other = raw(&url).await;
    let tx = other.transaction().await.expect("begin");
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext('jobs'))",
        &[&super::schema::LEASE_LOCK_CLASS],
    )
    .await
    .expect("lock");

    let started = Instant::now();
    let jobs_a = key("jobs/a");
    let blocked = store.put(&jobs_a, b"2".to_vec(), FencingToken(2));
    let second = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let at = Instant::now();
        (
            store
                .fence(&crate::LeaseName::new("jobs").expect("lease"))
                .await,
            at.elapsed(),
        )
    };
    let (blocked, (second, waited)) = tokio::join!(blocked, second);
    assert!(
        matches!(&blocked, Err(StoreError::Unavailable(m)) if m.contains("lock")),
        "{blocked:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&second, Err(StoreError::Unavailable(m)) if m.contains("pool")),
        "{second:?}"
    );
    assert!(waited < Duration::from_millis(700), "{waited:?}");

    tx.rollback().await.expect("rollback");
    let written = store
        .put(&key("jobs/a"), b"3".to_vec(), FencingToken(2))
        .await
        .expect("served again once the lock is gone");
    assert_eq!(written.fence, FencingToken(2));
    let object = store
        .get(&key("jobs/a"))
        .await
        .expect("get")
        .expect("there");
    assert_eq!(object.value, b"3", "the refused write changed nothing");
}

/// The lease lock: a raise waits for every open write of the older token
/// (here one held open in an explicit transaction, as a slow commit would
/// be), then commits after it with a higher version; writes of the current
/// token do not wait for each other.
#[tokio::test]
async fn a_raise_waits_for_the_open_writes_of_the_older_token() {
    let Some(url) = fresh_database().await else {
        return;
    };
    let store = PostgresStore::connect(&PostgresStoreConfig::new(&url))
        .await
        .expect("connect");
    store
        .put(&key("l/seed"), b"0".to_vec(), FencingToken(5))
        .await
        .expect("seed the fence at 5");

    let mut open = raw(&url).await;
    let tx = open.transaction().await.expect("begin");
    let row = tx
        .query_one(
            "SELECT out_version FROM palisade_gateway.fenced_put('l', 5, 'l/a', 'old')",
            &[],
        )
        .await
        .expect("a token-5 write, not committed");
    let old_version: i64 = row.get(0);

    // Another write of token 5 goes ahead; the raise to 6 waits.
    store
        .put(&key("l/c"), b"same".to_vec(), FencingToken(5))
        .await
        .expect("writes of the current token run side by side");
    let raise = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .put(&key("l/b"), b"new".to_vec(), FencingToken(6))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !raise.is_finished(),
        "the raise did not wait for the open write"
    );
    tx.commit().await.expect("commit the token-5 write");
    let raised = raise.await.expect("task").expect("the raise");
    assert!(
        raised.version as i64 > old_version,
        "{raised:?} after {old_version}"
    );
    let late = store
        .put(&key("l/a"), b"late".to_vec(), FencingToken(5))
        .await;
    assert!(matches!(late, Err(StoreError::Stale { .. })), "{late:?}");
}

/// After the first start, a gateway needs only reads and writes on its
/// schema: a role without the CREATE right on the database starts and
/// writes.
#[tokio::test]
async fn a_role_with_only_read_and_write_rights_starts_once_the_schema_exists() {
    let Some(url) = fresh_database().await else {
        return;
    };
    PostgresStore::connect(&PostgresStoreConfig::new(&url))
        .await
        .expect("the first start, as the owner, creates the schema");
    let role = format!("gw_{}", std::process::id());
    raw(&url)
        .await
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA palisade_gateway TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA palisade_gateway TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA palisade_gateway TO {role};"
        ))
        .await
        .expect("a role with reads and writes only");
    let as_role = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let store = PostgresStore::connect(&PostgresStoreConfig::new(as_role))
        .await
        .expect("starts without the CREATE right");
    store
        .put(&key("jobs/a"), b"1".to_vec(), FencingToken(1))
        .await
        .expect("writes");
}

/// A database a version 1 gateway made is migrated to version 2 on start:
/// its objects and fences stay, and the holder's writes, a raise and a
/// stale write behave as before.
#[tokio::test]
async fn a_version_1_database_is_migrated_and_keeps_its_fences() {
    let Some(url) = fresh_database().await else {
        return;
    };
    let mut old = raw(&url).await;
    assert_eq!(super::schema::migrate_to(&mut old, 1).await.expect("v1"), 0);
    old.batch_execute("SELECT * FROM palisade_gateway.fenced_put('l', 3, 'l/a', 'v1')")
        .await
        .expect("a version 1 write");

    let store = PostgresStore::connect(&PostgresStoreConfig::new(&url))
        .await
        .expect("migrates");
    let version: i32 = old
        .query_one("SELECT version FROM palisade_gateway.schema_version", &[])
        .await
        .expect("version")
        .get(0);
    assert_eq!(version, super::schema::SCHEMA_VERSION);
    let kept = store.get(&key("l/a")).await.expect("get").expect("kept");
    assert_eq!(
        (kept.value.as_slice(), kept.token),
        (&b"v1"[..], FencingToken(3))
    );

    let held = store
        .put(&key("l/a"), b"held".to_vec(), FencingToken(3))
        .await
        .expect("the holder's write");
    assert!(held.version > kept.version);
    let raised = store
        .put(&key("l/b"), b"raised".to_vec(), FencingToken(4))
        .await
        .expect("a raise");
    assert_eq!(raised.fence, FencingToken(4));
    let stale = store
        .put(&key("l/a"), b"stale".to_vec(), FencingToken(3))
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::Stale {
                token: FencingToken(3),
                fence: FencingToken(4)
            })
        ),
        "{stale:?}"
    );
    let after = store.get(&key("l/a")).await.expect("get").expect("there");
    assert_eq!(after.value, b"held", "the stale write changed nothing");
}
