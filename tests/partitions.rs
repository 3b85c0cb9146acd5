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
use std::time::Duration;

use serde_json::{json, Value};
use support::partitions::{partition_of, steady_node, steady_nodes, until_led};
use support::{post_json, spawn_gateway_for, test_secret, Cluster};

const PARTITIONS: u32 = 6;
const LEASES: usize = 60;

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

/// Renews every grant in one `POST /v1/renew` through `url` (its node
/// renews the partitions it leads and sends the others' parts to the node
/// leading them, one batch per node), with a wrong token slipped in after
/// each tenth: every renewal is answered in its place, the good ones 200
/// with their token, the wrong ones 409 `lost`.
async fn renew_all_in_one_batch(client: &reqwest::Client, url: &str, grants: &[Value]) {
    let mut renewals = Vec::new();
    let mut wanted = Vec::new();
    for (i, grant) in grants.iter().enumerate() {
        let entry = |token: u64| {
            json!({"lease": grant["lease"], "holder": grant["holder"], "token": token,
                   "secret": test_secret(grant["holder"].as_str().expect("holder"))})
        };
        let token = grant["token"].as_u64().expect("token");
        renewals.push(entry(token));
        wanted.push((grant["lease"].clone(), 200, Some(token)));
        if i % 10 == 9 {
            renewals.push(entry(token + 1_000_000));
            wanted.push((grant["lease"].clone(), 409, None));
        }
    }
    let (status, answer) = post_json(
        client,
        &format!("{url}/v1/renew"),
        json!({ "renewals": renewals }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), wanted.len(), "one result per renewal");
    for (result, (lease, status, token)) in results.iter().zip(wanted) {
        assert_eq!(result["lease"], lease, "in the batch's order: {result}");
        assert_eq!(result["status"], status, "{result}");
        if let Some(token) = token {
            assert_eq!(result["grant"]["token"], token, "{result}");
        } else {
            assert_eq!(result["error"], "lost", "{result}");
        }
    }
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
    let mut cluster = Cluster::start_with(dir.path(), steady_nodes(dir.path(), PARTITIONS));
    let client = reqwest::Client::new();
    // Placement sends each partition home: no node leads more than two.
    let spread =
        |l: &[(u64, u64)]| l.len() == PARTITIONS as usize && led_by(l).values().all(|n| *n <= 2);
    let (before, _) = until_led(&client, &cluster.url(1), Duration::from_secs(30), spread).await;
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
    // Its partitions' heartbeats go to each peer in batches (`beats.rs`).
    let carried = metrics
        .lines()
        .find_map(|l| l.strip_prefix("palisade_peer_heartbeats_carried_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        carried > 0,
        "node 1 carried no heartbeats in batches: {metrics}"
    );
    let page = text("/ui").await;
    assert!(
        page.contains("id=\"partitions\""),
        "the status page's partitions"
    );
    assert_eq!(page.matches("data-partition=").count(), PARTITIONS as usize);
    assert_eq!(page.matches("class=\"lag\"").count(), PARTITIONS as usize);

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
    for via in 1..=3 {
        renew_all_in_one_batch(&client, &cluster.url(via), &grants).await;
    }

    // kill -9 the node leading the most partitions.
    let counts = led_by(&before);
    let (&victim, _) = counts.iter().max_by_key(|(_, n)| **n).expect("a leader");
    let watcher = if victim == 1 { 2 } else { 1 };
    let (before, _) = until_led(
        &client,
        &cluster.url(watcher),
        Duration::from_secs(5),
        |_| true,
    )
    .await;
    cluster.kill(victim);
    let failed_over = |l: &[(u64, u64)]| l.iter().all(|(leader, _)| *leader != victim);
    let (after, took) = until_led(
        &client,
        &cluster.url(watcher),
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
    until_led(&client, &cluster.url(1), Duration::from_secs(30), |l| {
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
            let mut setup = steady_node(dir.path(), id, &netns::node_host(id), PARTITIONS);
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
    let (before, _) = until_led(&client, &cluster.url(1), Duration::from_secs(30), home).await;
    netns::cut(3, 1);
    netns::cut(3, 2);
    // Many election timeouts (at most 1.2 s each) alone: without pre-vote
    // node 3 would raise its term with every one, and on its return its
    // higher term would depose every partition's leader.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (during, _) = until_led(&client, &cluster.url(1), Duration::from_secs(5), |_| true).await;
    assert_eq!(
        during, before,
        "the majority side is undisturbed by the cut"
    );
    netns::heal();
    // Back: node 3 hears the leaders again and catches up.
    let caught_up = |l: &[(u64, u64)]| l == before.as_slice();
    until_led(&client, &cluster.url(3), Duration::from_secs(10), caught_up).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in 1..=3 {
        let (after, _) =
            until_led(&client, &cluster.url(id), Duration::from_secs(5), |_| true).await;
        assert_eq!(
            after, before,
            "node {id}: every partition's leader and term as before"
        );
    }
}

/// `cluster add` of a node that runs another partition count is refused
/// before anything changes: with another count it would hash leases to
/// other partitions than its peers do, and two partitions could grant one
/// lease. Started again with the cluster's count, the same node is added
/// as a voter of every partition: with another node down, it and the last
/// one grant in both partitions.
#[tokio::test]
async fn a_node_with_another_partition_count_is_refused_and_nothing_changes() {
    const COUNT: u32 = 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start_with(dir.path(), steady_nodes(dir.path(), COUNT));
    let client = support::http_client();
    let long = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let (url1, url2) = (cluster.url(1), cluster.url(2));
    until_led(&client, &url1, Duration::from_secs(30), |l| l.len() == 2).await;
    // Node 3 leaves; the partitions it led elect again among 1 and 2.
    let removed =
        support::send_retrying(|| client.delete(format!("{url1}/v1/cluster/members/3"))).await;
    assert_eq!(removed.status(), 200, "{:?}", removed.text().await);
    let without_3 = |l: &[(u64, u64)]| l.len() == 2 && l.iter().all(|(leader, _)| *leader != 3);
    until_led(&client, &url1, Duration::from_secs(20), without_3).await;
    let members = |view: &Value| -> Vec<u64> {
        let members = view["members"].as_array().expect("members");
        members.iter().filter_map(|m| m["id"].as_u64()).collect()
    };
    let restart_empty = |cluster: &mut Cluster, count: u32| {
        cluster.kill(3);
        std::fs::remove_dir_all(&cluster.setup(3).data_dir).expect("wipe");
        let args = &mut cluster.setup_mut(3).args;
        let at = args.iter().position(|a| a == "--partitions").expect("flag");
        args[at + 1] = count.to_string();
        cluster.start_node(3).expect("restart node 3");
    };

    restart_empty(&mut cluster, 3);
    let add = json!({"id": 3, "addr": cluster.peer_addr(3), "wait_ms": 10_000});
    let (status, answer) =
        post_json(&long, &format!("{url1}/v1/cluster/members"), add.clone()).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("conflict")),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("runs 3 partition(s) and this cluster 2"),
        "{message}"
    );
    let view: Value = support::get_json(&client, &format!("{url1}/v1/cluster"), "cluster").await;
    assert_eq!(members(&view), vec![1, 2], "nothing changed: {view}");

    restart_empty(&mut cluster, COUNT);
    let (status, answer) = post_json(&long, &format!("{url1}/v1/cluster/members"), add).await;
    assert_eq!(status, 200, "{answer}");
    let view: Value = support::get_json(&client, &format!("{url1}/v1/cluster"), "cluster").await;
    assert_eq!(members(&view), vec![1, 2, 3], "{view}");
    // A voter of every partition: with node 1 down, 2 and 3 grant in both.
    cluster.kill(1);
    for k in 0..COUNT {
        let lease = (0..)
            .map(|i| format!("after-add-{i}"))
            .find(|name| partition_of(name, COUNT) == k)
            .expect("a name in each partition");
        let (status, grant) = support::acquire(&client, &url2, &lease, "h", 5_000).await;
        assert_eq!(status, 200, "partition {k}: {grant}");
    }
}
