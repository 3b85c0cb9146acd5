//! Partitions on real processes (issue 46): three nodes running six Raft
//! groups (`--partitions 6`, steady timing so a loaded machine does not
//! move leadership on its own) and a gateway. Six leaders spread over the
//! nodes, none leading more than two; sixty leases reach every partition;
//! kill -9 the node leading the most partitions: each of its partitions has
//! a live leader again within a bound, the partitions it did not lead keep
//! their leader and term (no election there); every lease's next grant has
//! a higher token and the gateway refuses the old one; after every node
//! restarts, tokens still grow; and a data dir made with six partitions
//! refuses to start with another count. `/metrics` and the status page
//! show every partition.
//!
//! Pre-vote in every partition: a node of lower priority (so no partition's
//! home) cut off from the others by iptables in a private network
//! namespace for many election timeouts, then let back, disturbs no
//! partition's leader or term.

use crate::netns;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{node_setup, post_json, spawn_gateway_for, test_secret, Cluster, STEADY_LEADER};

const PARTITIONS: u64 = 6;
const LEASES: usize = 60;

/// Each partition's (leader, term) as node `id` sees it; `None` when the
/// node does not answer or a partition has no leader.
async fn leaders(client: &reqwest::Client, cluster: &Cluster, id: u64) -> Option<Vec<(u64, u64)>> {
    let url = format!("{}/v1/cluster", cluster.url(id));
    let view: Value = client.get(&url).send().await.ok()?.json().await.ok()?;
    view["partitions"]
        .as_array()?
        .iter()
        .map(|p| Some((p["leader"].as_u64()?, p["term"].as_u64()?)))
        .collect()
}

