//! A retired signing key never comes back through a lagging node (issue
//! 29), on real processes in a private network namespace (as the fault
//! suite's partitions: `fault_suite/netns.rs`; needs root, skipped
//! otherwise unless `PALISADE_FAULT_STRICT=1`).
//!
//! Node 1 — the first endpoint of the gateway's `--election` list — is cut
//! from its peers with iptables while it keeps answering clients; its JWKS
//! stops at the first key. The majority rotates the key and, once every
//! token of the first key has expired, retires it. Meanwhile the gateway
//! refetches the JWKS every 200 ms from every endpoint, node 1 included:
//! - a grant of the new key written the moment it answers is accepted (no
//!   valid token refused because the first endpoint lags);
//! - once the gateway has taken the retirement, the first key never shows
//!   in the set it trusts again (`/readyz` `keys`), although node 1 still
//!   publishes it on every fetch, nor after the gateway restarts while
//!   node 1 still lags.
//!
//! With a gateway that took the first answer (or the newest answer
//! regardless of what it holds) node 1's set would come back: the first
//! key trusted again, the new one forgotten.

use crate::netns;
use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{gateway_for, node_setup, published_kids, spawn_node, Cluster, Process};

#[test]
fn a_lagging_node_never_brings_a_retired_key_back() {
    netns::block_on_private(run());
}

async fn run() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Tokens live at most 2 s, so a rotated-out key retires about 4 s later.
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, &netns::node_host(id));
            setup.args = vec!["--max-ttl-ms".into(), "2000".into()];
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let http = support::http_client();
    cluster.leader(&http).await;
    let mut spec = gateway_for(&cluster, &dir.path().join("gateway"));
    spec.args = vec!["--jwks-refresh-ms".into(), "200".into()];
    let mut gateway = spawn_node(spec);
    let first = published_kids(&http, &cluster.url(1)).await;
    assert_eq!(first.len(), 1, "one key before the rotation: {first:?}");
    let first = first[0].clone();
    wait_trusting(&http, &gateway, &first).await;

    netns::cut(1, 2);
    netns::cut(1, 3);
    let leader = cluster
        .leader_among(&http, &[2, 3], 100)
        .await
        .expect("nodes 2 and 3 elect a leader without node 1");
    let base = cluster.url(leader);
    let rotated: Value =
        support::send_retrying(|| http.post(format!("{base}/v1/cluster/rotate-key")))
            .await
            .json()
            .await
            .expect("rotate-key answer");
    let second = rotated["kid"].as_str().expect("kid").to_owned();

    // A grant of the new key, written at once: accepted.
    write_fresh_grant(&http, &base, &gateway, "fresh").await;

    // The majority retires the first key; node 1 still publishes it.
    let retired_by = Instant::now() + Duration::from_secs(30);
    while published_kids(&http, &base).await.contains(&first) {
        assert!(Instant::now() < retired_by, "{first} never retired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lagging = published_kids(&http, &cluster.url(1)).await;
    assert_eq!(lagging, vec![first.clone()], "node 1 is not lagging");

    // The gateway takes the retirement, then never trusts the key again
    // while node 1 offers it on every fetch (20 refetches), nor once
    // restarted.
    wait_not_trusting(&http, &gateway, &first).await;
    for sample in 0..40 {
        let kids = trusted(&http, &gateway).await;
        assert!(
            !kids.contains(&first) && kids.contains(&second),
            "sample {sample}: the gateway trusts {kids:?} (retired {first}, current {second})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spec = gateway.node.spec().clone();
    gateway.kill();
    gateway = spawn_node(spec);
    write_fresh_grant(&http, &base, &gateway, "after-restart").await;
    for sample in 0..10 {
        let kids = trusted(&http, &gateway).await;
        assert!(
            !kids.contains(&first),
            "restarted, sample {sample}: the gateway trusts the retired {first}: {kids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        published_kids(&http, &cluster.url(1)).await,
        vec![first],
        "node 1 stopped lagging during the test"
    );
    netns::heal();
}

/// The key ids the gateway trusts now (`/readyz`).
async fn trusted(http: &reqwest::Client, gateway: &Process) -> Vec<String> {
    let ready: Value = http
        .get(format!("{}/readyz", gateway.url))
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("readyz json");
    serde_json::from_value(ready["keys"]["kids"].clone()).expect("keys.kids")
}

async fn wait_trusting(http: &reqwest::Client, gateway: &Process, kid: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while !trusted(http, gateway).await.iter().any(|k| k == kid) {
        assert!(Instant::now() < until, "the gateway never trusted {kid}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_not_trusting(http: &reqwest::Client, gateway: &Process, kid: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while trusted(http, gateway).await.iter().any(|k| k == kid) {
        assert!(
            Instant::now() < until,
            "the gateway kept trusting the retired {kid}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Acquires a lease through `base` and writes its token through `gateway`
/// the moment the grant answers: 200 (503 retried; 401 is the failure).
async fn write_fresh_grant(http: &reqwest::Client, base: &str, gateway: &Process, name: &str) {
    let (status, grant) = support::acquire(http, base, name, "writer", 2_000).await;
    assert_eq!(status, 200, "acquire {name}: {grant}");
    let jwt = grant["jwt"].as_str().expect("jwt");
    let answer = support::send_retrying(|| {
        http.put(format!("{}/v1/objects/{name}/x", gateway.url))
            .bearer_auth(jwt)
            .body("v")
    })
    .await;
    let status = answer.status();
    assert_eq!(
        status,
        200,
        "{name}: the gateway refused a grant of the current key: {:?}",
        answer.text().await
    );
}
