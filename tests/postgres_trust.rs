//! The database fence trusts only what the cluster granted (S6), tried as
//! an attacker would, against a real PostgreSQL and a real cluster: a role
//! without the lease can neither write past a guard, raise, read nor block
//! a fence; a forged, altered or borrowed JWT is refused; partitions,
//! inheritance children, every write through their parents and TRUNCATE
//! are guarded; a key rotation and a retirement reach the database through
//! `palisade sql keys`, which no transaction a role leaves open can block;
//! small-order keys and non-canonical encodings are refused; and the
//! Ed25519 check written in SQL agrees with ed25519-dalek.

use crate::support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer, SigningKey};
use futures::SinkExt;
use palisade_client::postgres::{self, tokio_postgres};
use palisade_client::Error;
use serde_json::{json, Value};
use support::pg::PgServer;
use support::{http_client, node_setup, sdk, Cluster};

/// Clusters are heavy on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_default()
}

/// The SQLSTATE, message and detail of a refusal, for assertions.
fn refusal(err: &tokio_postgres::Error) -> (String, String) {
    let text = match err.as_db_error() {
        Some(db) => format!("{} {}", db.message(), db.detail().unwrap_or("")),
        None => err.to_string(),
    };
    (sqlstate(err), text)
}

async fn connect_as(pg: &PgServer, role: &str) -> tokio_postgres::Client {
    let url = pg.url().replacen("postgres@", &format!("{role}@"), 1);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

fn palisade(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("PALISADE_ELECTION")
        .output()
        .expect("run palisade")
}

fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `palisade sql keys` for `pg` from `cluster`.
fn sync_keys(pg: &PgServer, cluster: &Cluster) -> String {
    let urls = cluster.urls().join(",");
    succeeded(&palisade(&[
        "sql",
        "keys",
        "--url",
        &pg.url(),
        "--election",
        &urls,
    ]))
}

/// The JWT's three parts, decoded where they are JSON.
fn parts(jwt: &str) -> (Value, Value, String) {
    let mut split = jwt.split('.');
    let json = |part: Option<&str>| -> Value {
        let bytes = URL_SAFE_NO_PAD
            .decode(part.expect("part"))
            .expect("base64url");
        serde_json::from_slice(&bytes).expect("json")
    };
    let header = json(split.next());
    let claims = json(split.next());
    (header, claims, split.next().expect("signature").to_owned())
}

fn encode(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// A JWT with `header` and `claims`, signed by `key`.
fn sign(key: &SigningKey, header: &Value, claims: &Value) -> String {
    let signed = format!("{}.{}", encode(header), encode(claims));
    let signature = key.sign(signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
}

fn attacker_key() -> SigningKey {
    SigningKey::from_bytes(&rand::random::<[u8; 32]>())
}

/// A fresh database with the schema and the cluster's keys, roles `app`
/// (allowed to fence: `--grant app`) and `mallory` (nothing), both with
/// every privilege on the tables the test makes; proofs' `exp` given an
/// hour of leeway, so only what the test means refuses them.
async fn database(pg: &PgServer, cluster: &Cluster) -> tokio_postgres::Client {
    let db = pg.connect().await;
    db.batch_execute("CREATE ROLE app LOGIN; CREATE ROLE mallory LOGIN;")
        .await
        .expect("roles");
    let urls = cluster.urls().join(",");
    let out = succeeded(&palisade(&[
        "sql",
        "install",
        "--url",
        &pg.url(),
        "--election",
        &urls,
        "--grant",
        "app",
    ]));
    assert!(out.contains("signing key(s) installed"), "{out}");
    assert!(out.contains("app may fence with proof"), "{out}");
    db.batch_execute(
        "UPDATE palisade.settings SET exp_leeway_secs = 3600;
         CREATE TABLE shop (id serial PRIMARY KEY, lease text, v int);
         CREATE TABLE ledger (v int);
         SELECT palisade.guard('shop', 'lease');
         SELECT palisade.guard_table('ledger', 'orders');
         GRANT ALL ON shop, ledger TO app, mallory;
         GRANT ALL ON SEQUENCE shop_id_seq TO app, mallory;",
    )
    .await
    .expect("tables");
    db
}

/// Whether `number` appears in `text` as a number of its own.
fn mentions(text: &str, number: u64) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word.parse() == Ok(number))
}

async fn fence_of(db: &tokio_postgres::Client, lease: &str) -> i64 {
    db.query_one(
        "SELECT fence FROM palisade.fences WHERE lease = $1",
        &[&lease],
    )
    .await
    .expect("fence row")
    .get(0)
}

/// What a role with no grant, and a role allowed to fence but holding no
/// lease, can do against a holder: nothing that writes, raises, reads or
/// blocks a fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_lease_can_neither_write_raise_read_nor_block_a_fence() {
    let _serial = SERIAL.lock().await;
    let Some(pg) = PgServer::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    cluster.leader(&http_client()).await;
    let owner = database(&pg, &cluster).await;
    let client = sdk(&cluster, None);
    let a = client
        .acquire(
            "orders",
            "A",
            Duration::from_secs(5),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("A acquires");
    let a_jwt = a.jwt().expect("held");
    let a_token = a.token();

    // The holder, as `app`, writes through both guards; its mark is kept.
    let mut holder = connect_as(&pg, "app").await;
    let tx = a.fenced_transaction(&mut holder).await.expect("A fences");
    tx.execute("INSERT INTO shop (lease, v) VALUES ('orders', 1)", &[])
        .await
        .expect("A writes a row");
    tx.execute("INSERT INTO ledger VALUES (1)", &[])
        .await
        .expect("A writes the table");
    let mark: String = tx
        .query_one("SELECT current_setting('palisade.fenced')", &[])
        .await
        .expect("mark")
        .get(0);
    tx.commit().await.expect("A commits");
    assert_eq!(fence_of(&owner, "orders").await, a.token() as i64);

    // mallory: no EXECUTE, no read, and no forged or replayed mark passes.
    let mallory = connect_as(&pg, "mallory").await;
    for sql in [
        format!("SELECT palisade.fence('orders', '{a_jwt}')"),
        "SELECT palisade.fence_unverified('orders', 9223372036854775807)".into(),
        "SELECT fence FROM palisade.fences".into(),
        "SELECT palisade.set_keys('{}')".into(),
    ] {
        let err = mallory.query(sql.as_str(), &[]).await.expect_err(&sql);
        assert_eq!(sqlstate(&err), "42501", "{sql}: {err}");
    }
    for (setting, write) in [
        (
            mark.as_str(),
            "INSERT INTO shop (lease, v) VALUES ('orders', 2)",
        ),
        (mark.as_str(), "INSERT INTO ledger VALUES (2)"),
        (
            ",orders:1:00000000000000000000000000000000",
            "UPDATE shop SET v = 3",
        ),
        ("", "TRUNCATE shop"),
        ("", "DELETE FROM ledger"),
    ] {
        mallory.batch_execute("BEGIN").await.expect("begin");
        mallory
            .execute(
                "SELECT set_config('palisade.fenced', $1, true)",
                &[&setting],
            )
            .await
            .expect("set_config is open to every role");
        let err = mallory.execute(write, &[]).await.expect_err(write);
        assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{write}: {err}");
        mallory.batch_execute("ROLLBACK").await.expect("rollback");
    }

    // app may call palisade.fence, but with no proof of its own nothing passes.
    let mut app = connect_as(&pg, "app").await;
    let (header, claims, signature) = parts(&a_jwt);
    let mut raised = claims.clone();
    raised["token"] = json!(i64::MAX);
    let mut other_lease = claims.clone();
    other_lease["lease"] = json!("ledger");
    let forged = [
        // Signed by the attacker under the cluster's key id.
        sign(&attacker_key(), &header, &raised),
        // The holder's signature on claims it did not sign.
        format!("{}.{}.{signature}", encode(&header), encode(&raised)),
        format!("{}.{}.{signature}", encode(&header), encode(&other_lease)),
        // An unsigned token ("alg": "none"), and junk.
        format!("{}.{}.", encode(&json!({"alg": "none"})), encode(&raised)),
        "x.y.z".into(),
        String::new(),
    ];
    for proof in &forged {
        for lease in ["orders", "ledger"] {
            let tx = app.transaction().await.expect("begin");
            let err = tx
                .query_one("SELECT palisade.fence($1, $2)", &[&lease, proof])
                .await
                .expect_err("a forged proof");
            let (state, text) = refusal(&err);
            assert_eq!(state, postgres::PROOF_REFUSED, "{proof}: {text}");
            assert!(!text.contains("fence="), "{text}");
            assert!(!mentions(&text, a.token()), "learned the fence: {text}");
        }
    }
    // A's genuine JWT names its own lease only.
    let tx = app.transaction().await.expect("begin");
    let err = postgres::fence(&tx, "ledger", &a_jwt).await;
    assert!(matches!(err, Err(Error::Unauthorized(_))), "{err:?}");
    drop(tx);
    assert_eq!(fence_of(&owner, "orders").await, a.token() as i64);

    // Locks mallory can take (the advisory keys of schema 1) do not stall B's raise.
    mallory
        .batch_execute(
            "SELECT pg_advisory_lock_shared(hashtextextended('palisade.fence/orders', 0));
             SELECT pg_advisory_lock(hashtextextended('palisade.fence/orders', 0));",
        )
        .await
        .expect("advisory locks are open to every role");
    a.release().await.expect("A releases");
    let b = client
        .acquire(
            "orders",
            "B",
            Duration::from_secs(5),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("B acquires");
    let mut b_conn = connect_as(&pg, "app").await;
    b_conn
        .batch_execute("SET statement_timeout = 10000")
        .await
        .expect("timeout");
    let started = Instant::now();
    let tx = b
        .fenced_transaction(&mut b_conn)
        .await
        .expect("B raises the fence");
    tx.commit().await.expect("B commits");
    eprintln!(
        "B's raise took {:?} while mallory held the advisory locks",
        started.elapsed()
    );
    assert_eq!(fence_of(&owner, "orders").await, b.token() as i64);

    // A's genuine JWT, now stale: PF001, and the refusal does not tell B's token.
    let tx = app.transaction().await.expect("begin");
    let stale = tx
        .query_one("SELECT palisade.fence('orders', $1)", &[&a_jwt])
        .await
        .expect_err("stale");
    let (state, text) = refusal(&stale);
    assert_eq!(state, postgres::STALE_TOKEN, "{text}");
    assert!(!mentions(&text, b.token()), "learned the fence: {text}");
    assert_eq!(
        postgres::fence_error(&stale, 0),
        Error::Fenced {
            token: a_token,
            fence: 0
        }
    );
}

/// Guards cannot be escaped through partitions, inheritance children,
/// TRUNCATE, or a lease column holding what looks like several leases.
#[tokio::test]
async fn partitions_truncate_and_odd_lease_values_are_guarded() {
    let Some(pg) = PgServer::start() else { return };
    let mut db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    db.batch_execute(
        "CREATE TABLE parted (lease text, v int) PARTITION BY LIST (lease);
         CREATE TABLE parted_a PARTITION OF parted FOR VALUES IN ('a');
         CREATE TABLE parent (lease text); CREATE TABLE child () INHERITS (parent);
         CREATE TABLE rows (lease text, v int);",
    )
    .await
    .expect("tables");
    // A partitioned table may be guarded (guards_hold_for_writes_through_every_parent);
    // an inheritance parent may not: its triggers never see a write into a child.
    for (sql, needle) in [
        (
            "SELECT palisade.guard('parent', 'lease')",
            "inheritance children",
        ),
        (
            "SELECT palisade.guard_table('parent', 'a')",
            "inheritance children",
        ),
    ] {
        let err = db.execute(sql, &[]).await.expect_err(sql);
        let (state, text) = refusal(&err);
        assert_eq!(state, postgres::UNFENCED_WRITE, "{sql}: {text}");
        assert!(text.contains(needle), "{sql}: {text}");
    }
    db.batch_execute(
        "SELECT palisade.guard('parted_a', 'lease');
         SELECT palisade.guard('rows', 'lease');",
    )
    .await
    .expect("a partition is guarded as a table");
    for write in [
        "INSERT INTO parted_a VALUES ('a', 1)",
        "INSERT INTO parted VALUES ('a', 1)",
        "TRUNCATE parted_a",
        "TRUNCATE parted",
    ] {
        let err = db.execute(write, &[]).await.expect_err(write);
        assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{write}: {err}");
    }

    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "a", 1)
        .await
        .expect("fence a");
    postgres::fence_unverified(&tx, "b", 1)
        .await
        .expect("fence b");
    for lease in ["a:1,b", "a:1", ",a", "b,", "a:1:x"] {
        tx.batch_execute("SAVEPOINT s").await.expect("savepoint");
        let err = tx
            .execute("INSERT INTO rows VALUES ($1, 1)", &[&lease])
            .await
            .expect_err(lease);
        assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{lease}: {err}");
        tx.batch_execute("ROLLBACK TO SAVEPOINT s")
            .await
            .expect("rollback to");
    }
    tx.execute("INSERT INTO parted VALUES ('a', 2)", &[])
        .await
        .expect("a fenced write through the parent");
    tx.execute("INSERT INTO rows VALUES ('b', 2)", &[])
        .await
        .expect("a fenced row");
    tx.commit().await.expect("commit");

    // A genuine mark that outlived its lock (a savepoint rolled back) does
    // not pass once another token raised the fence meanwhile.
    let other = pg.connect().await;
    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("SAVEPOINT s").await.expect("savepoint");
    postgres::fence_unverified(&tx, "sp", 1)
        .await
        .expect("fence");
    let mark: String = tx
        .query_one("SELECT current_setting('palisade.fenced')", &[])
        .await
        .expect("mark")
        .get(0);
    tx.batch_execute("ROLLBACK TO SAVEPOINT s")
        .await
        .expect("rollback to");
    tx.execute("SELECT set_config('palisade.fenced', $1, true)", &[&mark])
        .await
        .expect("the mark put back");
    other
        .batch_execute("BEGIN; SET LOCAL lock_timeout = 5000; SELECT palisade.fence_unverified('sp', 2); COMMIT;")
        .await
        .expect("the raise does not wait: the savepoint's lock is gone");
    let err = tx
        .execute("INSERT INTO rows VALUES ('sp', 1)", &[])
        .await
        .expect_err("a write under a mark whose fence was raised");
    assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{err}");
    drop(tx);

    // The guard reads the lease column alone: a cast another column's type
    // defines never runs as the schema's owner.
    db.batch_execute(
        "CREATE TABLE cast_log (who text);
         CREATE TYPE mood AS ENUM ('x');
         CREATE FUNCTION mood_json(mood) RETURNS json LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO cast_log VALUES (current_user); RETURN '\"x\"'; END $$;
         CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood);
         CREATE TABLE moods (lease text, m mood);
         SELECT palisade.guard('moods', 'lease');",
    )
    .await
    .expect("a table with a cast of its own");
    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "a", 1)
        .await
        .expect("fence");
    tx.execute("INSERT INTO moods VALUES ('a', 'x')", &[])
        .await
        .expect("a fenced write");
    tx.commit().await.expect("commit");
    let casts: i64 = db
        .query_one("SELECT count(*) FROM cast_log", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(casts, 0, "the guard ran a user's cast");
}