/// Polls node `id` (bounded by `within`) until every partition has a leader
/// that `good` accepts; the leaders and how long it took.
async fn until_led(
    client: &reqwest::Client,
    cluster: &Cluster,
    id: u64,
    within: Duration,
    good: impl Fn(&[(u64, u64)]) -> bool,
) -> (Vec<(u64, u64)>, Duration) {
    let started = Instant::now();
    let mut seen = None;
    while started.elapsed() < within {
        seen = leaders(client, cluster, id).await;
        if seen.as_deref().is_some_and(&good) {
            return (seen.unwrap_or_default(), started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("partitions not led as wanted within {within:?}: {seen:?}");
}

/// How many partitions each node leads.
fn led_by(leaders: &[(u64, u64)]) -> BTreeMap<u64, usize> {
    let mut count = BTreeMap::new();
    for (leader, _) in leaders {
        *count.entry(*leader).or_insert(0) += 1;
    }
    count
}

/// Acquires `lease` for `holder` through node `via` (any node forwards to
/// the lease's partition leader): the grant.
async fn grant(
    client: &reqwest::Client,
    cluster: &Cluster,
    via: u64,
    lease: &str,
    holder: &str,
) -> Value {
    let url = format!("{}/v1/leases/{lease}/acquire", cluster.url(via));
    let body = json!({"holder": holder, "ttl_ms": 30_000, "secret": test_secret(holder)});
    let (status, grant) = post_json(client, &url, body).await;
    assert_eq!(status, 200, "acquire {lease} as {holder}: {grant}");
    grant
}

/// Releases a grant through node `via`.
async fn release(client: &reqwest::Client, cluster: &Cluster, via: u64, grant: &Value) {
    let lease = grant["lease"].as_str().expect("lease");
    let holder = grant["holder"].as_str().expect("holder");
    let url = format!("{}/v1/leases/{lease}/release", cluster.url(via));
    let body = json!({"holder": holder, "token": grant["token"], "secret": test_secret(holder)});
    let (status, answer) = post_json(client, &url, body).await;
    assert_eq!(status, 200, "release {lease}: {answer}");
}

/// Writes `lease/state` through the gateway with `grant`'s JWT: the status.
async fn write(client: &reqwest::Client, gateway: &str, grant: &Value) -> u16 {
    let lease = grant["lease"].as_str().expect("lease");
    let jwt = grant["jwt"].as_str().expect("jwt");
    client
        .put(format!("{gateway}/v1/objects/{lease}/state"))
        .bearer_auth(jwt)
        .body(format!("from token {}", grant["token"]))
        .send()
        .await
        .expect("gateway")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_partitions_spread_fail_over_alone_and_keep_their_tokens_growing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args = STEADY_LEADER.iter().map(|a| a.to_string()).collect();
            setup
                .args
                .extend(["--partitions".into(), PARTITIONS.to_string()]);
            setup
        })
        .collect();
    let mut cluster = Cluster::start_with(dir.path(), setups);
    let client = reqwest::Client::new();
    // Placement sends each partition home: no node leads more than two.
    let spread =
        |l: &[(u64, u64)]| l.len() == PARTITIONS as usize && led_by(l).values().all(|n| *n <= 2);
    let (before, _) = until_led(&client, &cluster, 1, Duration::from_secs(30), spread).await;
    let gateway = spawn_gateway_for(&cluster, &dir.path().join("gateway"));
    // Metrics and the status page show every partition.
    let text = |path: &'static str| {
        let client = client.clone();
        let url = format!("{}{path}", cluster.url(1));
        async move {
            client
                .get(url)
                .send()
                .await
                .expect("get")
                .text()
                .await
                .expect("text")
        }
    };
    let metrics = text("/metrics").await;
    for k in 0..PARTITIONS {
        assert!(
            metrics.contains(&format!("palisade_partition_term{{partition=\"{k}\"}}")),
            "partition {k} in /metrics"
        );
    }
    let leading = metrics
        .lines()
        .filter(|l| l.starts_with("palisade_partition_leading{") && l.ends_with(" 1"))
        .count();
    let node1 = led_by(&before).get(&1).copied().unwrap_or(0);
    assert_eq!(leading, node1, "node 1's leading gauges: {metrics}");
    let page = text("/ui").await;
    assert!(
        page.contains("id=\"partitions\""),
        "the status page's partitions"
    );
    assert_eq!(page.matches("data-partition=").count(), PARTITIONS as usize);

    // Sixty leases over every partition, each writing through the gateway.
    let mut grants = Vec::new();
    let mut partitions = BTreeSet::new();
    for i in 0..LEASES {
        let lease = format!("job-{i}");
        let granted = grant(&client, &cluster, 1 + (i as u64 % 3), &lease, "first").await;
        assert_eq!(write(&client, &gateway.url, &granted).await, 200);
        let view: Value = client
            .get(format!("{}/v1/leases/{lease}", cluster.url(1)))
            .send()
            .await
            .expect("read")
            .json()
            .await
            .expect("json");
        partitions.insert(view["partition"].as_u64().expect("partition"));
        grants.push(granted);
    }
    assert_eq!(
        partitions.len(),
        PARTITIONS as usize,
        "every partition holds leases"
    );

    // kill -9 the node leading the most partitions.
    let counts = led_by(&before);
    let (&victim, _) = counts.iter().max_by_key(|(_, n)| **n).expect("a leader");
    let watcher = if victim == 1 { 2 } else { 1 };
    let (before, _) = until_led(&client, &cluster, watcher, Duration::from_secs(5), |_| true).await;
    cluster.kill(victim);
    let failed_over = |l: &[(u64, u64)]| l.iter().all(|(leader, _)| *leader != victim);
    let (after, took) = until_led(
        &client,
        &cluster,
        watcher,
        Duration::from_secs(10),
        failed_over,
    )
    .await;
    eprintln!("partitions led by node {victim} failed over in {took:?}: {before:?} -> {after:?}");
    assert!(took < Duration::from_secs(5), "failover took {took:?}");
    for (k, (was, now)) in before.iter().zip(&after).enumerate() {
        if was.0 != victim {
            assert_eq!(
                was, now,
                "partition {k}, not led by node {victim}, kept leader and term"
            );
        }
    }

    // Every lease: released, granted again above its old token; the old
    // JWT is refused once the new grant wrote.
    let mut tokens = BTreeMap::new();
    for old in &grants {
        release(&client, &cluster, watcher, old).await;
        let lease = old["lease"].as_str().expect("lease").to_owned();
        let new = grant(&client, &cluster, watcher, &lease, "second").await;
        assert!(
            new["token"].as_u64() > old["token"].as_u64(),
            "{lease}: {old} then {new}"
        );
        assert_eq!(write(&client, &gateway.url, &new).await, 200);
        assert_eq!(
            write(&client, &gateway.url, old).await,
            409,
            "{lease}'s old token"
        );
        tokens.insert(lease, new);
    }

    // Every node restarts (the victim too): tokens still grow.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start_node(id).expect("restart");
    }
    until_led(&client, &cluster, 1, Duration::from_secs(30), |l| {
        l.len() == 6
    })
    .await;
    for (lease, old) in &tokens {
        release(&client, &cluster, 1, old).await;
        let new = grant(&client, &cluster, 2, lease, "third").await;
        assert!(
            new["token"].as_u64() > old["token"].as_u64(),
            "{lease} after restart"
        );
    }

    // The count is the data dir's: node 3 started with another refuses
    // with one line, before it binds anything.
    cluster.kill(3);
    let data_dir = cluster.setup(3).data_dir.display().to_string();
    let (code, said) = support::run_palisade(&[
        "election",
        "--id",
        "3",
        "--listen",
        "127.0.0.1:0",
        "--insecure-peers",
        "--peers",
        "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3",
        "--data-dir",
        &data_dir,
        "--partitions",
        "2",
    ]);
    assert_ne!(code, Some(0), "{said}");
    assert!(
        said.contains("holds a cluster of 6 partition(s)") && said.contains("--partitions 2"),
        "{said}"
    );
}

