//! What an operator sees, on real processes: the Prometheus counters move
//! by exactly what happened (parsed from the text format, not grepped), the
//! gateway's fencing audit names the stale writer, and `/readyz` follows a
//! node's contact with its quorum.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{acquire, gateway_for, http_client, post_json, spawn_node, Cluster};

/// Every sample of a text exposition, by `name{labels}` as written.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(client: &reqwest::Client, base: &str) -> HashMap<String, f64> {
    let answer = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(answer.status(), 200);
    parse(&answer.text().await.expect("text"))
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

async fn put(
    client: &reqwest::Client,
    gateway: &str,
    jwt: &str,
    body: &'static str,
) -> (u16, Value) {
    let answer = client
        .put(format!("{gateway}/v1/objects/audited/state"))
        .bearer_auth(jwt)
        .body(body)
        .send()
        .await
        .expect("put");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_what_happened_and_the_audit_names_the_stale_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let mut gateway = gateway_for(&cluster, &dir.path().join("gateway"));
    gateway.args = vec!["--exp-leeway-secs".into(), "30".into()];
    let gateway = spawn_node(gateway);
    // Settled: leadership may move once just after the start, and the
    // counters below are the leader's.
    let leader = cluster.settled_leader(&client).await;
    let base = cluster.url(leader);
    let before = scrape(&client, &base).await;
    assert_eq!(value(&before, "palisade_election_is_leader"), 1.0);
    assert_eq!(value(&before, "palisade_election_has_leader"), 1.0);
    let gateway_before = scrape(&client, &gateway.url).await;

    // A grant, a renewal, then an expiry.
    let (status, old) = acquire(&client, &base, "audited", "old-leader", 1000).await;
    assert_eq!(status, 200, "{old}");
    let renew = json!({"holder": "old-leader", "token": old["token"], "secret": old["secret"]});
    let (status, body) =
        post_json(&client, &format!("{base}/v1/leases/audited/renew"), renew).await;
    assert_eq!(status, 200, "{body}");
    let old_jwt = old["jwt"].as_str().expect("jwt").to_owned();
    // The gateway may still be fetching the JWKS: retry 401s briefly.
    let mut first = (0, Value::Null);
    for _ in 0..50 {
        first = put(&client, &gateway.url, &old_jwt, "old").await;
        if first.0 != 401 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first.0, 200, "{}", first.1);
    // The old leader stops renewing; a new one is granted after expiry.
    let new = loop {
        let (status, body) = acquire(&client, &base, "audited", "new-leader", 5000).await;
        if status == 200 {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let new_jwt = new["jwt"].as_str().expect("jwt");
    assert_eq!(put(&client, &gateway.url, new_jwt, "new").await.0, 200);
    // The paused old leader wakes and writes: refused, and audited.
    let (status, body) = put(&client, &gateway.url, &old_jwt, "stale").await;
    assert_eq!(status, 409, "{body}");

    let after = scrape(&client, &base).await;
    let delta = |name: &str| value(&after, name) - value(&before, name);
    assert_eq!(delta("palisade_lease_grants_total"), 2.0, "two new grants");
    assert_eq!(delta("palisade_lease_renewals_total"), 1.0);
    assert_eq!(delta("palisade_lease_expiries_total"), 1.0);
    assert_eq!(delta("palisade_lease_releases_total"), 0.0);
    assert_eq!(value(&after, "palisade_leases_held"), 1.0);
    assert!(value(&after, "palisade_election_log_fsync_duration_seconds_count") > 0.0);
    assert!(value(&after, "palisade_lease_renew_duration_seconds_count") >= 1.0);

    let gateway_after = scrape(&client, &gateway.url).await;
    let writes = |samples: &HashMap<String, f64>, result: &str| {
        value(
            samples,
            &format!("palisade_gateway_writes_total{{op=\"put\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(
        writes(&gateway_after, "accepted") - writes(&gateway_before, "accepted"),
        2.0
    );
    assert_eq!(
        writes(&gateway_after, "stale_token") - writes(&gateway_before, "stale_token"),
        1.0
    );
    let gateway_delta = |name: &str| value(&gateway_after, name) - value(&gateway_before, name);
    assert_eq!(
        gateway_delta("palisade_gateway_fence_raises_total"),
        2.0,
        "the old and the new leader's first writes raised the fence"
    );
    assert!(gateway_delta("palisade_gateway_store_fsync_duration_seconds_count") >= 1.0);

    let audit: Value = support::get_json(
        &client,
        &format!("{}/v1/fences/audited", gateway.url),
        "fence",
    )
    .await;
    assert_eq!(audit["fence"], new["token"]);
    assert_eq!(audit["refused"]["count"], 1, "{audit}");
    let last = &audit["refused"]["last"];
    assert_eq!(last["holder"], "old-leader", "{audit}");
    assert_eq!(last["token"], old["token"]);
    assert_eq!(last["key"], "audited/state");
    assert!(
        last["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{audit}"
    );
}

/// `/readyz` is 503 on a node cut off from its quorum (the two others
/// paused) and 200 again once they are back and it has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_contact_with_the_quorum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let ready = |id: u64| {
        let (client, url) = (client.clone(), format!("{}/readyz", cluster.url(id)));
        async move {
            match client.get(url).send().await {
                Ok(answer) => answer.status().as_u16(),
                Err(_) => 0,
            }
        }
    };
    let all_ready = || async {
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(10) {
            let mut all = true;
            for id in cluster.ids() {
                all &= ready(id).await == 200;
            }
            if all {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(
        all_ready().await,
        "a node of a healthy cluster is not ready"
    );
    for id in cluster.ids().filter(|id| *id != leader) {
        cluster.pause(id).expect("SIGSTOP");
    }
    let cut_off = Instant::now();
    let mut status = 200;
    while cut_off.elapsed() < Duration::from_secs(5) {
        status = ready(leader).await;
        if status == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in cluster.ids().filter(|id| *id != leader) {
        cluster.resume(id).expect("SIGCONT");
    }
    assert_eq!(status, 503, "the cut-off leader still says it is ready");
    assert!(all_ready().await, "not every node ready again within 10 s");
}