/// A JWT signed by a rotated-in key is refused until `palisade sql keys`
/// installs the key, then accepted; once the cluster retires the old key,
/// `palisade sql keys` removes it and a JWT it signed (even one proven and
/// cached before) is refused — as the gateway does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_and_retirement_reach_the_database() {
    let _serial = SERIAL.lock().await;
    let Some(pg) = PgServer::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    // Tokens live at most 1 s: a rotated-out key retires some 4 s later.
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args = vec!["--max-ttl-ms".into(), "1000".into()];
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    cluster.leader(&http_client()).await;
    let mut db = database(&pg, &cluster).await;
    let client = sdk(&cluster, None);
    let old = client
        .acquire("old", "h", Duration::from_millis(1000), None)
        .await
        .expect("acquire");
    let old_jwt = old.jwt().expect("held");
    postgres::prove(&db, &old_jwt)
        .await
        .expect("proven and cached");
    drop(old);

    let kid = client.rotate_key().await.expect("rotate");
    let new = client
        .acquire("new", "h", Duration::from_millis(1000), None)
        .await
        .expect("acquire");
    let new_jwt = new.jwt().expect("held");
    assert_eq!(parts(&new_jwt).0["kid"], json!(kid));
    let refused = fence_once(&mut db, "new", new_jwt.clone()).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("does not trust")),
        "{refused:?}"
    );
    let out = sync_keys(&pg, &cluster);
    assert!(out.contains(&kid), "{out}");
    assert_eq!(
        fence_once(&mut db, "new", new_jwt.clone()).await,
        Ok(new.token())
    );
    assert_eq!(
        fence_once(&mut db, "old", old_jwt.clone()).await.map(drop),
        Ok(())
    );

    let old_kid = parts(&old_jwt).0["kid"].as_str().expect("kid").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while support::kids_of(&client.jwks().await.expect("jwks")).contains(&old_kid) {
        assert!(Instant::now() < deadline, "the old key was never retired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sync_keys(&pg, &cluster);
    let refused = fence_once(&mut db, "old", old_jwt).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("does not trust")),
        "{refused:?}"
    );
    assert_eq!(
        fence_once(&mut db, "new", new_jwt.clone()).await.map(drop),
        Ok(())
    );

    // Once its exp (plus the leeway, 0 here) has passed, a JWT is refused.
    db.batch_execute("UPDATE palisade.settings SET exp_leeway_secs = 0")
        .await
        .expect("leeway");
    let exp = parts(&new_jwt).1["exp"].as_u64().expect("exp");
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        <= exp
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = fence_once(&mut db, "new", new_jwt).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("expired")),
        "{refused:?}"
    );
}