#[test]
fn a_node_cut_off_and_back_disturbs_no_partition() {
    netns::block_on_private(cut_off_and_back());
}

async fn cut_off_and_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, &netns::node_host(id));
            setup.args = STEADY_LEADER.iter().map(|a| a.to_string()).collect();
            setup
                .args
                .extend(["--partitions".into(), PARTITIONS.to_string()]);
            // Node 3 is no partition's home: the others are of a higher
            // priority, so leadership leaves it and never comes back.
            let priority = if id == 3 { "0" } else { "5" };
            setup.args.extend(["--priority".into(), priority.into()]);
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let client = reqwest::Client::new();
    // Settled home: the top-priority voters are 1 and 2, so partition k's
    // home is node 1 for even k, node 2 for odd.
    let home = |l: &[(u64, u64)]| {
        l.len() == PARTITIONS as usize
            && l.iter()
                .enumerate()
                .all(|(k, (leader, _))| *leader == 1 + (k as u64 % 2))
    };
    let (before, _) = until_led(&client, &cluster, 1, Duration::from_secs(30), home).await;
    netns::cut(3, 1);
    netns::cut(3, 2);
    // Many election timeouts (at most 1.2 s each) alone: without pre-vote
    // node 3 would raise its term with every one, and on its return its
    // higher term would depose every partition's leader.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (during, _) = until_led(&client, &cluster, 1, Duration::from_secs(5), |_| true).await;
    assert_eq!(
        during, before,
        "the majority side is undisturbed by the cut"
    );
    netns::heal();
    // Back: node 3 hears the leaders again and catches up.
    let caught_up = |l: &[(u64, u64)]| l == before.as_slice();
    until_led(&client, &cluster, 3, Duration::from_secs(10), caught_up).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in 1..=3 {
        let (after, _) = until_led(&client, &cluster, id, Duration::from_secs(5), |_| true).await;
        assert_eq!(
            after, before,
            "node {id}: every partition's leader and term as before"
        );
    }
}
