//! Gateways on PostgreSQL, as real processes on one throwaway database
//! (Debian's binaries; skipped only when they are missing and
//! `PALISADE_PG_STRICT` is unset):
//!
//! - S1 across gateways: a stale writer is refused by the other gateway, in
//!   both orders, and 100 concurrent writers spread over two gateways never
//!   get a stale write accepted after a fresher one; the audit is shared.
//! - S4: a gateway killed (-9) mid-write loses nothing it acknowledged, and
//!   the other keeps serving; PostgreSQL restarted in immediate mode gives
//!   503s, then service, and nothing acknowledged is lost.
//! - R1: a paused (SIGSTOP) gateway blocks no one (it holds no lock), and
//!   resumed it does not acknowledge a write below the fence; a fence row
//!   held by a stuck session is a 503 within the lock timeout.
//!
//! The failover to a synchronous standby is in `gateway_postgres_failover.rs`.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_local_cluster::{GatewayKeys, NodeSpec};
use support::pg::PgServer;
use support::{spawn_node, Process, TestKey};

use crate::gateway_pg;
use gateway_pg::{check_history, get, put, Write};

fn gateway(url: &str, key: &TestKey, extra: &[&str]) -> Process {
    let mut spec = NodeSpec::gateway_on_postgres(
        "127.0.0.1:0",
        url,
        GatewayKeys::PublicKey(key.pem_path.clone()),
    );
    spec.args = extra.iter().map(|s| (*s).to_owned()).collect();
    spawn_node(spec)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_refuse_each_others_stale_writers_and_share_the_audit() {
    let Some(pg) = PgServer::start_with(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = TestKey::new(dir.path());
    let (g1, g2) = (gateway(&pg.url(), &key, &[]), gateway(&pg.url(), &key, &[]));
    let http = http();

    // Fresh through gateway 1, then stale through gateway 2; and the reverse.
    for (lease, fresh, stale) in [("orders", &g1, &g2), ("jobs", &g2, &g1)] {
        let k = format!("{lease}/state");
        let (status, _) = put(&http, &fresh.url, &k, &key.jwt(lease, 5), "fresh").await;
        assert_eq!(status, 200);
        let (status, body) = put(&http, &stale.url, &k, &key.jwt(lease, 4), "stale").await;
        assert_eq!(status, 409, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["error"], "stale_token");
        assert_eq!(body["fence"], 5);
        assert_eq!(get(&http, &stale.url, &k).await.1, "fresh");
    }

    // The refusal of `orders` happened on gateway 2: gateway 1 shows it.
    let fence: serde_json::Value = http
        .get(format!("{}/v1/fences/orders", g1.url))
        .send()
        .await
        .expect("fence")
        .json()
        .await
        .expect("json");
    assert_eq!(fence["fence"], 5);
    assert_eq!(fence["refused"]["count"], 1, "{fence}");
    assert_eq!(fence["refused"]["last"]["token"], 4);
    let list: serde_json::Value = http
        .get(format!("{}/v1/fences", g2.url))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let leases: Vec<&str> = list["fences"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|f| f["lease"].as_str())
        .collect();
    assert_eq!(leases, ["jobs", "orders"], "latest first: {list}");

    // 100 concurrent writers with random tokens over both gateways.
    let mut tasks = Vec::new();
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for i in 0..100u64 {
        let (http, url) = (http.clone(), [&g1, &g2][i as usize % 2].url.clone());
        let token = rand::random::<u64>() % 40 + 1;
        let jwt = key.jwt("race", token);
        let clock = clock.clone();
        tasks.push(tokio::spawn(async move {
            let invoked = clock.fetch_add(1, Ordering::SeqCst);
            let (status, body) = put(&http, &url, "race/x", &jwt, &format!("{token}:{i}")).await;
            let completed = clock.fetch_add(1, Ordering::SeqCst);
            Write::from_answer(token, invoked, completed, status, &body)
        }));
    }
    let mut history = Vec::new();
    for task in tasks {
        history.push(task.await.expect("writer"));
    }
    check_history(&http, &g1.url, "race", "race/x", &history).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_write_loses_nothing_it_acknowledged() {
    let Some(pg) = PgServer::start_with(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = TestKey::new(dir.path());
    let (mut g1, g2) = (gateway(&pg.url(), &key, &[]), gateway(&pg.url(), &key, &[]));
    let http = http();
    let jwt = key.jwt("crash", 1);

    // Eight writers on gateway 1, each its own keys, until it dies.
    let mut writers = Vec::new();
    for w in 0..8 {
        let (http, url, jwt) = (http.clone(), g1.url.clone(), jwt.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0..10_000 {
                let k = format!("crash/w{w}/{n}");
                match put(&http, &url, &k, &jwt, &k).await.0 {
                    200 => acked.push(k),
                    _ => break,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    g1.kill();
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.expect("writer"));
    }
    assert!(
        acked.len() > 20,
        "too few writes before the kill: {}",
        acked.len()
    );
    for k in &acked {
        assert_eq!(
            get(&http, &g2.url, k).await,
            (200, k.clone()),
            "acknowledged {k}"
        );
    }
    let (status, _) = put(&http, &g2.url, "crash/after", &jwt, "after").await;
    assert_eq!(status, 200, "the other gateway keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateway_blocks_no_one_and_resumed_acknowledges_nothing_stale() {
    let Some(mut pg) = PgServer::start_with(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = TestKey::new(dir.path());
    let lock = [
        "--pg-lock-timeout-ms",
        "1000",
        "--pg-statement-timeout-ms",
        "3000",
    ];
    let (g1, g2) = (
        gateway(&pg.url(), &key, &lock),
        gateway(&pg.url(), &key, &lock),
    );
    let http = http();

    // Gateway 1 writes with token 5 in a loop; it is frozen mid-stream.
    let stop = Arc::new(AtomicBool::new(false));
    let old = {
        let (http, url, jwt, stop) = (
            http.clone(),
            g1.url.clone(),
            key.jwt("pause", 5),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for n in 0..2_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (status, body) = put(&http, &url, "pause/a", &jwt, &format!("old {n}")).await;
                answers.push(Write::from_answer(5, 0, 0, status, &body));
            }
            answers
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    g1.node.pause().expect("SIGSTOP");
    // A write sent to the frozen gateway waits in its socket.
    let late = {
        let (http, url, jwt) = (http.clone(), g1.url.clone(), key.jwt("pause", 5));
        tokio::spawn(async move { put(&http, &url, "pause/a", &jwt, "late").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let (status, body) = put(&http, &g2.url, "pause/a", &key.jwt("pause", 6), "new").await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        took < Duration::from_millis(1000),
        "the other gateway waited {took:?}"
    );
    let new_version = Write::from_answer(6, 0, 0, status, &body)
        .version
        .expect("version");

    g1.node.resume().expect("SIGCONT");
    stop.store(true, Ordering::SeqCst);
    // Resumed, it acknowledges nothing stale: a 409, or (when SIGSTOP took
    // hold only after it had committed, on a loaded machine) a write whose
    // version is below the token-6 write's: committed before it.
    let (late_status, late_body) = late.await.expect("late write");
    let late = Write::from_answer(5, 0, 0, late_status, &late_body);
    assert!(
        late_status == 409 || late.version.is_some_and(|v| v < new_version),
        "resumed, it acknowledged a write committed after token 6 (version {new_version}): \
         {late_status} {late_body}"
    );
    for answer in old.await.expect("old writer") {
        if let Some(version) = answer.version {
            assert!(
                version < new_version,
                "a token-5 write committed after token 6"
            );
        }
    }
    assert_eq!(
        get(&http, &g1.url, "pause/a").await,
        (200, "new".to_owned())
    );

    // The lease's lock held by a stuck session (another gateway's raise that
    // never ends): a 503 within the lock timeout.
    let mut db = pg.connect().await;
    let tx = db.transaction().await.expect("begin");
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext('pause'))",
        &[&palisade_store::LEASE_LOCK_CLASS],
    )
    .await
    .expect("lock the lease");
    let started = Instant::now();
    let response = http
        .put(format!("{}/v1/objects/pause/a", g2.url))
        .bearer_auth(key.jwt("pause", 7))
        .body("blocked")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    tx.rollback().await.expect("rollback");
    let _ = pg.server();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_immediately_gives_503s_then_service_and_loses_nothing() {
    let Some(mut pg) = PgServer::start_with(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = TestKey::new(dir.path());
    let (g1, g2) = (gateway(&pg.url(), &key, &[]), gateway(&pg.url(), &key, &[]));
    let http = http();
    let jwt = key.jwt("restart", 1);

    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let url = [&g1, &g2][w % 2].url.clone();
        let (http, jwt, stop) = (http.clone(), jwt.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let (mut acked, mut unavailable) = (Vec::new(), 0);
            for n in 0..100_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let k = format!("restart/w{w}/{n}");
                match put(&http, &url, &k, &jwt, &k).await.0 {
                    200 => acked.push(k),
                    503 => {
                        unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("unexpected {other}"),
                }
            }
            (acked, unavailable)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let port = pg.server().port();
    pg.server().stop("immediate");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    pg.server().start(port).expect("PostgreSQL starts again");
    let restarted = Instant::now();

    // Service again: a write through each gateway, within 20 s.
    for g in [&g1, &g2] {
        loop {
            let (status, _) = put(&http, &g.url, "restart/probe", &jwt, "probe").await;
            if status == 200 {
                break;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(20),
                "no service after the restart"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut acked, mut unavailable) = (Vec::new(), 0);
    for writer in writers {
        let (a, u) = writer.await.expect("writer");
        acked.extend(a);
        unavailable += u;
    }
    assert!(unavailable > 0, "the restart was never seen as a 503");
    for k in &acked {
        assert_eq!(
            get(&http, &g1.url, k).await,
            (200, k.clone()),
            "acknowledged {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_postgres_settings_and_a_newer_schema_stop_the_gateway_with_one_line() {
    let Some(pg) = PgServer::start_with(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = TestKey::new(dir.path());
    let pem = key.pem_path.display().to_string();
    let base = [
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--public-key",
        pem.as_str(),
    ];
    let with = |more: &[&str]| -> Vec<String> {
        base.iter().chain(more).map(|s| (*s).to_owned()).collect()
    };
    for (more, says) in [
        (
            &["--postgres", "postgres://x:notaport/db"][..],
            "does not parse",
        ),
        (
            &["--postgres", &pg.url(), "--data-dir", "/tmp/x"][..],
            "cannot be used with",
        ),
        (
            &["--postgres", &pg.url(), "--pg-pool-size", "0"][..],
            "pool size",
        ),
        (
            &["--postgres", &pg.url(), "--pg-lock-timeout-ms", "9000"][..],
            "lock timeout must be below",
        ),
        (&[][..], "required"),
        (
            &["--postgres-file", "/nonexistent/pg-url"][..],
            "--postgres-file /nonexistent/pg-url",
        ),
    ] {
        let args = with(more);
        let (code, stderr) =
            support::run_palisade(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, Some(2), "{more:?}: {stderr}");
        assert!(stderr.contains(says), "{more:?}: {stderr}");
    }

    // A database migrated by a newer gateway: refused at start, saying so.
    let g = gateway(&pg.url(), &key, &[]);
    drop(g);
    pg.connect()
        .await
        .batch_execute("UPDATE palisade_gateway.schema_version SET version = 99")
        .await
        .expect("pretend a newer gateway migrated");
    let args = with(&["--postgres", &pg.url()]);
    let (code, stderr) =
        support::run_palisade(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(code, Some(0));
    assert!(stderr.contains("version 99"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn palisade_dev_postgres_runs_two_gateways_on_one_database() {
    let Some(_probe) = PgServer::start_with(&[]) else {
        return;
    };
    drop(_probe);
    let dir = tempfile::Builder::new()
        .prefix("palisade-dev-pg-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    // The postgres user must traverse to the data dir.
    std::process::Command::new("chmod")
        .args(["711", &dir.path().display().to_string()])
        .status()
        .expect("chmod");
    let ports = support::free_ports(5);
    let data = dir.path().join("data");
    let mut dev = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["dev", "--postgres", "--data-dir"])
        .arg(&data)
        .args(["--election-port", &ports[0].to_string()])
        .args(["--peer-port", &ports[3].to_string()])
        .args(["--gateway-port", &ports[1].to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start palisade dev");
    let stdout = dev.stdout.take().expect("stdout");
    let mut dev = StopOnDrop(dev);
    let dev = &mut dev.0;
    let up = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut text = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            text.push_str(&line);
            text.push('\n');
            if line.contains("Ctrl-C stops everything") {
                break;
            }
        }
        text
    });
    let text = tokio::time::timeout(Duration::from_secs(90), up)
        .await
        .expect("dev is up within 90 s")
        .expect("reader");
    assert!(text.contains("on PostgreSQL:"), "{text}");

    // A grant's write through the first gateway is read through the second.
    let api_key = std::fs::read_to_string(data.join("admin.key")).expect("admin.key");
    let http = http();
    // 503 (dev's cluster may still be settling its leader) is asked again.
    let mut keyed = reqwest::header::HeaderMap::new();
    keyed.insert("x-palisade-key", api_key.trim().parse().expect("key"));
    let keyed = reqwest::Client::builder()
        .default_headers(keyed)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let (status, grant) = support::post_json(
        &keyed,
        &format!("http://127.0.0.1:{}/v1/leases/devpg/acquire", ports[0]),
        serde_json::json!({"holder": "t", "ttl_ms": 10_000, "wait_ms": 5_000,
                           "secret": support::test_secret("t")}),
    )
    .await;
    assert_eq!(status, 200, "{grant}");
    let jwt = grant["jwt"].as_str().expect("jwt");
    let (g1, g2) = (
        format!("http://127.0.0.1:{}", ports[1]),
        format!("http://127.0.0.1:{}", ports[1] + 1),
    );
    let status = http
        .put(format!("{g1}/v1/objects/devpg/x"))
        .header("x-palisade-key", api_key.trim())
        .bearer_auth(jwt)
        .body("shared")
        .send()
        .await
        .expect("put")
        .status();
    assert_eq!(status, 200);
    let read = http
        .get(format!("{g2}/v1/objects/devpg/x"))
        .header("x-palisade-key", api_key.trim())
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    assert_eq!(read, "shared");

    // Ctrl-C stops everything, PostgreSQL included.
    std::process::Command::new("kill")
        .args(["-TERM", &dev.id().to_string()])
        .status()
        .expect("kill -TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "dev did not stop within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !data.join("postgres/data/postmaster.pid").exists(),
        "PostgreSQL still runs"
    );
}

/// A `palisade dev` child, sent SIGTERM when the test ends however it ends
/// (its nodes and PostgreSQL stop with it).
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
}