/// `palisade.fence(lease, jwt)` in a transaction rolled back.
async fn fence_once(
    db: &mut tokio_postgres::Client,
    lease: &str,
    jwt: String,
) -> Result<u64, Error> {
    let tx = db.transaction().await.expect("begin");
    let fenced = postgres::fence(&tx, lease, &jwt).await;
    tx.rollback().await.expect("rollback");
    fenced
}

/// `palisade.ed_verify` (RFC 8032 in PL/pgSQL) against ed25519-dalek:
/// RFC 8032's first test vector, then random keys and messages, each with
/// its signature, a changed message, a changed R, S + L, and another key.
#[tokio::test]
async fn the_sql_ed25519_check_agrees_with_dalek() {
    let Some(pg) = PgServer::start() else { return };
    let db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    let verify = |pk: Vec<u8>, msg: Vec<u8>, sig: Vec<u8>| {
        let db = &db;
        async move {
            let row = db
                .query_one(
                    "SELECT palisade.ed_verify(p[1], p[2], $1, $2, $3)
                     FROM (SELECT palisade.ed_decompress($1) AS p) z",
                    &[&pk, &msg, &sig],
                )
                .await
                .expect("verify");
            row.get::<_, Option<bool>>(0)
        }
    };
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    };
    let rfc_pk = hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
    let rfc_sig = hex(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    );
    assert_eq!(
        verify(rfc_pk.clone(), vec![], rfc_sig.clone()).await,
        Some(true)
    );
    assert_eq!(verify(rfc_pk, vec![0], rfc_sig).await, Some(false));

    // L, little-endian: S + L is the same scalar, refused as non-canonical.
    let l = hex("edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010");
    for round in 0..12u8 {
        let key = attacker_key();
        let pk = key.verifying_key().to_bytes().to_vec();
        let msg: Vec<u8> = (0..(round as usize * 7)).map(|_| rand::random()).collect();
        let sig = key.sign(&msg).to_bytes().to_vec();
        assert_eq!(
            verify(pk.clone(), msg.clone(), sig.clone()).await,
            Some(true)
        );
        let mut other = msg.clone();
        other.push(round);
        assert_eq!(verify(pk.clone(), other, sig.clone()).await, Some(false));
        let mut bad_r = sig.clone();
        bad_r[usize::from(round) % 32] ^= 1;
        assert_eq!(verify(pk.clone(), msg.clone(), bad_r).await, Some(false));
        let mut s_plus_l = sig.clone();
        let mut carry = 0u16;
        for i in 0..32 {
            let sum = u16::from(s_plus_l[32 + i]) + u16::from(l[i]) + carry;
            s_plus_l[32 + i] = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(verify(pk.clone(), msg.clone(), s_plus_l).await, Some(false));
        let stranger = attacker_key().verifying_key().to_bytes().to_vec();
        assert_eq!(verify(stranger, msg, sig).await, Some(false));
    }
}

