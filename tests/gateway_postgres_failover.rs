//! S1 and S4 across a PostgreSQL failover: two gateways on a primary with a
//! synchronous standby (pg_basebackup -R, `synchronous_standby_names`), both
//! given the two hosts with `target_session_attrs=read-write`. Writers raise
//! the fence of several leases through both gateways; the primary is killed
//! (-9, its backends too) and the standby promoted (`pg_ctl promote`, as
//! patroni would). Every acknowledged write is on the new primary, no
//! lease's fence is below a token it acknowledged, and the time from the
//! kill to the first acknowledged write after it is measured and bounded.
//! Before that, with the standby stopped, a write is not acknowledged.
//!
//! Skipped only when PostgreSQL's binaries are missing and
//! `PALISADE_PG_STRICT` is unset.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_local_cluster::{GatewayKeys, NodeSpec};
use support::pg::PgServer;
use support::{spawn_node, TestKey};

use crate::gateway_pg;
use gateway_pg::{fence, get, put};

/// One acknowledged write: key, value, token, when it was sent and when
/// acknowledged (since the test began).
type Acked = (String, String, u64, Duration, Duration);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_and_standby_promoted_loses_nothing_acknowledged() {
    let Some(mut primary) = PgServer::start_with(&[]) else {
        return;
    };
    let mut standby = primary.standby("standby1");
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.server().port(),
        standby.server().port()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let key = Arc::new(TestKey::new(dir.path()));
    let flags = [
        "--pg-connect-timeout-ms",
        "500",
        "--pg-statement-timeout-ms",
        "1500",
        "--pg-lock-timeout-ms",
        "1000",
    ]
    .map(str::to_owned);
    let gateways: Vec<_> = (0..2)
        .map(|_| {
            let mut spec = NodeSpec::gateway_on_postgres(
                "127.0.0.1:0",
                &url,
                GatewayKeys::PublicKey(key.pem_path.clone()),
            );
            spec.args = flags.to_vec();
            spawn_node(spec)
        })
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");

    // With the standby down a commit waits for it: the write is not
    // acknowledged (a 503 within the statement timeout), as it could be
    // lost by a failover.
    let standby_port = standby.server().port();
    standby.server().stop("fast");
    let started = Instant::now();
    let (status, body) = put(&http, &gateways[0].url, "fo9/x", &key.jwt("fo9", 1), "x").await;
    assert_eq!(
        status, 503,
        "acknowledged without the synchronous standby: {body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    standby
        .server()
        .start(standby_port)
        .expect("the standby starts again");

    // Four writers, each on its own lease, raising its token every 5
    // writes, alternating gateways; every acknowledged write kept.
    let began = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4usize {
        let urls: Vec<String> = gateways.iter().map(|g| g.url.clone()).collect();
        let (http, key, stop, acked) = (http.clone(), key.clone(), stop.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            let lease = format!("fo{w}");
            for n in 0..100_000u64 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let token = n / 5 + 1;
                let (k, v) = (format!("{lease}/{n}"), format!("{token}:{n}"));
                let url = &urls[(n as usize + w) % 2];
                let sent = began.elapsed();
                match put(&http, url, &k, &key.jwt(&lease, token), &v).await.0 {
                    200 => lock(&acked).push((k, v, token, sent, began.elapsed())),
                    409 => panic!("{k}: a writer's own rising token was refused"),
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = lock(&acked).len();
    assert!(before > 10, "too few writes before the kill: {before}");
    let killed_at = began.elapsed();
    primary.server().kill9();
    standby.server().promote().expect("promote the standby");
    let promoted_at = began.elapsed();

    let first_after = wait_for_a_write_after(&acked, killed_at + Duration::from_millis(1)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    let took = first_after - killed_at;
    eprintln!(
        "failover: promoted {:?} after the kill, first acknowledged write {:?} after it",
        promoted_at - killed_at,
        took
    );
    assert!(
        took < Duration::from_secs(10),
        "first write {took:?} after the kill"
    );

    let acked = lock(&acked).clone();
    let mut highest: HashMap<String, u64> = HashMap::new();
    for (k, v, token, _, _) in &acked {
        assert_eq!(
            get(&http, &gateways[0].url, k).await,
            (200, v.clone()),
            "acknowledged {k}"
        );
        let lease = k.split('/').next().expect("lease").to_owned();
        let entry = highest.entry(lease).or_default();
        *entry = (*entry).max(*token);
    }
    for (lease, token) in highest {
        let now = fence(&http, &gateways[1].url, &lease).await;
        assert!(
            now >= token,
            "{lease}: fence {now} went below the acknowledged token {token}"
        );
    }
}

/// When the first write sent after `after` was acknowledged (bounded: 30 s).
async fn wait_for_a_write_after(acked: &Mutex<Vec<Acked>>, after: Duration) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(at) = lock(acked)
            .iter()
            .filter(|a| a.3 > after)
            .map(|a| a.4)
            .min()
        {
            return at;
        }
        assert!(
            Instant::now() < deadline,
            "no write acknowledged after the failover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
