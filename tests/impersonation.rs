//! Reservations bound to identity, attacked from outside on real processes:
//! a 3-node cluster over TLS with a policy where `orders` and `intruder`
//! have the same rights on `orders.*`. A handover's or a preemption's
//! reservation names a holder; knowing (or guessing) that name must not be
//! enough for another principal to take the lease.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{node_setup, Cluster};

fn setups(dir: &std::path::Path) -> Vec<palisade_local_cluster::NodeSetup> {
    (1..=3).map(|id| node_setup(dir, id, "127.0.0.1")).collect()
}

/// POSTs `body` to `path` on `base` and returns the status and JSON body,
/// retrying 503 (an election a loaded machine can start at any moment; every
/// call here is idempotent: the same holder and secret get the same grant).
async fn post(client: &reqwest::Client, base: &str, path: &str, body: Value) -> (u16, Value) {
    support::post_json(client, &format!("{base}{path}"), body).await
}

fn secret(byte: char) -> String {
    std::iter::repeat_n(byte, 43).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_holder_name_does_not_take_a_reservation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, access) = Cluster::start_secure(dir.path(), setups(dir.path()));
    let (orders, intruder, admin) = (
        access.http("orders"),
        access.http("intruder"),
        access.http("admin"),
    );
    let leader = cluster.leader(&admin).await;
    let base = cluster.url(leader);
    // The first leader installs the signing key: wait for it (bounded).
    for _ in 0..100 {
        let jwks: Value = admin
            .get(format!("{base}/v1/jwks"))
            .send()
            .await
            .expect("jwks")
            .json()
            .await
            .expect("json");
        if jwks["keys"].as_array().is_some_and(|keys| !keys.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Handover: orders' holder A hands over to its successor B (by default
    // B must call as orders too).
    let lease = "/v1/leases/orders.job";
    let (status, a) = post(
        &orders,
        &base,
        &format!("{lease}/acquire"),
        json!({"holder": "A", "ttl_ms": 5000, "secret": secret('a')}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    let (status, handed) = post(
        &orders,
        &base,
        &format!("{lease}/handover"),
        json!({"holder": "A", "token": a["token"], "secret": secret('a'), "to": "B"}),
    )
    .await;
    assert_eq!(status, 200, "{handed}");
    // The intruder names B: refused, the lease stays reserved.
    let (status, stolen) = post(
        &intruder,
        &base,
        &format!("{lease}/acquire"),
        json!({"holder": "B", "ttl_ms": 5000, "secret": secret('i')}),
    )
    .await;
    assert_eq!(status, 409, "the intruder took the handover: {stolen}");
    assert_eq!(stolen["error"], "held", "{stolen}");
    let (status, b) = post(
        &orders,
        &base,
        &format!("{lease}/acquire"),
        json!({"holder": "B", "ttl_ms": 5000, "secret": secret('b')}),
    )
    .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["token"], handed["token"], "B takes the reserved token");

    // Preemption: a preemptible grant of orders' P is preempted by a waiting
    // priority-10 acquire of orders' holder "boss"; the intruder, naming
    // "boss" with the same priority, must not take the reservation.
    let lease = "/v1/leases/orders.batch";
    let (status, p) = post(
        &orders,
        &base,
        &format!("{lease}/acquire"),
        json!({"holder": "P", "ttl_ms": 5000, "secret": secret('p'), "preemptible": true}),
    )
    .await;
    assert_eq!(status, 200, "{p}");
    let boss = {
        let (orders, base) = (orders.clone(), base.clone());
        tokio::spawn(async move {
            post(
                &orders,
                &base,
                "/v1/leases/orders.batch/acquire",
                json!({"holder": "boss", "ttl_ms": 5000, "secret": secret('s'),
                       "priority": 10, "wait_ms": 8000}),
            )
            .await
        })
    };
    // P learns it was preempted on its renewal, and lets go.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = post(
            &orders,
            &base,
            &format!("{lease}/renew"),
            json!({"holder": "P", "token": p["token"], "secret": secret('p')}),
        )
        .await;
        if status == 409 && body["error"] == "preempted" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never preempted: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The intruder, waiting as "boss" too, races the release.
    let thief = {
        let (intruder, base) = (intruder.clone(), base.clone());
        tokio::spawn(async move {
            post(
                &intruder,
                &base,
                "/v1/leases/orders.batch/acquire",
                json!({"holder": "boss", "ttl_ms": 5000, "secret": secret('t'),
                       "priority": 10, "wait_ms": 1500}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, released) = post(
        &orders,
        &base,
        &format!("{lease}/release"),
        json!({"holder": "P", "token": p["token"], "secret": secret('p')}),
    )
    .await;
    assert_eq!(status, 200, "{released}");
    let (status, granted) = boss.await.expect("boss");
    assert_eq!(
        status, 200,
        "the preemptor did not get the lease: {granted}"
    );
    let (status, stolen) = thief.await.expect("thief");
    assert_eq!(
        status, 409,
        "the intruder took the preemptor's lease: {stolen}"
    );
}