/// `COPY table FROM STDIN` of `rows` (text format).
async fn copy_rows(
    client: &tokio_postgres::Client,
    table: &str,
    rows: &'static str,
) -> Result<u64, tokio_postgres::Error> {
    let statement = format!("COPY {table} FROM STDIN");
    let sink = client
        .copy_in::<_, &'static [u8]>(statement.as_str())
        .await?;
    let mut sink = std::pin::pin!(sink);
    sink.send(rows.as_bytes()).await?;
    sink.finish().await
}

/// Each of `writes`, by `client` outside a transaction, fails with PF002.
async fn all_refused(client: &tokio_postgres::Client, writes: &[String]) {
    for write in writes {
        let err = client.batch_execute(write).await.expect_err(write.as_str());
        assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{write}: {err}");
    }
}

/// Every form of write through `parent` that reaches its rows of lease `a`:
/// INSERT (plain, ON CONFLICT, MERGE's), UPDATE, DELETE, MERGE's UPDATE and
/// DELETE, TRUNCATE. (COPY: [`copy_rows`].)
fn writes_through(parent: &str) -> Vec<String> {
    [
        "INSERT INTO {p} VALUES ('a', 1)",
        "INSERT INTO {p} VALUES ('a', 1) ON CONFLICT DO NOTHING",
        "UPDATE {p} SET v = v + 1 WHERE lease = 'a'",
        "DELETE FROM {p} WHERE lease = 'a'",
        "MERGE INTO {p} t USING (SELECT 'a' AS l) s ON t.lease = s.l WHEN MATCHED THEN UPDATE SET v = t.v + 1",
        "MERGE INTO {p} t USING (SELECT 'a' AS l) s ON t.lease = s.l WHEN MATCHED THEN DELETE",
        "MERGE INTO {p} t USING (SELECT 'none' AS l) s ON t.lease = s.l WHEN NOT MATCHED THEN INSERT VALUES ('a', 2)",
        "TRUNCATE {p}",
    ]
    .iter()
    .map(|write| write.replace("{p}", parent))
    .collect()
}

