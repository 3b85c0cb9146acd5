//! A leader cut off from both followers stops acting as one (issue 42), on
//! real processes in a private network namespace (as the fault suite's
//! partitions: `fault_suite/netns.rs`; needs root, skipped otherwise unless
//! `PALISADE_FAULT_STRICT=1`).
//!
//! A client renews a grant on the leader every 20 ms; iptables then cuts
//! the leader from both followers while it keeps answering clients. Its
//! `/v1/cluster` must stop naming a leader and say `leading: false` soon
//! after its leader lease (openraft's: the election timeout's maximum, 120
//! ms here) lapsed, `/readyz` must be 503, and no renewal sent to it after
//! the cut plus one lease may be answered 200. Before, it said
//! `"state":"Leader","leader":<itself>` for as long as the cut lasted.

use crate::netns;
use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{node_setup, Cluster};

/// openraft's leader lease with the nodes' default election timeout
/// (60-120 ms): its maximum.
const LEASE: Duration = Duration::from_millis(120);

#[test]
fn a_cut_off_leader_says_it_does_not_lead_and_renews_nothing_after_its_lease() {
    netns::block_on_private(run());
}

/// Renewals sent to one node: when each was sent, and its status.
type Sent = Arc<Mutex<Vec<(Instant, u16)>>>;

async fn run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| node_setup(dir.path(), id, &netns::node_host(id)))
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let http = support::http_client();
    let leader = cluster.settled_leader(&http).await;
    let url = cluster.url(leader);
    let (status, grant) = support::acquire(&http, &url, "orders", "A", 30_000).await;
    assert_eq!(status, 200, "{grant}");
    let sent: Sent = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = tokio::spawn(renew_every_20_ms(
        url.clone(),
        grant["token"].as_u64().expect("token"),
        sent.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for other in &others {
        netns::cut(leader, *other);
    }
    let cut = Instant::now();
    let view = not_leading_view(&http, &url).await;
    let took = cut.elapsed();
    println!("node {leader} said it does not lead {took:?} after the cut: {view}");
    assert!(
        took < LEASE + Duration::from_secs(1),
        "not leading only {took:?} after the cut"
    );
    assert_eq!(view["leader"], Value::Null, "{view}");
    assert!(view["not_leading_reason"].is_string(), "{view}");
    let ready = http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "a cut-off leader is not ready");
    cluster
        .leader_among(&http, &others, 100)
        .await
        .expect("the followers elect a leader of their own");
    // Past the cut-off leader's patience (a second of silence), so the
    // renewals it got after the cut are refused, not just waiting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    renewer.await.expect("renewer");
    netns::heal();

    let sent = sent.lock().expect("sent").clone();
    let before = sent.iter().filter(|(at, s)| *at < cut && *s == 200).count();
    assert!(
        before > 5,
        "the renewals were answered before the cut: {sent:?}"
    );
    let late: Vec<Duration> = sent
        .iter()
        .filter(|(at, status)| *status == 200 && *at > cut + LEASE)
        .map(|(at, _)| at.duration_since(cut))
        .collect();
    assert!(
        late.is_empty(),
        "renewals sent to the cut-off leader after its lease were answered 200 (sent this long after the cut): {late:?}"
    );
    let refused = sent.iter().filter(|(at, s)| *at > cut && *s == 503).count();
    assert!(refused > 0, "no renewal refused after the cut: {sent:?}");
}

/// Renews `token` of `orders` for A at `url` every 20 ms until `stop`,
/// noting each renewal's send time and status (0: no answer).
async fn renew_every_20_ms(
    url: String,
    token: u64,
    sent: Sent,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .expect("client");
    let body = json!({"holder": "A", "token": token, "secret": support::test_secret("A")});
    let renew = format!("{url}/v1/leases/orders/renew");
    // Bounded: the test stops it within a few seconds; 1 000 rounds at most.
    for _ in 0..1_000 {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let at = Instant::now();
        let status = match http.post(&renew).json(&body).send().await {
            Ok(answer) => answer.status().as_u16(),
            Err(_) => 0,
        };
        sent.lock().expect("sent").push((at, status));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `url`'s `/v1/cluster` every 10 ms (at most 5 s) until it says it
/// does not lead; that view.
async fn not_leading_view(http: &reqwest::Client, url: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..500 {
        if let Ok(answer) = http.get(format!("{url}/v1/cluster")).send().await {
            if let Ok(view) = answer.json::<Value>().await {
                if view["leading"] == json!(false) {
                    return view;
                }
                last = view;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cut-off leader still says it leads after 5 s: {last}");
}
