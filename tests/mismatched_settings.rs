//! C1 on real processes: nodes started with settings that disagree.
//!
//! - Node 1 with `--partitions 2`, nodes 2 and 3 with `--partitions 3`
//!   (the attack: one lease hashed to two Raft groups, granted twice). The
//!   peers refuse each other, so node 1 reaches no quorum: no lease is
//!   granted through it while nodes 2 and 3 grant every lease once, and the
//!   difference is named on `/v1/cluster` and `/readyz`.
//! - Node 1 with a longer election timeout than nodes 2 and 3: every node
//!   answers renewals inside the shortest vote lease any voter announced,
//!   less the margin the most drift any node assumed asks of it (the window
//!   a cut-off node 1 kept answering renewals in, past the others' election
//!   of a new leader).

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::partitions::{steady_node, until_led};
use support::{get_json, post_json, post_json_once, test_secret, Cluster};

/// `/v1/cluster`'s `settings` from node `id`, once `done` accepts it (at
/// most 20 s).
async fn settings_until(
    client: &reqwest::Client,
    cluster: &Cluster,
    id: u64,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let view: Value = get_json(
            client,
            &format!("{}/v1/cluster", cluster.url(id)),
            "cluster view",
        )
        .await;
        if done(&view["settings"]) || started.elapsed() > Duration::from_secs(20) {
            return view["settings"].clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_another_partition_count_never_grant_together() {
    let dir = tempfile::tempdir().expect("dir");
    let setups = vec![
        steady_node(dir.path(), 1, "127.0.0.1", 2),
        steady_node(dir.path(), 2, "127.0.0.1", 3),
        steady_node(dir.path(), 3, "127.0.0.1", 3),
    ];
    let cluster = Cluster::start_with(dir.path(), setups);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    // Nodes 2 and 3 agree: all three of their partitions get a leader
    // among them.
    until_led(&client, &cluster.url(2), Duration::from_secs(30), |led| {
        led.len() == 3 && led.iter().all(|(leader, _)| *leader != 1)
    })
    .await;
    // Node 1 names what differs, on /v1/cluster and /readyz.
    let settings = settings_until(&client, &cluster, 1, |s| {
        s["disagreements"].as_array().is_some_and(|d| !d.is_empty())
    })
    .await;
    let said = settings["disagreements"].to_string();
    assert!(
        said.contains("--partitions 3, this node 2"),
        "node 1's settings: {settings}"
    );
    let ready = client
        .get(format!("{}/readyz", cluster.url(1)))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.expect("json");
    assert!(
        body["reason"]
            .as_str()
            .unwrap_or("")
            .contains("--partitions"),
        "{body}"
    );
    // Every lease: no grant through node 1; one holder through node 2, and
    // node 1's holder never holds it at the same time.
    for i in 0..24 {
        let lease = format!("x{i}");
        let url = |id: u64| format!("{}/v1/leases/{lease}/acquire", cluster.url(id));
        let body = |holder: &str| json!({"holder": holder, "ttl_ms": 30_000, "secret": test_secret(holder)});
        let (through_1, answer_1) = post_json_once(&client, &url(1), body("h1")).await;
        assert_ne!(through_1, 200, "{lease} granted through node 1: {answer_1}");
        let (through_2, answer_2) = post_json(&client, &url(2), body("h2")).await;
        assert_eq!(through_2, 200, "{lease} through node 2: {answer_2}");
        let read: Value = get_json(
            &client,
            &format!("{}/v1/leases/{lease}", cluster.url(3)),
            "lease",
        )
        .await;
        assert_eq!(read["holder"], "h2", "{lease}: {read}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewal_lease_is_the_shortest_any_voter_announced() {
    let dir = tempfile::tempdir().expect("dir");
    // Node 1 keeps a vote lease of 2 000 ms and a margin of 200 ms; nodes
    // 2 and 3 (STEADY_LEADER) 600 ms and 60 ms.
    let mut slow = steady_node(dir.path(), 1, "127.0.0.1", 1);
    slow.args = [
        "--heartbeat-ms",
        "100",
        "--election-timeout-ms",
        "2000..2400",
        "--min-ttl-ms",
        "3000",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let setups = vec![
        slow,
        steady_node(dir.path(), 2, "127.0.0.1", 1),
        steady_node(dir.path(), 3, "127.0.0.1", 1),
    ];
    let cluster = Cluster::start_with(dir.path(), setups);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    cluster.leader(&client).await;
    // 600 ms less 60 (both assume drift of a tenth of their lease), on
    // every node: not node 1's own 1 800 ms.
    for id in 1..=3 {
        let settings = settings_until(&client, &cluster, id, |s| {
            s["renewal_lease_ms"] == 540
                && s["timing_differences"]
                    .as_array()
                    .is_some_and(|t| !t.is_empty())
        })
        .await;
        assert_eq!(settings["renewal_lease_ms"], 540, "node {id}: {settings}");
        assert!(
            settings["disagreements"]
                .as_array()
                .is_some_and(Vec::is_empty),
            "timing may differ: node {id}: {settings}"
        );
    }
    // Renewals are still answered (540 ms is well above the heartbeat).
    let url = format!("{}/v1/leases/timed/acquire", cluster.url(2));
    let (status, grant) = post_json(
        &client,
        &url,
        json!({"holder": "a", "ttl_ms": 5_000, "secret": test_secret("a")}),
    )
    .await;
    assert_eq!(status, 200, "{grant}");
    for _ in 0..5 {
        let (status, renewed) = post_json(
            &client,
            &format!("{}/v1/leases/timed/renew", cluster.url(2)),
            json!({"holder": "a", "token": grant["token"], "secret": test_secret("a")}),
        )
        .await;
        assert_eq!(status, 200, "{renewed}");
    }
}