/// A guard on a LIST partition, a RANGE partition or an inheritance child
/// (`guard_table` and `guard` alike) holds for every write made through
/// the parent by a role without the lease: INSERT, UPDATE, DELETE, MERGE,
/// COPY and TRUNCATE are all refused, rows moved into the guarded table
/// too (statement triggers fire only for the table a statement names).
/// A guarded partitioned table covers its partitions, writes straight into
/// them, and partitions made or attached later (refused until the guard
/// runs again, which guards their TRUNCATE). A fenced transaction still
/// writes through every parent.
#[tokio::test]
async fn guards_hold_for_writes_through_every_parent() {
    let Some(pg) = PgServer::start() else { return };
    let mut db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    db.batch_execute(
        "CREATE ROLE mallory LOGIN;
         CREATE TABLE by_list (lease text, v int) PARTITION BY LIST (lease);
         CREATE TABLE by_list_a PARTITION OF by_list FOR VALUES IN ('a');
         CREATE TABLE by_list_b PARTITION OF by_list FOR VALUES IN ('b');
         CREATE TABLE by_range (lease text, v int) PARTITION BY RANGE (v);
         CREATE TABLE by_range_low PARTITION OF by_range FOR VALUES FROM (0) TO (100);
         CREATE TABLE by_range_high PARTITION OF by_range FOR VALUES FROM (100) TO (200);
         CREATE TABLE family (lease text, v int);
         CREATE TABLE child () INHERITS (family);
         GRANT ALL ON by_list, by_list_a, by_list_b, by_range, by_range_low, by_range_high,
                      family, child TO mallory;
         SELECT palisade.guard_table('by_list_a', 'a');
         SELECT palisade.guard_table('by_range_low', 'a');
         SELECT palisade.guard_table('child', 'a');",
    )
    .await
    .expect("tables");
    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "a", 1)
        .await
        .expect("fence");
    tx.batch_execute(
        "INSERT INTO by_list VALUES ('a', 1);
         INSERT INTO by_range VALUES ('a', 1);
         INSERT INTO child VALUES ('a', 1);",
    )
    .await
    .expect("fenced writes through the parents");
    tx.commit().await.expect("commit");

    let mallory = connect_as(&pg, "mallory").await;
    let guarded_rows = "SELECT count(*), sum(v) FROM (SELECT v FROM by_list_a UNION ALL
                        SELECT v FROM by_range_low UNION ALL SELECT v FROM child) g";
    for guards in [
        "SELECT palisade.guard_table('by_list_a', 'a');
         SELECT palisade.guard_table('by_range_low', 'a');
         SELECT palisade.guard_table('child', 'a');",
        "SELECT palisade.guard('by_list_a', 'lease');
         SELECT palisade.guard('by_range_low', 'lease');
         SELECT palisade.guard('child', 'lease');",
    ] {
        db.batch_execute(guards).await.expect(guards);
        // The unguarded siblings stay open to mallory.
        mallory
            .batch_execute(
                "INSERT INTO by_list VALUES ('b', 5);
                 INSERT INTO by_range VALUES ('a', 150);
                 INSERT INTO family VALUES ('a', 7);",
            )
            .await
            .expect("writes that reach no guarded table");
        let mut writes = writes_through("by_list");
        writes.extend(writes_through("by_range"));
        writes.extend([
            // Rows moved into the guarded partition.
            "UPDATE by_list SET lease = 'a' WHERE lease = 'b'".to_owned(),
            "UPDATE by_range SET v = 50 WHERE v >= 100".to_owned(),
            // An inheritance parent's UPDATE, DELETE, MERGE and TRUNCATE reach
            // the child (its INSERT and COPY write the parent itself).
            "UPDATE family SET v = v + 1".to_owned(),
            "DELETE FROM family".to_owned(),
            "MERGE INTO family t USING (SELECT 'a' AS l) s ON t.lease = s.l WHEN MATCHED THEN UPDATE SET v = t.v + 1".to_owned(),
            "MERGE INTO family t USING (SELECT 'a' AS l) s ON t.lease = s.l WHEN MATCHED THEN DELETE".to_owned(),
            "TRUNCATE family".to_owned(),
        ]);
        all_refused(&mallory, &writes).await;
        for parent in ["by_list", "by_range"] {
            let err = copy_rows(&mallory, parent, "a\t3\n")
                .await
                .expect_err(parent);
            assert_eq!(
                sqlstate(&err),
                postgres::UNFENCED_WRITE,
                "COPY {parent}: {err}"
            );
        }
        copy_rows(&mallory, "family", "a\t3\n")
            .await
            .expect("COPY into an inheritance parent writes the parent itself");
        let row = db.query_one(guarded_rows, &[]).await.expect("count");
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (3, 3),
            "{guards}"
        );
    }

    // A partitioned table guarded itself covers every partition, and writes
    // straight into one; not together with a guard of a partition's own.
    let err = db
        .batch_execute("SELECT palisade.guard_table('by_list', 'a')")
        .await
        .expect_err("a partition is guarded on its own");
    let (state, text) = refusal(&err);
    assert_eq!(state, postgres::UNFENCED_WRITE, "{text}");
    assert!(text.contains("guarded on its own"), "{text}");
    db.batch_execute(
        "SELECT palisade.unguard('by_list_a');
         SELECT palisade.unguard('by_range_low');
         SELECT palisade.guard_table('by_list', 'a');
         SELECT palisade.guard('by_range', 'lease');",
    )
    .await
    .expect("the partitioned tables guarded");
    let err = db
        .batch_execute("SELECT palisade.guard('by_list_a', 'lease')")
        .await
        .expect_err("a partition its parent's guard covers");
    let (state, text) = refusal(&err);
    assert_eq!(state, postgres::UNFENCED_WRITE, "{text}");
    assert!(text.contains("covers it"), "{text}");
    let mut writes = writes_through("by_list");
    writes.extend(writes_through("by_range"));
    writes.extend(
        [
            "INSERT INTO by_list_b VALUES ('b', 1)",
            "UPDATE by_list_b SET v = v + 1",
            "TRUNCATE by_list_b",
            "INSERT INTO by_range_high VALUES ('a', 150)",
            "DELETE FROM by_range_high",
            "TRUNCATE by_range_low",
        ]
        .map(str::to_owned),
    );
    all_refused(&mallory, &writes).await;
    for table in ["by_list", "by_list_b", "by_range", "by_range_high"] {
        let count = format!("SELECT count(*) FROM {table}");
        let before: i64 = db.query_one(&count, &[]).await.expect("count").get(0);
        // On a session of its own: a COPY refused mid-stream can leave the
        // driver's session unusable.
        let copier = connect_as(&pg, "mallory").await;
        let err = copy_rows(&copier, table, "b\t150\n")
            .await
            .expect_err(table);
        // Refused at the statement (a parent's statement trigger) the
        // driver reports PF002; refused at the first row (a partition's
        // cloned row trigger, mid-COPY) it may report only an unexpected
        // message: then nothing may have been written.
        if err.code().is_some() {
            assert_eq!(
                sqlstate(&err),
                postgres::UNFENCED_WRITE,
                "COPY {table}: {err}"
            );
        }
        let after: i64 = db.query_one(&count, &[]).await.expect("count").get(0);
        assert_eq!(before, after, "COPY {table} wrote: {err}");
    }

    // Partitions made or attached after the guard: their rows are guarded
    // (row triggers are cloned to them), and every write is refused until
    // the guard runs again and guards their TRUNCATE too.
    db.batch_execute(
        "CREATE TABLE by_list_c PARTITION OF by_list FOR VALUES IN ('c');
         CREATE TABLE by_range_top (lease text, v int);
         INSERT INTO by_range_top VALUES ('a', 250);
         ALTER TABLE by_range ATTACH PARTITION by_range_top FOR VALUES FROM (200) TO (300);
         GRANT ALL ON by_list_c, by_range_top TO mallory;",
    )
    .await
    .expect("later partitions");
    all_refused(
        &mallory,
        &[
            "INSERT INTO by_list VALUES ('c', 1)",
            "INSERT INTO by_list_c VALUES ('c', 1)",
            "UPDATE by_range SET v = v + 1 WHERE v >= 200",
            "DELETE FROM by_range_top",
        ]
        .map(str::to_owned),
    )
    .await;
    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "a", 1)
        .await
        .expect("fence");
    let err = tx
        .execute("INSERT INTO by_list VALUES ('c', 1)", &[])
        .await
        .expect_err("a partition attached after the guard");
    let (state, text) = refusal(&err);
    assert_eq!(state, postgres::UNFENCED_WRITE, "{text}");
    assert!(text.contains("attached after the guard"), "{text}");
    drop(tx);
    db.batch_execute(
        "SELECT palisade.guard_table('by_list', 'a');
         SELECT palisade.guard('by_range', 'lease');",
    )
    .await
    .expect("guarded again");
    all_refused(
        &mallory,
        &[
            "INSERT INTO by_list_c VALUES ('c', 1)",
            "TRUNCATE by_list_c",
            "DELETE FROM by_range_top",
            "TRUNCATE by_range_top",
        ]
        .map(str::to_owned),
    )
    .await;

    // The fenced path: every form of write through every parent passes
    // (TRUNCATE where the guard allows it: a table guarded by one lease).
    db.batch_execute("BEGIN; SELECT palisade.fence_unverified('a', 1);")
        .await
        .expect("fence");
    db.batch_execute(
        "INSERT INTO by_list VALUES ('a', 3), ('c', 3);
         UPDATE by_list SET v = v + 1;
         MERGE INTO by_list t USING (SELECT 'c' AS l) s ON t.lease = s.l
           WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT VALUES ('c', 4);
         INSERT INTO by_range VALUES ('a', 3), ('a', 203);
         UPDATE by_range SET v = v + 1 WHERE lease = 'a';
         MERGE INTO by_range t USING (SELECT 204 AS w) s ON t.v = s.w
           WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT VALUES ('a', 204);
         DELETE FROM by_range WHERE v = 5;
         UPDATE family SET v = v + 1;
         DELETE FROM family WHERE v > 100;",
    )
    .await
    .expect("fenced writes through every parent");
    for (parent, rows) in [("by_list", "a\t9\nc\t9\n"), ("by_range", "a\t9\na\t209\n")] {
        copy_rows(&db, parent, rows)
            .await
            .unwrap_or_else(|err| panic!("a fenced COPY into {parent}: {err}"));
    }
    db.batch_execute("TRUNCATE by_list; COMMIT;")
        .await
        .expect("a fenced TRUNCATE of a table guarded by the lease");
    let err = db
        .batch_execute("BEGIN; SELECT palisade.fence_unverified('a', 1); TRUNCATE by_range;")
        .await
        .expect_err("TRUNCATE of a table guarded by a lease column");
    assert_eq!(sqlstate(&err), postgres::UNFENCED_WRITE, "{err}");
    db.batch_execute("ROLLBACK").await.expect("rollback");
    let rows: i64 = db
        .query_one("SELECT count(*) FROM by_list", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0);
}

