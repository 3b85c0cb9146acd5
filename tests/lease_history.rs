//! A lease's history (issue 31) on real processes: one lease passed
//! through every cause — acquire, preempt, release, claim, handover,
//! expire, revoke — over the HTTP API; its `GET /v1/leases/{name}/history`
//! is complete, in log order, stamped with times inside the run, and the
//! same after the leader is killed -9 (read from the new leader) and after
//! a full restart of the cluster; the CLI prints it; under churn it stays
//! at its bound.

use crate::support;

use std::process::Command as Process;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::{acquire, http_client, post_json, test_secret, Cluster};

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

/// GET `url`: the status and the JSON body.
async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let answer = client.get(url).send().await.expect("GET");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON body"))
}

async fn history(client: &reqwest::Client, base: &str, lease: &str) -> (u16, Value) {
    let url = format!("{base}/v1/leases/{lease}/history");
    for _ in 0..100 {
        let (status, body) = get(client, &url).await;
        if status != 503 {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("GET {url} kept answering 503");
}

/// The lease's holder, polled until `want` (or 10 s).
async fn wait_holder(client: &reqwest::Client, cluster: &Cluster, lease: &str, want: Value) {
    for _ in 0..200 {
        let leader = cluster.leader(client).await;
        let url = format!("{}/v1/leases/{lease}", cluster.url(leader));
        let (status, body) = get(client, &url).await;
        if status == 200 && body["holder"] == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{lease} never had holder {want}");
}

/// (cause, holder, token) of each transition.
fn causes(history: &Value) -> Vec<(String, String, u64)> {
    let entries = history["history"].as_array().expect("history array");
    entries
        .iter()
        .map(|t| {
            (
                t["cause"].as_str().expect("cause").to_owned(),
                t["holder"].as_str().unwrap_or("-").to_owned(),
                t["token"].as_u64().expect("token"),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_history_is_complete_in_order_and_survives_failover_and_restart() {
    let started = now_ms();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let post = |path: &str, body: Value| {
        let (client, url) = (client.clone(), format!("{base}/v1/leases/hist/{path}"));
        async move { post_json(&client, &url, body).await }
    };

    // a: preemptible, priority 1.
    let (status, a) = post(
        "acquire",
        json!({"holder": "a", "ttl_ms": 10_000, "secret": test_secret("a"),
               "priority": 1, "preemptible": true}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    let a_token = a["token"].as_u64().expect("token");
    // b waits with priority 5: a is preempted (revoked) ...
    let waiting = tokio::spawn(post(
        "acquire",
        json!({"holder": "b", "ttl_ms": 10_000, "secret": test_secret("b"),
               "priority": 5, "wait_ms": 8_000}),
    ));
    for _ in 0..200 {
        let (_, lease) = get(&client, &format!("{base}/v1/leases/hist")).await;
        if lease["preempted_by"] == "b" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // ... releases, and b's waiting acquire claims the reservation.
    let (status, released) = post(
        "release",
        json!({"holder": "a", "token": a_token, "secret": test_secret("a")}),
    )
    .await;
    assert_eq!(status, 200, "{released}");
    let (status, b) = waiting.await.expect("b's acquire");
    assert_eq!(status, 200, "{b}");
    let b_token = b["token"].as_u64().expect("token");
    // b hands over to c, who never takes it: the reservation expires.
    let (status, handed) = post(
        "handover",
        json!({"holder": "b", "token": b_token, "secret": test_secret("b"),
               "to": "c", "window_ms": 500}),
    )
    .await;
    assert_eq!(status, 200, "{handed}");
    let c_token = handed["token"].as_u64().expect("token");
    wait_holder(&client, &cluster, "hist", Value::Null).await;
    // d acquires, an operator revokes it.
    let (status, d) = acquire(&client, &base, "hist", "d", 10_000).await;
    assert_eq!(status, 200, "{d}");
    let d_token = d["token"].as_u64().expect("token");
    let (status, revoked) = post("revoke", json!({ "token": d_token })).await;
    assert_eq!(status, 200, "{revoked}");

    let (status, before) = history(&client, &base, "hist").await;
    assert_eq!(status, 200, "{before}");
    let s = |v: &str| v.to_owned();
    assert_eq!(
        causes(&before),
        vec![
            (s("acquire"), s("a"), a_token),
            (s("preempt"), s("a"), a_token),
            (s("release"), s("a"), a_token),
            (s("claim"), s("b"), b_token),
            (s("handover"), s("c"), c_token),
            (s("expire"), s("c"), c_token),
            (s("acquire"), s("d"), d_token),
            (s("revoke"), s("d"), d_token),
        ],
        "{before}"
    );
    let entries = before["history"].as_array().expect("array");
    let (indexes, times): (Vec<u64>, Vec<u64>) = entries
        .iter()
        .map(|t| {
            (
                t["index"].as_u64().expect("index"),
                t["at_ms"].as_u64().expect("at_ms"),
            )
        })
        .unzip();
    assert!(
        indexes.windows(2).all(|w| w[0] < w[1]),
        "log order: {indexes:?}"
    );
    let ended = now_ms();
    assert!(
        times.iter().all(|t| (started..=ended).contains(t)),
        "times {times:?} outside the run {started}..{ended}"
    );

    // The CLI prints it, one line per transition.
    let out = Process::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["lease", "history", "hist", "--election", &base])
        .output()
        .expect("palisade lease history");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 9, "{text}");
    assert!(
        text.contains(&format!("handover  c (token {c_token})")),
        "{text}"
    );

    // Failover: the new leader tells the same history.
    cluster.kill(leader);
    let next = cluster.leader(&client).await;
    assert_ne!(next, leader);
    let (_, after_failover) = history(&client, &cluster.url(next), "hist").await;
    assert_eq!(after_failover["history"], before["history"]);
    cluster.start_node(leader).expect("restart the old leader");

    // Full restart: the same again.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start_node(id).expect("restart");
    }
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let (_, after_restart) = history(&client, &base, "hist").await;
    assert_eq!(after_restart["history"], before["history"]);

    // Churn keeps it at its bound, newest last.
    for round in 0..6 {
        let holder = format!("churn{round}");
        let (status, grant) = acquire(&client, &base, "hist2", &holder, 5_000).await;
        assert_eq!(status, 200, "{grant}");
        let body =
            json!({"holder": holder, "token": grant["token"], "secret": test_secret(&holder)});
        let url = format!("{base}/v1/leases/hist2/release");
        assert_eq!(post_json(&client, &url, body).await.0, 200);
    }
    let (_, churned) = history(&client, &base, "hist2").await;
    let kept = churned["kept"].as_u64().expect("kept") as usize;
    let churned = causes(&churned);
    assert_eq!(churned.len(), kept, "{churned:?}");
    assert_eq!(churned.last().map(|c| c.0.as_str()), Some("release"));
    assert_eq!(churned.last().map(|c| c.1.as_str()), Some("churn5"));

    // Unknown lease: 404 with a JSON error; a bad name: 400.
    let (status, missing) = history(&client, &base, "never-granted").await;
    assert_eq!(status, 404, "{missing}");
    let (status, bad) = history(&client, &base, "bad%20name").await;
    assert_eq!(status, 400, "{bad}");
}
