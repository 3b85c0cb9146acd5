//! R1 with partitions: a call that spans partitions (the lease list, a
//! batch renewal) is put together by the node it reaches, which asks every
//! partition's leader for its part; so one principal's flood of them lands
//! on every leader at once. On a 3-node cluster of 4 partitions over TLS
//! with a policy, `intruder` floods every node with lease lists and
//! 256-entry batch renewals that span every partition, from 16 tasks per
//! node and kind, while `orders` renews a 3 s lease every 400 ms through
//! every node in turn. No renewal may be refused for load or left
//! unanswered, and the lease must be held at the end with its token.

use crate::noisy_neighbour::{start_victim, starved};
use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::partitions::{steady_nodes, until_led};
use support::{Access, Cluster};

const PARTITIONS: u32 = 4;
/// Flooding tasks per node and kind of call.
const TASKS: usize = 16;
/// How long the flood runs: past the victim's 10 s of renewals.
const FLOOD: Duration = Duration::from_secs(12);

/// One flooding task: `kind` through `url` until `until`; how many calls
/// were answered 200 and how many refused 429.
async fn flood(client: reqwest::Client, url: String, kind: usize, until: Instant) -> (u64, u64) {
    let renewals: Vec<Value> = (0..256)
        .map(|i| json!({"lease": format!("orders.flood-{i}"), "holder": "intruder", "token": 1}))
        .collect();
    let batch = json!({ "renewals": renewals });
    let (mut served, mut refused) = (0, 0);
    while Instant::now() < until {
        let answer = if kind == 0 {
            client
                .get(format!("{url}/v1/leases?prefix=orders.&limit=1000"))
                .send()
                .await
        } else {
            client
                .post(format!("{url}/v1/renew"))
                .json(&batch)
                .send()
                .await
        };
        match answer.map(|a| a.status().as_u16()) {
            Ok(200) => served += 1,
            Ok(429) => refused += 1,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    (served, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_spanning_calls_cannot_make_a_holder_lose_its_lease() {
    let _alone = support::ALONE.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, access) = Cluster::start_secure(dir.path(), steady_nodes(dir.path(), PARTITIONS));
    let admin = access.http("admin");
    // Placement settled first (partition k led by its home, node 1 + k % 3),
    // so no handover of the test's own making lands in the flood.
    let home = |l: &[(u64, u64)]| {
        l.len() == PARTITIONS as usize && (0..).zip(l).all(|(k, (leader, _))| *leader == 1 + k % 3)
    };
    until_led(&admin, &cluster.url(1), Duration::from_secs(30), home).await;
    let leader = cluster.leader(&admin).await;
    let grant = acquire_victim(&access, &cluster.url(leader)).await;
    let renewing = start_victim(&access, &cluster, grant["token"].clone(), victim_secret()).await;
    let until = Instant::now() + FLOOD;
    let mut flooding = tokio::task::JoinSet::new();
    for url in cluster.urls() {
        let client = access.http_with_timeout("intruder", Duration::from_secs(5));
        for task in 0..2 * TASKS {
            flooding.spawn(flood(client.clone(), url.clone(), task % 2, until));
        }
    }
    let (renewals, peak_rss) = tokio::task::spawn_blocking(move || renewing.join())
        .await
        .expect("join")
        .expect("renewals");
    let (mut served, mut refused) = (0, 0);
    while let Some(done) = flooding.join_next().await {
        let (s, r) = done.expect("a flooding task");
        served += s;
        refused += r;
    }
    let ok = renewals.iter().filter(|r| r.status == 200).count();
    eprintln!(
        "{ok} of {} renewals under a flood of spanning calls ({served} served, {refused} refused 429), peak node RSS {} MB",
        renewals.len(),
        peak_rss >> 20
    );
    let lost: Vec<_> = renewals.iter().filter(|r| r.status == 409).collect();
    assert!(lost.is_empty(), "the victim lost its lease: {renewals:?}");
    let starved = starved(&renewals);
    assert!(starved.is_empty(), "renewals refused for load: {starved:?}");
    assert!(
        ok * 2 >= renewals.len(),
        "fewer than half served: {renewals:?}"
    );
    assert!(
        served > 0,
        "the flood never reached the partitions' leaders"
    );
    let lease: Value = admin
        .get(format!("{}/v1/leases/orders.victim", cluster.url(leader)))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(lease["holder"], "victim", "{lease}");
    assert_eq!(lease["token"], grant["token"], "{lease}");
}

fn victim_secret() -> String {
    std::iter::repeat_n('v', 43).collect()
}

/// The victim's 3 s grant of `orders.victim`, acquired through `url`.
async fn acquire_victim(access: &Access, url: &str) -> Value {
    let victim = access.http("orders");
    for _ in 0..100 {
        let answer = victim
            .post(format!("{url}/v1/leases/orders.victim/acquire"))
            .json(&json!({"holder": "victim", "ttl_ms": 3000, "secret": victim_secret()}))
            .send()
            .await
            .expect("acquire");
        if answer.status() == 200 {
            return answer.json().await.expect("grant");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the victim got no grant");
}