/// The JWKS `GET /v1/jwks` would answer for `keys` (kid, key).
fn jwks_of(keys: &[(&str, &SigningKey)], applied_index: u64) -> Value {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(kid, key)| {
            json!({
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": kid,
                "x": URL_SAFE_NO_PAD.encode(key.verifying_key().to_bytes()),
            })
        })
        .collect();
    json!({ "keys": keys, "applied_index": applied_index })
}

/// A lease JWT as the cluster signs one: `key` under `kid`.
fn lease_jwt(kid: &str, key: &SigningKey, lease: &str, token: u64, exp: u64) -> String {
    sign(
        key,
        &json!({ "alg": "EdDSA", "typ": "JWT", "kid": kid }),
        &json!({ "iss": "palisade", "lease": lease, "token": token, "exp": exp }),
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A role allowed to fence that leaves a transaction open after
/// `palisade.prove` (holding the proof it cached, and an expired one it
/// deleted) cannot block `palisade.set_keys`: the old key is retired at
/// once, its JWTs are refused (the open transaction's proof too, once
/// committed), and the new key's JWTs work.
#[tokio::test]
async fn a_transaction_left_open_after_prove_does_not_block_set_keys() {
    let Some(pg) = PgServer::start() else { return };
    let mut db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    db.batch_execute("CREATE ROLE app LOGIN")
        .await
        .expect("role");
    postgres::allow(&db, "app").await.expect("allow");
    let (old, new) = (attacker_key(), attacker_key());
    postgres::set_keys(&db, &jwks_of(&[("old", &old)], 1))
        .await
        .expect("the old key");
    let now = unix_now();
    // A higher token than the new key's JWTs below: once its key is
    // retired, its proof announces nothing either.
    let expired = lease_jwt("old", &old, "orders", 1, now - 100);
    let cached = lease_jwt("old", &old, "orders", 10, now + 3600);

    let app = connect_as(&pg, "app").await;
    db.batch_execute("UPDATE palisade.settings SET exp_leeway_secs = 3600")
        .await
        .expect("leeway");
    postgres::prove(&app, &expired)
        .await
        .expect("proven within the leeway");
    db.batch_execute("UPDATE palisade.settings SET exp_leeway_secs = 10")
        .await
        .expect("leeway");
    // app proves a JWT in a transaction it leaves open: it holds the row it
    // cached (and, before schema 3, a lock on its key's row) and the row
    // of the expired proof it deleted.
    app.batch_execute("BEGIN").await.expect("begin");
    postgres::prove(&app, &cached).await.expect("proven");

    // Without the fix set_keys waits for app forever; the timeout fails
    // the test instead of hanging it.
    db.batch_execute("SET statement_timeout = 20000")
        .await
        .expect("timeout");
    let started = Instant::now();
    let installed = postgres::set_keys(&db, &jwks_of(&[("new", &new)], 2))
        .await
        .expect("set_keys is not blocked by app's transaction");
    assert_eq!(installed, 1);
    eprintln!(
        "set_keys took {:?} beside app's open transaction",
        started.elapsed()
    );
    let refused = fence_once(&mut db, "orders", cached.clone()).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("does not trust")),
        "{refused:?}"
    );
    let next = lease_jwt("new", &new, "orders", 3, now + 3600);
    assert_eq!(fence_once(&mut db, "orders", next.clone()).await, Ok(3));
    assert_eq!(postgres::prove(&db, &next).await, Ok(3));

    // app commits: the proof it cached under the retired key counts for
    // nothing (neither as a proof nor as an announced token).
    app.batch_execute("COMMIT").await.expect("commit");
    let refused = fence_once(&mut db, "orders", cached).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("does not trust")),
        "{refused:?}"
    );
    assert_eq!(fence_once(&mut db, "orders", next).await, Ok(3));

    // A key set installed again and again beside an open prove.
    app.batch_execute("BEGIN").await.expect("begin");
    let newest = lease_jwt("new", &new, "orders", 4, now + 3600);
    postgres::prove(&app, &newest).await.expect("proven");
    let newer = attacker_key();
    postgres::set_keys(&db, &jwks_of(&[("new", &new), ("newer", &newer)], 3))
        .await
        .expect("set_keys beside an open prove of a kept key");
    postgres::set_keys(&db, &jwks_of(&[("newer", &newer)], 4))
        .await
        .expect("set_keys retiring the key app's open transaction proved with");
    app.batch_execute("ROLLBACK").await.expect("rollback");
    let refused = fence_once(&mut db, "orders", newest).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("does not trust")),
        "{refused:?}"
    );
    let last = lease_jwt("newer", &newer, "orders", 5, now + 3600);
    assert_eq!(fence_once(&mut db, "orders", last).await, Ok(5));
}

