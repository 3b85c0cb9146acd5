//! R1 on the gateway, attacked from outside on real processes: a 3-node
//! cluster and a gateway over TLS with a policy, the gateway serving at
//! most `MAX_REQUESTS` requests at once. `intruder`, with a valid JWT of its
//! own lease, opens more PUTs than that whose bodies never finish; `orders`
//! writes its own lease's object every 300 ms meanwhile. Every write of the
//! victim must be accepted, and the flood refused with 429 `over_share`.

use crate::support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use support::{node_setup, spawn_node, Cluster};

/// Requests in flight the gateway serves at once (`--max-requests`).
const MAX_REQUESTS: usize = 256;
/// Slow PUTs: more than the gateway's cap.
const SLOW_PUTS: usize = MAX_REQUESTS + 100;
/// HTTP/2 streams per connection the servers allow.
const STREAMS: usize = 200;

async fn grant(access: &support::Access, base: &str, principal: &str, lease: &str) -> Value {
    let (status, grant) =
        support::acquire(&access.http(principal), base, lease, principal, 60_000).await;
    assert_eq!(status, 200, "{grant}");
    grant
}

/// Fails with admission removed from the gateway: the slow PUTs fill its
/// request cap and the victim's writes wait until their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbours_slow_writes_cannot_starve_another_principals_writes() {
    let _alone = support::ALONE.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| node_setup(dir.path(), id, "127.0.0.1"))
        .collect();
    let (cluster, access) = Cluster::start_secure(dir.path(), setups);
    let base = cluster.url(cluster.leader(&access.http("admin")).await);
    let mut spec = access.gateway_for(&cluster, &dir.path().join("gateway"));
    spec.args
        .extend(["--max-requests".into(), MAX_REQUESTS.to_string()]);
    let gateway = spawn_node(spec);
    let hog = grant(&access, &base, "intruder", "orders.hog").await;
    let victim = grant(&access, &base, "orders", "orders.victim").await;

    // The victim's client and connection live on their own runtime, opened
    // before the flood (the flood this test drives must not delay them).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let writing = {
        let (client, url) = (
            access.http_with_timeout("orders", Duration::from_secs(3)),
            format!("{}/v1/objects/orders.victim/state", gateway.url),
        );
        let jwt = victim["jwt"].as_str().expect("jwt").to_owned();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let put = |i: usize| {
                    client
                        .put(&url)
                        .bearer_auth(&jwt)
                        .body(format!("v{i}"))
                        .send()
                };
                assert_eq!(put(0).await.expect("warm-up").status(), 200);
                ready_tx.send(()).expect("ready");
                let (mut outcomes, started) = (Vec::new(), Instant::now());
                let mut i = 1;
                while started.elapsed() < Duration::from_secs(6) {
                    let sent = Instant::now();
                    let status = put(i).await.map_or(0, |r| r.status().as_u16());
                    outcomes.push((status, sent.elapsed()));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(300).saturating_sub(sent.elapsed()))
                        .await;
                }
                outcomes
            })
        })
    };
    tokio::task::spawn_blocking(move || ready_rx.recv())
        .await
        .expect("join")
        .expect("the victim is ready");

    // The flood: PUTs of the intruder's own lease whose bodies never end,
    // over connections opened first.
    let hog_jwt = hog["jwt"].as_str().expect("jwt").to_owned();
    let url = format!("{}/v1/objects/orders.hog/slow", gateway.url);
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..SLOW_PUTS.div_ceil(STREAMS) {
        let client = access.http_with_timeout("intruder", Duration::from_secs(30));
        let _ = client.get(format!("{}/livez", gateway.url)).send().await;
        for _ in 0..STREAMS {
            let (client, url, jwt) = (client.clone(), url.clone(), hog_jwt.clone());
            flood.spawn(async move {
                let first: Result<Vec<u8>, std::io::Error> = Ok(b"never".to_vec());
                let never = futures::stream::iter([first]).chain(futures::stream::pending());
                client
                    .put(url)
                    .bearer_auth(jwt)
                    .header("content-length", "1000000")
                    .body(reqwest::Body::wrap_stream(never))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16())
            });
        }
    }
    let outcomes = tokio::task::spawn_blocking(move || writing.join())
        .await
        .expect("join")
        .expect("the victim's writes");
    // The flood was refused fast (429 over_share), not served: the PUTs
    // over the intruder's share have already ended.
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(done) = flood.try_join_next() {
        if let Ok(status) = done {
            *statuses.entry(status).or_default() += 1;
        }
    }
    flood.abort_all();
    eprintln!("victim writes under the flood: {outcomes:?}; flood answers: {statuses:?}");
    let failed: Vec<_> = outcomes.iter().filter(|(s, _)| *s != 200).collect();
    assert!(failed.is_empty(), "victim writes failed: {outcomes:?}");
    assert!(outcomes.len() >= 10, "too few writes: {outcomes:?}");
    assert!(
        statuses.get(&429).copied().unwrap_or(0) > 0,
        "the flood was never refused: {statuses:?}"
    );
}
