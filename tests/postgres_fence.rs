//! Fenced transactions in a real PostgreSQL that the test starts itself
//! (Debian's binaries, run as the `postgres` user when the test runs as
//! root): a paused leader cannot commit after its successor, guard mode
//! refuses unfenced writes, bad input is refused clearly, and
//! `palisade sql` installs idempotently.
//!
//! Skipped (with a message) only when `/usr/lib/postgresql/15/bin` is
//! missing and `PALISADE_PG_STRICT` is unset.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_client::postgres::{self, tokio_postgres};
use palisade_client::{ClientConfig, Error};
use support::pg::PgServer;
use support::{http_client, sdk, Cluster};

fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_default()
}

/// The paused leader, run as a child process of this test binary (so it can
/// be frozen with SIGSTOP): holds `orders` as `A` (ttl 1 s), commits a
/// fenced row every 20 ms, printing `wrote N`; on the first refused fenced
/// transaction prints `refused <error>` and ends.
#[tokio::test]
#[ignore = "run by the_paused_leader_cannot_commit_after_its_successor"]
async fn paused_leader_child() {
    let (Ok(urls), Ok(db)) = (std::env::var("PGF_ELECTION"), std::env::var("PGF_DB")) else {
        return;
    };
    let client = palisade_client::Client::new(ClientConfig::new(
        urls.split(',').map(str::to_owned).collect::<Vec<_>>(),
    ));
    let lease = client
        .acquire(
            "orders",
            "A",
            Duration::from_millis(1000),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("A acquires");
    println!("PGF token {}", lease.token());
    let (mut pg, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    for seq in 0.. {
        let tx = match lease.fenced_transaction(&mut pg).await {
            Ok(tx) => tx,
            Err(err) => {
                println!("PGF refused lost={} {err:?}", err.is_lease_lost());
                return;
            }
        };
        let inserted = tx
            .execute(
                "INSERT INTO rows (writer, token, seq) VALUES ('A', $1, $2)",
                &[&(lease.token() as i64), &seq],
            )
            .await;
        match inserted {
            Ok(_) => match tx.commit().await {
                Ok(()) => println!("PGF wrote {seq}"),
                Err(err) => println!("PGF commit failed {err}"),
            },
            Err(err) => println!("PGF insert failed {err}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Spawns the child leader; its stdout lines are gathered in the answer.
fn spawn_child(cluster: &Cluster, pg: &PgServer) -> (std::process::Child, Arc<Mutex<Vec<String>>>) {
    // The test's name as the harness knows it: its module path without the
    // binary's name (`postgres_fence::paused_leader_child` in `integration`).
    let name = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::paused_leader_child"),
        None => "paused_leader_child".to_owned(),
    };
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &name,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PGF_ELECTION", cluster.urls().join(","))
        .env("PGF_DB", pg.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child leader");
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let stdout = child.stdout.take().expect("stdout");
    let gathered = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The harness may print `test ... ` before the child's line.
            if let Some((_, said)) = line.split_once("PGF ") {
                gathered.lock().expect("lock").push(said.to_owned());
            }
        }
    });
    (child, lines)
}

/// The cluster's JWKS once it holds a key: a new leader installs its
/// signing key in an entry of its own after it is elected, so a JWKS read
/// the moment a leader exists can be empty (a run under load handed the
/// database no key, and the fence then refused every JWT).
async fn signing_keys(client: &palisade_client::Client) -> serde_json::Value {
    for _ in 0..100 {
        let jwks = client.jwks().await.expect("jwks");
        if !support::kids_of(&jwks).is_empty() {
            return jwks;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no signing key published within 10 s");
}

async fn wait_for(lines: &Mutex<Vec<String>>, what: &str, found: impl Fn(&[String]) -> bool) {
    let started = Instant::now();
    while !found(&lines.lock().expect("lock")) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "child never {what}: {:?}",
            lines.lock()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig}");
}

/// The paused-leader story: A commits fenced rows, is frozen past its ttl;
/// B acquires and commits a fenced row; A resumes and its next fenced
/// transaction is refused. No row of A's follows B's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paused_leader_cannot_commit_after_its_successor() {
    let Some(pg) = PgServer::start() else { return };
    let db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    db.batch_execute(
        "CREATE TABLE rows (id bigserial PRIMARY KEY, writer text, token bigint, seq int)",
    )
    .await
    .expect("create table");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    cluster.leader(&http_client()).await;
    let jwks = signing_keys(&sdk(&cluster, None)).await;
    postgres::set_keys(&db, &jwks).await.expect("keys");
    let (mut child, lines) = spawn_child(&cluster, &pg);
    wait_for(&lines, "wrote 3 rows", |l| {
        l.iter().filter(|l| l.starts_with("wrote")).count() >= 3
    })
    .await;
    signal(&child, "-STOP");

    let b = sdk(&cluster, None);
    let lease_b = b
        .acquire(
            "orders",
            "B",
            Duration::from_millis(5000),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("B acquires once A's grant expires");
    let mut pg_b = pg.connect().await;
    let tx = lease_b
        .fenced_transaction(&mut pg_b)
        .await
        .expect("B fences");
    tx.execute(
        "INSERT INTO rows (writer, token, seq) VALUES ('B', $1, 0)",
        &[&(lease_b.token() as i64)],
    )
    .await
    .expect("B writes");
    tx.commit().await.expect("B commits");

    signal(&child, "-CONT");
    wait_for(&lines, "was refused", |l| {
        l.iter().any(|l| l.starts_with("refused"))
    })
    .await;
    let _ = child.wait();
    let seen = lines.lock().expect("lock").clone();
    let refused = seen
        .iter()
        .find(|l| l.starts_with("refused"))
        .expect("refused line");
    eprintln!("A after resuming: {refused}");
    assert!(refused.starts_with("refused lost=true"), "{seen:?}");
    assert!(
        refused.contains("LeaseLost") || refused.contains("Fenced"),
        "{refused}"
    );
    let token_a: u64 = seen
        .iter()
        .find_map(|l| l.strip_prefix("token "))
        .expect("token line")
        .parse()
        .expect("token");
    assert!(lease_b.token() > token_a);

    // Every row of A's precedes B's; the last row and the fence are B's.
    let rows = db
        .query("SELECT writer, token FROM rows ORDER BY id", &[])
        .await
        .expect("rows");
    let writers: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let first_b = writers.iter().position(|w| w == "B").expect("B's row");
    assert!(
        first_b >= 3 && writers[first_b..].iter().all(|w| w == "B"),
        "{writers:?}"
    );
    let fence: i64 = db
        .query_one(
            "SELECT fence FROM palisade.fences WHERE lease = 'orders'",
            &[],
        )
        .await
        .expect("fence")
        .get(0);
    assert_eq!(fence as u64, lease_b.token());

    // The database itself refuses A's token now, whatever A's clock says
    // (and does not tell the fence).
    let mut pg_a = pg.connect().await;
    let tx = pg_a.transaction().await.expect("begin");
    let stale = postgres::fence_unverified(&tx, "orders", token_a).await;
    assert_eq!(
        stale,
        Err(Error::Fenced {
            token: token_a,
            fence: 0
        })
    );
}

/// A held lease whose token the database has seen overtaken: the fenced
/// transaction is `Fenced` and the lease is marked lost, like a 409 at the
/// gateway; afterwards it is refused locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_marks_the_lease_lost() {
    let Some(pg) = PgServer::start() else { return };
    let mut db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    cluster.leader(&http_client()).await;
    let client = sdk(&cluster, None);
    let jwks = signing_keys(&client).await;
    postgres::set_keys(&db, &jwks).await.expect("keys");
    let lease = client
        .acquire(
            "stale",
            "h",
            Duration::from_millis(5000),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("acquire");
    let tx = lease.fenced_transaction(&mut db).await.expect("fenced");
    tx.commit().await.expect("commit");
    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "stale", lease.token() + 10)
        .await
        .expect("raise");
    tx.commit().await.expect("commit");
    let refused = lease.fenced_transaction(&mut db).await.map(drop);
    assert_eq!(
        refused,
        Err(Error::Fenced {
            token: lease.token(),
            fence: 0
        })
    );
    assert!(!lease.is_held());
    let again = lease.fenced_transaction(&mut db).await.map(drop);
    assert!(matches!(again, Err(Error::LeaseLost(_))), "{again:?}");
}

fn cli(args: &[&str], env_url: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    command.args(args).env_remove("DATABASE_URL");
    if let Some(url) = env_url {
        command.env("DATABASE_URL", url);
    }
    command.output().expect("run palisade")
}

async fn installed_at(db: &tokio_postgres::Client) -> String {
    let row = db
        .query_one("SELECT installed_at::text FROM palisade.version", &[])
        .await;
    row.expect("version row").get(0)
}

fn one_line_error(out: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

/// `palisade sql install` twice is a no-op; `guard` makes an unfenced write
/// fail (PF002) and a fenced one pass; `unguard` lifts it; bad flags and
/// database errors are one line (exit 2 and 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn palisade_sql_installs_and_guards() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.url();
    let out = cli(&["sql", "install", "--no-keys", "--url", &url], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = pg.connect().await;
    let first = installed_at(&db).await;
    let out = cli(&["sql", "install", "--no-keys"], Some(&url));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        installed_at(&db).await,
        first,
        "a second install changed the schema"
    );
    assert_eq!(
        postgres::installed_version(&db).await,
        Ok(Some(postgres::SCHEMA_VERSION))
    );
    // The URL from a file (no password on the command line).
    let url_file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(url_file.path(), format!("{url}\n")).expect("write url");
    let path = url_file.path().to_str().expect("utf-8 path");
    let out = cli(&["sql", "install", "--no-keys", "--url-file", path], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    db.batch_execute(
        "CREATE TABLE jobs (id int PRIMARY KEY, lease text, state text);
         INSERT INTO jobs VALUES (1, 'jobs', 'new');
         CREATE TABLE free (id int); INSERT INTO free VALUES (1);",
    )
    .await
    .expect("tables");
    let out = cli(
        &[
            "sql",
            "guard",
            "--url",
            &url,
            "--table",
            "jobs",
            "--lease-column",
            "lease",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let refused = db
        .execute("UPDATE jobs SET state = 'x' WHERE id = 1", &[])
        .await;
    assert_eq!(
        sqlstate(&refused.expect_err("unfenced write")),
        postgres::UNFENCED_WRITE
    );
    db.execute("UPDATE free SET id = 2", &[])
        .await
        .expect("an unguarded table is untouched");
    let mut db = db;
    let tx = db.transaction().await.expect("begin");
    postgres::fence_unverified(&tx, "jobs", 7)
        .await
        .expect("fence");
    tx.execute("UPDATE jobs SET state = 'done' WHERE id = 1", &[])
        .await
        .expect("fenced write");
    tx.commit().await.expect("commit");

    let out = cli(&["sql", "unguard", "--url", &url, "--table", "jobs"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    db.execute("UPDATE jobs SET state = 'y'", &[])
        .await
        .expect("unguarded");

    let out = cli(
        &[
            "sql", "guard", "--url", &url, "--table", "jobs", "--lease", "jobs",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = db.execute("DELETE FROM jobs", &[]).await;
    assert_eq!(
        sqlstate(&refused.expect_err("unfenced delete")),
        postgres::UNFENCED_WRITE
    );

    one_line_error(
        &cli(&["sql", "guard", "--url", &url, "--table", "jobs"], None),
        2,
    );
    one_line_error(&cli(&["sql", "install", "--no-keys"], None), 2);
    let missing = one_line_error(
        &cli(
            &[
                "sql", "guard", "--url", &url, "--table", "nope", "--lease", "x",
            ],
            None,
        ),
        1,
    );
    assert!(
        missing.contains("42P01") && missing.contains("nope"),
        "{missing}"
    );
    let bad = one_line_error(
        &cli(
            &[
                "sql", "guard", "--url", &url, "--table", "jobs", "--lease", "a b",
            ],
            None,
        ),
        1,
    );
    assert!(bad.contains("invalid lease name"), "{bad}");
    let down = one_line_error(
        &cli(
            &[
                "sql",
                "install",
                "--no-keys",
                "--url",
                "postgres://postgres@127.0.0.1:1/x",
            ],
            None,
        ),
        1,
    );
    assert!(down.contains("cannot connect"), "{down}");
}

/// Bad lease names and tokens: refused locally by the SDK, and by the
/// database (PF003/PF004) for callers that go around it.
#[tokio::test]
async fn bad_names_and_tokens_are_refused() {
    let Some(pg) = PgServer::start() else { return };
    let mut db = pg.connect().await;
    postgres::install(&db).await.expect("install");
    let tx = db.transaction().await.expect("begin");
    for (lease, token) in [("a b", 1), ("..", 1), ("", 1), ("ok", 0), ("ok", u64::MAX)] {
        let refused = postgres::fence_unverified(&tx, lease, token).await;
        assert!(
            matches!(refused, Err(Error::BadRequest(_))),
            "{lease:?} {token}: {refused:?}"
        );
    }
    tx.commit()
        .await
        .expect("nothing was sent: the transaction is fine");

    for (sql, token, needle) in [
        (
            "SELECT palisade.fence_unverified('a b', 1)",
            1,
            "invalid lease name",
        ),
        (
            "SELECT palisade.fence_unverified(NULL, 1)",
            1,
            "invalid lease name",
        ),
        (
            "SELECT palisade.fence('a b', 'x.y.z')",
            1,
            "invalid lease name",
        ),
        (
            "SELECT palisade.fence_unverified('ok', 0)",
            0,
            "invalid fencing token",
        ),
        (
            "SELECT palisade.fence_unverified('ok', -5)",
            0,
            "invalid fencing token",
        ),
    ] {
        let err = db.query_one(sql, &[]).await.expect_err(sql);
        let mapped = postgres::fence_error(&err, token);
        assert!(
            matches!(&mapped, Error::BadRequest(m) if m.contains(needle)),
            "{sql}: {mapped:?}"
        );
    }
    let err = db
        .query_one(
            "SELECT palisade.fence_unverified('ok', '9223372036854775808')",
            &[],
        )
        .await
        .expect_err("above bigint");
    assert!(matches!(postgres::fence_error(&err, 0), Error::Database(m) if m.starts_with("22003")));
}