/// `palisade.set_keys` refuses the 8 points of small order (which accept
/// signatures nobody made) and an `x` whose base64url is not canonical;
/// `palisade.prove` refuses a JWT spelled with non-canonical base64url (the
/// same bytes as a genuine one, another text); the genuine ones pass.
#[tokio::test]
async fn small_order_keys_and_non_canonical_encodings_are_refused() {
    let Some(pg) = PgServer::start() else { return };
    let db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    };
    let small_order = [
        "0100000000000000000000000000000000000000000000000000000000000000",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    ];
    let jwk = |x: String| {
        json!({
            "keys": [{ "kty": "OKP", "crv": "Ed25519", "kid": "k", "x": x }],
            "applied_index": 1,
        })
    };
    for point in small_order {
        let refused = postgres::set_keys(&db, &jwk(URL_SAFE_NO_PAD.encode(hex(point)))).await;
        assert!(
            matches!(&refused, Err(Error::Database(m)) if m.starts_with("22023") && m.contains("small order")),
            "{point}: {refused:?}"
        );
    }

    // Flipping a bit the last character of base64url leaves unused: the
    // same bytes to a lenient decoder, another text.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let respelled = |text: &str| -> String {
        let last = *text.as_bytes().last().expect("text");
        let index = ALPHABET.iter().position(|&c| c == last).expect("base64url");
        format!(
            "{}{}",
            &text[..text.len() - 1],
            char::from(ALPHABET[index ^ 1])
        )
    };
    let key = attacker_key();
    let x = URL_SAFE_NO_PAD.encode(key.verifying_key().to_bytes());
    let refused = postgres::set_keys(&db, &jwk(respelled(&x))).await;
    assert!(
        matches!(&refused, Err(Error::Database(m)) if m.contains("not canonical base64url")),
        "{refused:?}"
    );
    assert_eq!(postgres::set_keys(&db, &jwk(x)).await, Ok(1));

    let jwt = lease_jwt("k", &key, "orders", 7, unix_now() + 3600);
    // The signature (64 bytes: 86 characters, 4 bits unused) respelled.
    let refused = postgres::prove(&db, &respelled(&jwt)).await;
    assert!(
        matches!(&refused, Err(Error::Unauthorized(m)) if m.contains("canonical")),
        "{refused:?}"
    );
    assert_eq!(postgres::prove(&db, &jwt).await, Ok(7));
}
