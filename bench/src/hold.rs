//! `palisade-bench hold`: what it costs the leader to keep many leases of
//! one SDK client alive — a service owning thousands of shards, renewing
//! every ttl/3 for as long as it runs.
//!
//! One `palisade_client::Client` (as a service would have) acquires
//! `--leases` leases on a real 3-node cluster and lets its leases renew
//! themselves; after one ttl of warm-up the leader's CPU time (utime +
//! stime from `/proc`) and its counters (renewals, batch requests, JWT
//! signatures) are read before and after `--seconds`. The figure: the
//! leader's CPU per renewal. `--no-batch` and `--http1` turn the SDK's
//! batching and HTTP/2 off, to see what each brings.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use palisade_local_cluster::{make_certs, Cluster, ClusterConfig, Logs, PeerAuth};
use serde_json::json;

use crate::cpu::cpu_time;
use crate::load::{http_client, Failover};

#[derive(Debug, Args)]
pub struct HoldBench {
    /// Leases the client holds.
    #[arg(long, default_value_t = 10_000)]
    leases: usize,
    /// Their ttl, in milliseconds (the SDK renews every ttl/3).
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    /// Seconds measured (after one ttl of warm-up).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// One renewal request per lease (the SDK's `batch_renewals = false`).
    #[arg(long)]
    no_batch: bool,
    /// HTTP/1.1 instead of HTTP/2 (the SDK's `http2 = false`).
    #[arg(long)]
    http1: bool,
    /// Batches as requests, not frames of a renewal stream (the SDK's
    /// `renew_stream = false`).
    #[arg(long)]
    no_stream: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// The counters of a node's `/metrics` this bench reads.
async fn counters(client: &reqwest::Client, base: &str) -> anyhow::Result<[f64; 3]> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let read = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    Ok([
        read("palisade_lease_renewals_total"),
        read("palisade_lease_renew_batches_total"),
        read("palisade_lease_jwt_signatures_total"),
    ])
}

/// A 3-node cluster in `dir`, peers on mutual TLS.
fn start_cluster(palisade: &Path, dir: &Path) -> anyhow::Result<Cluster> {
    let certs = dir.join("certs");
    make_certs(palisade, &certs, 3, &[])?;
    let mut config = ClusterConfig::new(dir, 3, PeerAuth::Certs(certs));
    for node in &mut config.nodes {
        node.env = vec![("RUST_LOG".into(), "error".into())];
        node.logs = Logs::Inherit;
    }
    Ok(Cluster::start(palisade, config)?)
}

/// One SDK client, configured as the flags ask, and the `--leases` leases
/// it acquired (128 at a time); the client renews them while it lives.
async fn acquire_leases(
    args: &HoldBench,
    cluster: &Cluster,
) -> anyhow::Result<(Arc<palisade_client::Client>, Vec<palisade_client::Lease>)> {
    let mut sdk = palisade_client::ClientConfig::new(cluster.urls());
    sdk.batch_renewals = !args.no_batch;
    sdk.http2 = !args.http1;
    sdk.renew_stream = !args.no_stream;
    let client = Arc::new(palisade_client::Client::new(sdk));
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut leases = Vec::with_capacity(args.leases);
    let names: Vec<String> = (0..args.leases).map(|i| format!("shard-{i}")).collect();
    for chunk in names.chunks(128) {
        let acquired = futures::future::join_all(
            chunk
                .iter()
                .map(|name| client.acquire(name, "service", ttl, None)),
        )
        .await;
        for lease in acquired {
            leases.push(lease?);
        }
    }
    Ok((client, leases))
}

pub async fn run(args: HoldBench, palisade: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let cluster = start_cluster(palisade, dir.path())?;
    let http = http_client(Duration::from_secs(5), 4)?;
    let Some(leader) = Failover::leader(&cluster, &http).await else {
        anyhow::bail!("the cluster did not elect a leader");
    };
    let base = cluster.url(leader);
    let pid = cluster
        .node(leader)
        .map(|n| n.pid())
        .ok_or_else(|| anyhow::anyhow!("the leader is not running"))?;

    let ttl = Duration::from_millis(args.ttl_ms);
    let started = Instant::now();
    let (_client, leases) = acquire_leases(&args, &cluster).await?;
    let acquire_seconds = started.elapsed().as_secs_f64();
    // Warm-up: a full ttl, so renewals run at their steady rate.
    tokio::time::sleep(ttl).await;

    let (cpu_before, counters_before, self_before) = (
        cpu_time(pid),
        counters(&http, &base).await?,
        cpu_time(std::process::id()),
    );
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let elapsed = window.elapsed().as_secs_f64();
    let (cpu_after, counters_after, self_after) = (
        cpu_time(pid),
        counters(&http, &base).await?,
        cpu_time(std::process::id()),
    );
    let held = leases.iter().filter(|l| l.is_held()).count();
    let [renewals, batches, signatures] = [0, 1, 2].map(|i| counters_after[i] - counters_before[i]);
    let leader_cpu = cpu_after
        .zip(cpu_before)
        .map_or(0.0, |(a, b)| (a - b).as_secs_f64());
    let client_cpu = self_after
        .zip(self_before)
        .map_or(0.0, |(a, b)| (a - b).as_secs_f64());
    let report = json!({
        "leases": args.leases,
        "ttl_ms": args.ttl_ms,
        "batching": !args.no_batch,
        "http2": !args.http1,
        "acquire_seconds": acquire_seconds,
        "seconds": elapsed,
        "still_held": held,
        "renewals_per_sec": renewals / elapsed,
        "batch_requests_per_sec": batches / elapsed,
        "mean_batch": if batches > 0.0 { renewals / batches } else { 0.0 },
        "jwt_signatures_per_sec": signatures / elapsed,
        "leader_cpu_percent": 100.0 * leader_cpu / elapsed,
        "leader_cpu_us_per_renewal": if renewals > 0.0 { 1e6 * leader_cpu / renewals } else { 0.0 },
        "client_cpu_percent": 100.0 * client_cpu / elapsed,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for (key, value) in report.as_object().into_iter().flatten() {
            println!("{key:<28} {value}");
        }
    }
    // Dropped leases release themselves in the background; the cluster
    // goes with this process anyway.
    drop(leases);
    Ok(if held == args.leases {
        ExitCode::SUCCESS
    } else {
        eprintln!("error: only {held} of {} leases still held", args.leases);
        ExitCode::FAILURE
    })
}
