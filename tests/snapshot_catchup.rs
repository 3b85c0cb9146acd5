//! Snapshots of a big table, on real processes: a follower paused while the
//! leader grants 10 000 leases and purges its log, then resumed, catches
//! up by snapshot; so does a wiped node added back. 10 000 leases is twice
//! the size at which the old JSON snapshots (over axum's 2 MiB body limit
//! and openraft's 200 ms snapshot timeout) left a follower stuck forever.
//! Both are checked by applied index and by reading a lease from the
//! node's own state (a watch, which any node answers from what it applied).

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{caught_up, get_json, http_client, node_setup, post_json_once, Cluster};

/// How many leases: 10 000, or `PALISADE_SNAPSHOT_LEASES` (the 100k
/// measurement in BENCHMARKS.md runs this test in release with 100 000).
fn leases() -> usize {
    std::env::var("PALISADE_SNAPSHOT_LEASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// Acquires [`leases`] leases on `base`, 32 at a time (or
/// `PALISADE_SNAPSHOT_CLIENTS`).
async fn grant_many(client: &reqwest::Client, base: &str, prefix: &str) {
    let clients: usize = std::env::var("PALISADE_SNAPSHOT_CLIENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(32);
    support::grant_many(client, base, prefix, (leases(), 3_600_000), clients).await;
}

async fn cluster_view(client: &reqwest::Client, base: &str) -> Value {
    get_json(client, &format!("{base}/v1/cluster"), "cluster").await
}

/// The lease as node `url` itself applied it.
async fn local_lease(client: &reqwest::Client, url: &str, lease: &str) -> Value {
    get_json(
        client,
        &format!("{url}/v1/leases/{lease}/watch?index=0&wait_ms=0"),
        "local lease",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_behind_the_purge_point_catch_up_by_snapshot() {
    let _alone = support::ALONE.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            // Snapshots often enough that 10 000 grants purge far past the
            // paused follower; `PALISADE_SNAPSHOT_EVERY` for big tables (a
            // snapshot of 100k leases every 500 grants is all a 2-core
            // machine would do).
            let every = std::env::var("PALISADE_SNAPSHOT_EVERY").unwrap_or_else(|_| "500".into());
            setup.args = vec!["--snapshot-every".into(), every];
            setup.env = vec![("RUST_LOG".into(), "warn".into())];
            // Kept after the run (overwritten by the next) for a look.
            let logs =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/snapshot_catchup");
            let _ = std::fs::create_dir_all(&logs);
            setup.logs = palisade_local_cluster::Logs::File(logs.join(format!("node{id}.log")));
            setup
        })
        .collect();
    let mut cluster = Cluster::start_with(dir.path(), setups);
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let lagging = cluster.ids().find(|id| *id != leader).expect("a follower");

    // 1. A follower paused while the table grows and the log is purged.
    cluster.pause(lagging).expect("SIGSTOP");
    let before = cluster_view(&client, &base).await["last_log_index"]
        .as_u64()
        .expect("index");
    grant_many(&client, &base, "big").await;
    let view = cluster_view(&client, &base).await;
    let target = view["last_log_index"].as_u64().expect("index");
    let purged = view["purged_index"].as_u64().unwrap_or(0);
    assert!(
        purged > before,
        "the leader purged past the paused follower ({before}): {view}"
    );
    cluster.resume(lagging).expect("SIGCONT");
    let took = caught_up(
        &client,
        &cluster.url(lagging),
        target,
        Duration::from_secs(60),
    )
    .await;
    let last = leases() - 1;
    let lease = local_lease(&client, &cluster.url(lagging), &format!("big-{last}")).await;
    assert_eq!(lease["holder"], format!("h{last}"), "{lease}");
    let lagging_view = cluster_view(&client, &cluster.url(lagging)).await;
    assert!(
        lagging_view["snapshot_index"].as_u64().unwrap_or(0) > before,
        "it caught up from a snapshot: {lagging_view}"
    );
    eprintln!(
        "paused follower caught up {} leases in {took:?} (snapshot index {})",
        leases(),
        lagging_view["snapshot_index"]
    );

    // 2. A node whose disk was wiped, removed and added back empty.
    let leader = cluster.leader(&client).await;
    let wiped = cluster.ids().find(|id| *id != leader).expect("a follower");
    cluster.kill(wiped);
    std::fs::remove_dir_all(&cluster.setup(wiped).data_dir).expect("wipe");
    let removed = client
        .delete(format!(
            "{}/v1/cluster/members/{wiped}",
            cluster.url(leader)
        ))
        .send()
        .await
        .expect("remove");
    assert_eq!(removed.status(), 200, "{:?}", removed.text().await);
    cluster.start_node(wiped).expect("restart empty");
    let long = reqwest::Client::builder()
        .timeout(Duration::from_secs(70))
        .build()
        .expect("client");
    let started = Instant::now();
    let (status, added) = post_json_once(
        &long,
        &format!("{}/v1/cluster/members", cluster.url(leader)),
        json!({"id": wiped, "addr": cluster.peer_addr(wiped)}),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    let target = cluster_view(&client, &cluster.url(leader)).await["last_log_index"]
        .as_u64()
        .expect("index");
    caught_up(
        &client,
        &cluster.url(wiped),
        target,
        Duration::from_secs(60),
    )
    .await;
    let lease = local_lease(&client, &cluster.url(wiped), "big-0").await;
    assert_eq!(lease["holder"], "h0", "{lease}");
    eprintln!(
        "wiped node re-added and caught up {} leases in {:?}",
        leases(),
        started.elapsed()
    );
}
