//! One busy partition does not cost the others their heartbeats (issue
//! 46), on real processes: three nodes with `--partitions 6` (steady
//! timing: heartbeat 100 ms, election timeout 600..1200 ms). Sixteen
//! clients acquire and release leases of partition 0 as fast as they can
//! for eight seconds, through its leader; meanwhile node 1's view of every
//! partition is read every 200 ms. No other partition may change leader or
//! term (each partition has its own replication streams and connections:
//! partition 0's appends never queue another's heartbeat), and the flood
//! must really have run (hundreds of grants).

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::partitions::{leaders, partition_of, steady_nodes};
use support::{test_secret, Cluster};

const PARTITIONS: u32 = 6;
const FLOOD: Duration = Duration::from_secs(8);

/// Acquires and releases leases of `names` at `url` until `until`; counts
/// grants.
async fn flood(url: String, names: Vec<String>, until: Instant, grants: Arc<AtomicU64>) {
    let client = reqwest::Client::new();
    let holder = format!("flood-{}", names[0]);
    let secret = test_secret(&holder);
    while Instant::now() < until {
        for name in &names {
            let acquired = client
                .post(format!("{url}/v1/leases/{name}/acquire"))
                .json(&json!({"holder": holder, "ttl_ms": 5000, "secret": secret}))
                .send()
                .await;
            let Ok(answer) = acquired else { continue };
            let Ok(grant) = answer.json::<Value>().await else {
                continue;
            };
            if grant["token"].is_u64() {
                grants.fetch_add(1, Ordering::Relaxed);
                let _ = client
                    .post(format!("{url}/v1/leases/{name}/release"))
                    .json(&json!({"holder": holder, "token": grant["token"], "secret": secret}))
                    .send()
                    .await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_one_partition_costs_no_other_partition_its_leader() {
    let _alone = support::ALONE.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start_with(dir.path(), steady_nodes(dir.path(), PARTITIONS));
    let client = reqwest::Client::new();
    // Spread and settled: two leaders a node, the same view twice 2 s apart.
    let mut before = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(40) {
        let now = leaders(&client, &cluster.url(1)).await;
        let spread = now.as_ref().is_some_and(|v| {
            v.len() == PARTITIONS as usize
                && (1..=3).all(|n| v.iter().filter(|(l, _)| *l == n).count() == 2)
        });
        if spread && now == before {
            break;
        }
        before = now.filter(|_| spread);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let before = before.expect("six leaders spread two a node, settled, within 40 s");
    let busy_leader = before[0].0;
    let names: Vec<String> = (0..)
        .map(|i| format!("hot-{i}"))
        .filter(|n| partition_of(n, PARTITIONS) == 0)
        .take(64)
        .collect();
    let grants = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + FLOOD;
    let floods: Vec<_> = names
        .chunks(4)
        .map(|chunk| {
            tokio::spawn(flood(
                cluster.url(busy_leader),
                chunk.to_vec(),
                until,
                grants.clone(),
            ))
        })
        .collect();
    let mut views = Vec::new();
    while Instant::now() < until {
        if let Some(now) = leaders(&client, &cluster.url(1)).await {
            views.push(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for flood in floods {
        flood.await.expect("flood");
    }
    let grants = grants.load(Ordering::Relaxed);
    println!(
        "{grants} grants on partition 0 in {FLOOD:?}; {} views",
        views.len()
    );
    assert!(grants > 200, "the flood ran: {grants} grants");
    assert!(views.len() > 10, "node 1 answered during the flood");
    for seen in &views {
        for k in 1..PARTITIONS as usize {
            assert_eq!(seen[k], before[k], "partition {k} during the flood");
        }
    }
}
