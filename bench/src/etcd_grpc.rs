//! etcd driven the way its users drive it: the native gRPC client
//! (`etcd-client`, one HTTP/2 connection per endpoint, multiplexed), for
//! the same work as the JSON-gateway rows of `etcd.rs`. Built only with the
//! `etcd-grpc` feature (the crate needs `protoc` to build; `compare.sh`
//! installs it).
//!
//! - keepalive: each task grants its own lease once, opens one keepalive
//!   stream for it (as `etcdctl lease keep-alive` and every client library
//!   do), and each operation is one request and its answer on that stream;
//! - grant + put (with the lease) + revoke, as the JSON rows;
//! - put of `value_bytes` on a single node;
//! - hold: many leases, one keepalive stream each, renewed every ttl/3 —
//!   the leader's CPU per keepalive (against `palisade-bench hold`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper, PutOptions};
use serde_json::json;

use crate::load::{load, measured_cpu, Figures, OpResult};

/// Connects one client (the way users do: all endpoints, one channel).
async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    Ok(Client::connect(endpoints, None).await?)
}

fn kind(error: &etcd_client::Error) -> String {
    let text = error.to_string();
    format!("etcd {}", text.chars().take(40).collect::<String>())
}

/// One keepalive on `keeper`'s stream, and its answer.
async fn keep_alive(keeper: &mut LeaseKeeper, stream: &mut LeaseKeepAliveStream) -> OpResult {
    keeper.keep_alive().await.map_err(|e| kind(&e))?;
    match stream.message().await {
        Ok(Some(answer)) if answer.ttl() > 0 => Ok(()),
        Ok(Some(_)) => Err("etcd keepalive answered ttl 0 (lease gone)".into()),
        Ok(None) => Err("etcd keepalive stream ended".into()),
        Err(e) => Err(kind(&e)),
    }
}

/// The 3-node rows at each concurrency: keepalive and grant+put+revoke,
/// named `<label> lease keepalive` and `<label> grant+put+revoke cycle`
/// (the client is given `endpoints`: all three, or the leader alone).
pub async fn cluster_rows(
    (endpoints, leader_pid): (&[String], &[u32]),
    label: &str,
    concurrency: &[usize],
    (duration, value_bytes): (Duration, usize),
) -> anyhow::Result<Vec<Figures>> {
    let client = connect(endpoints).await?;
    let value = Arc::new(vec![b'v'; value_bytes]);
    let mut rows = Vec::new();
    for &concurrency in concurrency {
        let mut streams = Vec::new();
        for _ in 0..concurrency {
            let mut c = client.clone();
            let id = c.lease_grant(60, None).await?.id();
            streams.push(tokio::sync::Mutex::new(c.lease_keep_alive(id).await?));
        }
        let streams = Arc::new(streams);
        rows.push(
            measured_cpu(
                leader_pid,
                load(
                    &format!("{label} lease keepalive"),
                    concurrency,
                    duration,
                    move |task, _| {
                        let streams = streams.clone();
                        async move {
                            let mut guard = streams[task].lock().await;
                            let (keeper, stream) = &mut *guard;
                            keep_alive(keeper, stream).await
                        }
                    },
                ),
            )
            .await,
        );
        let (c, v) = (client.clone(), value.clone());
        rows.push(
            measured_cpu(
                leader_pid,
                load(
                    &format!("{label} grant+put+revoke cycle"),
                    concurrency,
                    duration,
                    move |task, i| {
                        let (mut c, v) = (c.clone(), v.clone());
                        async move {
                            let id = c.lease_grant(10, None).await.map_err(|e| kind(&e))?.id();
                            let key = format!("grpc-cycle-{task}-{}", i % 64);
                            c.put(key, v.as_slice(), Some(PutOptions::new().with_lease(id)))
                                .await
                                .map_err(|e| kind(&e))?;
                            c.lease_revoke(id).await.map(drop).map_err(|e| kind(&e))
                        }
                    },
                ),
            )
            .await,
        );
    }
    Ok(rows)
}

/// Single-node puts at each concurrency.
pub async fn put_rows(
    endpoint: &str,
    pid: &[u32],
    concurrency: &[usize],
    (duration, value_bytes): (Duration, usize),
) -> anyhow::Result<Vec<Figures>> {
    let client = connect(&[endpoint.to_owned()]).await?;
    let value = Arc::new(vec![b'v'; value_bytes]);
    let mut rows = Vec::new();
    for &concurrency in concurrency {
        let (c, v) = (client.clone(), value.clone());
        rows.push(
            measured_cpu(
                pid,
                load(
                    "etcd grpc single-node put",
                    concurrency,
                    duration,
                    move |task, i| {
                        let (mut c, v) = (c.clone(), v.clone());
                        async move {
                            c.put(format!("grpc/{task}/{}", i % 100), v.as_slice(), None)
                                .await
                                .map(drop)
                                .map_err(|e| kind(&e))
                        }
                    },
                ),
            )
            .await,
        );
    }
    Ok(rows)
}

/// `leases` leases of `ttl_secs`, one keepalive stream each, renewed every
/// ttl/3 for `seconds` after a ttl of warm-up; the leader's CPU per
/// keepalive (`leader_cpu` reads the leader process's CPU time).
pub async fn hold(
    endpoints: &[String],
    leases: usize,
    ttl_secs: i64,
    seconds: u64,
    leader_cpu: impl Fn() -> Option<Duration>,
) -> anyhow::Result<serde_json::Value> {
    let client = connect(endpoints).await?;
    let every = Duration::from_millis(u64::try_from(ttl_secs).unwrap_or(3) * 1000 / 3);
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for chunk in 0..leases.div_ceil(128) {
        let mut opened = Vec::new();
        for _ in 0..128.min(leases - chunk * 128) {
            let mut c = client.clone();
            opened.push(async move {
                let id = c.lease_grant(ttl_secs, None).await?.id();
                c.lease_keep_alive(id).await
            });
        }
        for stream in futures::future::join_all(opened).await {
            let (mut keeper, mut stream) = stream?;
            let (sent, failed, stop) = (sent.clone(), failed.clone(), stop.clone());
            // Spread the first renewals over one interval, as leases taken
            // at different moments are.
            let offset = every.mul_f64(rand::random::<f64>());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let mut ticks = tokio::time::interval(every);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    ticks.tick().await;
                    match keep_alive(&mut keeper, &mut stream).await {
                        Ok(()) => sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    let open_seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(every * 3).await;
    let (cpu_before, sent_before) = (
        leader_cpu(),
        sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = window.elapsed().as_secs_f64();
    let (cpu_after, sent_after) = (
        leader_cpu(),
        sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.abort();
    }
    let keepalives = (sent_after - sent_before) as f64;
    let cpu = cpu_after
        .zip(cpu_before)
        .map_or(0.0, |(a, b)| (a - b).as_secs_f64());
    Ok(json!({
        "leases": leases,
        "ttl_ms": ttl_secs * 1000,
        "open_seconds": open_seconds,
        "seconds": elapsed,
        "keepalives_per_sec": keepalives / elapsed,
        "failed_keepalives": failed.load(std::sync::atomic::Ordering::Relaxed),
        "leader_cpu_percent": 100.0 * cpu / elapsed,
        "leader_cpu_us_per_keepalive": if keepalives > 0.0 { 1e6 * cpu / keepalives } else { 0.0 },
    }))
}
