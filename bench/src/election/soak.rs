//! `--ops N`: N acquire+release cycles from 32 tasks, then what the cluster
//! holds on disk and in memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use palisade_local_cluster::Cluster;
use serde_json::{json, Value};

use super::cluster::{disk_bytes, rss_kib};
use super::requests::{holder_token, post};
use crate::load::Failover;

/// Runs `ops` cycles against the current leader and answers the footprint:
/// cycles, log entries, seconds, disk bytes over all nodes, RSS per node.
pub(super) async fn footprint(
    cluster: &Cluster,
    client: &reqwest::Client,
    ops: u64,
) -> anyhow::Result<Value> {
    let Some(leader) = Failover::leader(cluster, client).await else {
        anyhow::bail!("no leader for --ops")
    };
    let base = cluster.url(leader);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..32 {
        let (c, base, done) = (client.clone(), base.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while done.fetch_add(1, Ordering::Relaxed) < ops {
                let lease = format!("soak-{task}-{}", i % 16);
                if let Some(grant) = post(
                    &c,
                    &format!("{base}/v1/leases/{lease}/acquire"),
                    &json!({"holder": "bench", "ttl_ms": 10_000}),
                )
                .await
                {
                    let _ = post(
                        &c,
                        &format!("{base}/v1/leases/{lease}/release"),
                        &holder_token(&grant),
                    )
                    .await;
                }
                i += 1;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Ok(json!({
        "cycles": ops,
        "log_entries": ops * 2,
        "seconds": started.elapsed().as_secs_f64(),
        "disk_bytes_all_nodes": cluster
            .ids()
            .map(|id| disk_bytes(&cluster.setup(id).data_dir))
            .sum::<u64>(),
        "rss_kib_per_node": rss_kib(cluster),
    }))
}
