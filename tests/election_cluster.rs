//! The election cluster as real processes: three `palisade election` nodes on
//! loopback, faults injected with SIGKILL and SIGSTOP. Each test names the
//! property it checks (S2 tokens, S3 exclusivity, S4 durability, L1 liveness).

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{
    acquire, get_json, http_client, post_json, post_json_once, send_retrying, test_secret, Cluster,
};

/// Clusters are heavy on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn renew(
    client: &reqwest::Client,
    base: &str,
    lease: &str,
    holder: &str,
    token: u64,
) -> (u16, Value) {
    post_json(
        client,
        &format!("{base}/v1/leases/{lease}/renew"),
        json!({ "holder": holder, "token": token, "secret": test_secret(holder) }),
    )
    .await
}

/// Renews through any surviving node, retrying 503s while a new leader is elected.
async fn renew_anywhere(
    client: &reqwest::Client,
    cluster: &Cluster,
    lease: &str,
    holder: &str,
    token: u64,
) -> (u16, Value) {
    for _ in 0..100 {
        for id in 1..=3 {
            if !cluster.is_running(id) {
                continue;
            }
            let (status, body) = renew(client, &cluster.url(id), lease, holder, token).await;
            if status != 503 {
                return (status, body);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("renew kept answering 503");
}

async fn lease(client: &reqwest::Client, base: &str, lease: &str) -> (u16, Value) {
    for _ in 0..100 {
        let response = client
            .get(format!("{base}/v1/leases/{lease}"))
            .send()
            .await
            .expect("get");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        if status != 503 {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("GET {lease} kept answering 503");
}

/// S3 and S2 across failover: SIGKILL the Raft leader; the held lease stays
/// with the same holder and token and can be renewed through a survivor; a
/// new grant gets a higher token.
#[tokio::test]
async fn leader_kill_keeps_the_lease_and_tokens_rise() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let (status, grant) = acquire(&client, &cluster.url(leader), "jobs", "worker-a", 5000).await;
    assert_eq!(status, 200, "{grant}");
    let token = grant["token"].as_u64().expect("token");

    cluster.kill(leader);
    let (status, renewed) = renew_anywhere(&client, &cluster, "jobs", "worker-a", token).await;
    assert_eq!(status, 200, "renew after failover: {renewed}");
    assert_eq!(renewed["token"], token, "same token after failover");
    let new_leader = cluster.leader(&client).await;
    assert_ne!(new_leader, leader);

    let (status, other) =
        acquire(&client, &cluster.url(new_leader), "jobs", "worker-b", 5000).await;
    assert_eq!(status, 409, "still held by worker-a: {other}");
    assert_eq!(other["error"], "held");
    assert_eq!(other["holder"], "worker-a");

    let (status, fresh) =
        acquire(&client, &cluster.url(new_leader), "other", "worker-b", 5000).await;
    assert_eq!(status, 200, "{fresh}");
    assert!(
        fresh["token"].as_u64().expect("token") > token,
        "new grants get higher tokens"
    );
}

/// S2 and S4 across a full-cluster restart: every node SIGKILLed and
/// restarted on its data dir; held leases survive with their tokens, and new
/// tokens are above every token issued before.
#[tokio::test]
async fn full_restart_keeps_grants_and_tokens_continue_above() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let mut highest = 0;
    for i in 0..5 {
        let (status, grant) =
            acquire(&client, &cluster.url(leader), &format!("l{i}"), "h", 60_000).await;
        assert_eq!(status, 200, "{grant}");
        highest = highest.max(grant["token"].as_u64().expect("token"));
    }
    let (status, release) = post_json(
        &client,
        &format!("{}/v1/leases/l0/release", cluster.url(leader)),
        json!({ "holder": "h", "token": highest - 4, "secret": test_secret("h") }),
    )
    .await;
    assert!(status == 200 || status == 409, "{release}");

    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start_node(id).expect("restart");
    }
    let leader = cluster.leader(&client).await;
    let (status, held) = lease(&client, &cluster.url(leader), "l4").await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(
        held["holder"], "h",
        "an acknowledged grant survives a full restart"
    );
    assert_eq!(held["token"], highest);
    let (status, grant) = acquire(&client, &cluster.url(leader), "after-restart", "h", 5000).await;
    assert_eq!(status, 200, "{grant}");
    assert!(
        grant["token"].as_u64().expect("token") > highest,
        "token {} must exceed {highest}",
        grant["token"]
    );
}

/// No grant without a quorum: with the two other nodes SIGSTOPped, the
/// remaining node answers 503 (fast, not a hang) and grants nothing.
#[tokio::test]
async fn an_isolated_node_grants_nothing() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let (status, ready) = acquire(&client, &cluster.url(leader), "warm-up", "x", 5000).await;
    assert_eq!(status, 200, "{ready}");
    // Isolate the leader itself: the harder case, it believed it led.
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &others {
        cluster.pause(*id).expect("SIGSTOP");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, body) = post_json_once(
        &client,
        &format!("{}/v1/leases/isolated/acquire", cluster.url(leader)),
        json!({ "holder": "x", "ttl_ms": 5000 }),
    )
    .await;
    let took = started.elapsed();
    for id in &others {
        cluster.resume(*id).expect("SIGCONT");
    }
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "no_quorum");
    assert!(took < Duration::from_secs(4), "answered in {took:?}");
    let leader = cluster.leader(&client).await;
    let (status, body) = lease(&client, &cluster.url(leader), "isolated").await;
    assert_eq!(status, 404, "nothing was granted: {body}");
}

/// L1 and S2: a holder that stops renewing loses the lease after its ttl
/// (not before), and the next holder gets a higher token.
#[tokio::test]
async fn an_unrenewed_lease_expires_and_the_next_token_is_higher() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let sent = Instant::now();
    let (status, grant) = acquire(&client, &base, "cron", "old", 1000).await;
    assert_eq!(status, 200, "{grant}");
    let token = grant["token"].as_u64().expect("token");
    let (status, _) = acquire(&client, &base, "cron", "new", 1000).await;
    assert_eq!(status, 409, "held while the ttl runs");

    let next = loop {
        let (status, body) = acquire(&client, &base, "cron", "new", 1000).await;
        if status == 200 {
            break body;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "not free within ttl + slack"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        sent.elapsed() >= Duration::from_millis(1000),
        "expired early: {:?}",
        sent.elapsed()
    );
    assert!(next["token"].as_u64().expect("token") > token);
    let (status, body) = renew(&client, &base, "cron", "old", token).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "lost");
}

/// S3: the holder asking again for the grant it has, right as it expires,
/// is never told it holds a grant the leader is freeing. (The fault suite
/// found this: the repeated acquire returned the same token while that
/// token's `Expire` was already on its way, and another holder got the lease
/// 15 ms later.) Each trial: "old" takes a 500 ms lease and never renews,
/// "new" blocks on it, and "old" asks again once, at an offset swept across
/// the expiry (the window is the few ms between the leader deciding to
/// expire and the `Expire` committing). A grant "old" is given must outlast,
/// by the SDK's rule (send + 90% of ttl), the moment "new" is granted.
/// Under CPU load it also caught a second path: the table check and the
/// lessor's extension were two steps, and an Expire applying between them
/// let the lessor start the freed grant afresh (`api.rs::extend`).
#[tokio::test]
async fn a_repeated_acquire_never_revives_an_expiring_grant() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let mut revived = 0;
    for batch in 0..6u64 {
        let leader = cluster.leader(&client).await;
        let base = cluster.url(leader);
        let trials: Vec<_> = (0..10u64)
            .map(|i| {
                let offset = Duration::from_micros(497_000 + (batch * 10 + i) * 400);
                let lease = format!("race{batch}-{i}");
                tokio::spawn(trial(client.clone(), base.clone(), lease, offset))
            })
            .collect();
        for trial in trials {
            let outcome = trial.await.expect("trial");
            if let Some((told, new_token, believed_past_grant)) = outcome {
                revived += 1;
                assert!(
                    believed_past_grant.is_none(),
                    "\"old\" was told it held token {told} {:?} past the grant of token \
                     {new_token} to \"new\"",
                    believed_past_grant.unwrap_or_default()
                );
            }
        }
    }
    eprintln!("{revived} of 60 trials gave \"old\" a grant before \"new\" got one");
}

/// One trial: `Some((old's token, new's token, how long old would still
/// believe after new's grant))` when both were granted.
async fn trial(
    client: reqwest::Client,
    base: String,
    lease: String,
    offset: Duration,
) -> Option<(u64, u64, Option<Duration>)> {
    let url = format!("{base}/v1/leases/{lease}/acquire");
    let (status, grant) = acquire(&client, &base, &lease, "old", 500).await;
    assert_eq!(status, 200, "{grant}");
    let granted = Instant::now();
    let waiter = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let body = json!({"holder": "new", "ttl_ms": 500, "wait_ms": 2000});
            let (status, grant) = post_json_once(&client, &url, body).await;
            (status, grant, Instant::now())
        })
    };
    tokio::time::sleep_until((granted + offset).into()).await;
    let sent = Instant::now();
    let old = json!({"holder": "old", "ttl_ms": 500, "secret": test_secret("old")});
    let (status, again) = post_json_once(&client, &url, old).await;
    let (new_status, new_grant, new_at) = waiter.await.expect("waiter");
    if status != 200 || new_status != 200 {
        return None;
    }
    let told = again["token"].as_u64().expect("token");
    let new_token = new_grant["token"].as_u64().expect("token");
    assert!(told < new_token, "tokens go up");
    let believed_until = sent + Duration::from_millis(450);
    Some((
        told,
        new_token,
        believed_until.checked_duration_since(new_at),
    ))
}

/// A blocking acquire waits for the lease to be freed, and a watch sees it.
#[tokio::test]
async fn blocking_acquire_and_watch() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let (_, grant) = acquire(&client, &base, "q", "first", 60_000).await;
    let token = grant["token"].as_u64().expect("token");
    let follower = (1..=3).find(|id| *id != leader).expect("follower");
    let watch_url = format!(
        "{}/v1/leases/q/watch?index={token}&wait_ms=10000",
        cluster.url(follower)
    );
    let watcher = tokio::spawn({
        let client = client.clone();
        async move { get_json::<Value>(&client, &watch_url, "watch").await }
    });
    let waiter = tokio::spawn({
        let (client, url) = (
            client.clone(),
            format!("{}/v1/leases/q/acquire", cluster.url(follower)),
        );
        async move {
            // `wait_ms` written as a float (a JSON Schema integer): the
            // follower must still forward it with the whole wait (it gave
            // up at the quorum timeout, 2 s, before; schemathesis found
            // it). A quick 503 (leadership settling after the start) is
            // asked again; a slow one is the failure.
            let body = json!({ "holder": "second", "ttl_ms": 5000, "wait_ms": 10000.0 });
            loop {
                let sent = Instant::now();
                let answer = support::post_json_once(&client, &url, body.clone()).await;
                if answer.0 != 503 || sent.elapsed() > Duration::from_millis(1500) {
                    break answer;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    // Longer than the quorum timeout: a forwarded blocking acquire must wait.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, _) = post_json(
        &client,
        &format!("{base}/v1/leases/q/release"),
        json!({ "holder": "first", "token": token, "secret": test_secret("first") }),
    )
    .await;
    assert_eq!(status, 200);
    let (status, second) = waiter.await.expect("waiter");
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["holder"], "second");
    let event = watcher.await.expect("watcher");
    assert!(
        event["modify_index"].as_u64().expect("index") > token,
        "{event}"
    );
}

/// L1: a blocking acquire waiting on a leader that is deposed (paused past
/// an election, as a long GC pause or a frozen VM would) is answered 503 as
/// soon as the node learns it no longer leads, not at the end of its wait,
/// so the client has the time to ask the new leader. (Found by the one-hour
/// soak: 50 of 200 waiters stranded on a deposed leader until their waits
/// ran out.)
#[tokio::test]
async fn a_waiter_on_a_deposed_leader_is_told_at_once() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    // Leadership may still move once just after the start: the waiter must
    // wait on the node that is paused.
    let mut leader = cluster.leader(&client).await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cluster.leader(&client).await;
        if now == leader {
            break;
        }
        leader = now;
    }
    let base = cluster.url(leader);
    let (status, held) = acquire(&client, &base, "deposed", "first", 60_000).await;
    assert_eq!(status, 200, "{held}");
    let waiter = tokio::spawn({
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let url = format!("{base}/v1/leases/deposed/acquire");
        async move {
            let body = json!({ "holder": "second", "ttl_ms": 5000, "wait_ms": 25_000 });
            post_json_once(&client, &url, body).await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    cluster.pause(leader).expect("SIGSTOP");
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let new_leader = cluster.leader_among(&client, &others, 300).await;
    cluster.resume(leader).expect("SIGCONT");
    let resumed = Instant::now();
    assert!(new_leader.is_some(), "no other node took over in 15 s");
    let (status, body) = waiter.await.expect("waiter");
    let took = resumed.elapsed();
    eprintln!("the waiter was answered {took:?} after its node resumed: {status} {body}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "no_quorum", "{body}");
    // Without the leadership watch the call waits out its 25 s.
    assert!(
        took < Duration::from_secs(8),
        "answered {took:?} after the deposed leader resumed: {body}"
    );
}

/// The JWT of a grant verifies against the JWKS of every node.
#[tokio::test]
async fn grant_jwts_verify_against_every_node_jwks() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let (_, grant) = acquire(&client, &cluster.url(leader), "signed", "h", 5000).await;
    let jwt = grant["jwt"].as_str().expect("jwt");
    let kid = jsonwebtoken::decode_header(jwt)
        .expect("header")
        .kid
        .expect("kid");
    for id in 1..=3 {
        // A follower publishes the key once it has applied its log entry.
        let mut published = None;
        for _ in 0..100 {
            let set: jsonwebtoken::jwk::JwkSet =
                get_json(&client, &format!("{}/v1/jwks", cluster.url(id)), "jwks").await;
            if let Some(jwk) = set.find(&kid) {
                published = Some(jwk.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let jwk = published.unwrap_or_else(|| panic!("node {id} does not publish {kid}"));
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwk).expect("key");
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        validation.set_issuer(&["palisade"]);
        let claims = jsonwebtoken::decode::<Value>(jwt, &key, &validation)
            .expect("verifies")
            .claims;
        assert_eq!(claims["token"], grant["token"]);
        assert_eq!(claims["lease"], "signed");
        assert_eq!(claims["sub"], "h");
    }
}

/// Bad input gets a 400/409 JSON error and changes nothing.
#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let (_, grant) = acquire(&client, &base, "good", "h", 60_000).await;
    let token = grant["token"].as_u64().expect("token");
    let (_, before) = lease(&client, &base, "good").await;

    let long_name = "x".repeat(129);
    for name in ["a%20b", long_name.as_str(), "..", "a%2Fb"] {
        let (status, body) = post_json(
            &client,
            &format!("{base}/v1/leases/{name}/acquire"),
            json!({ "holder": "h", "ttl_ms": 1000 }),
        )
        .await;
        assert!(status == 400 || status == 404, "{name}: {status} {body}");
        assert!(body["error"].is_string(), "{name}: {body}");
    }
    let acquire_url = format!("{base}/v1/leases/good/acquire");
    for body in [
        json!({ "holder": "", "ttl_ms": 1000 }),
        json!({ "holder": "h".repeat(257), "ttl_ms": 1000 }),
        json!({ "holder": "h", "ttl_ms": 499 }),
        json!({ "holder": "h", "ttl_ms": 3_600_001 }),
        json!({ "holder": "h", "ttl_ms": 1000, "wait_ms": 600_000 }),
        json!({ "holder": "h", "ttl_ms": 1000, "extra": 1 }),
        json!({ "holder": 5, "ttl_ms": 1000 }),
    ] {
        let (status, answer) = post_json(&client, &acquire_url, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"], "bad_request");
    }
    for (content_type, body) in [
        ("text/plain", r#"{"holder":"h","ttl_ms":1000}"#.to_owned()),
        ("application/json", "{".to_owned()),
        (
            "application/json",
            format!(r#"{{"holder":"{}","ttl_ms":1000}}"#, "h".repeat(70_000)),
        ),
    ] {
        let response = send_retrying(|| {
            client
                .post(&acquire_url)
                .header("content-type", content_type)
                .body(body.clone())
        })
        .await;
        assert_eq!(response.status(), 400, "{content_type}");
        let answer: Value = response.json().await.expect("json error");
        assert_eq!(answer["error"], "bad_request");
    }
    let (status, body) = renew(&client, &base, "good", "h", token + 1).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("lost")));
    let (status, body) = renew(&client, &base, "good", "intruder", token).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("lost")));
    let (status, body) = post_json(
        &client,
        &format!("{base}/v1/leases/good/release"),
        json!({ "holder": "intruder", "token": token }),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (409, Some("lost")));

    let (_, after) = lease(&client, &base, "good").await;
    for field in ["holder", "token", "transitions", "modify_index"] {
        assert_eq!(after[field], before[field], "{field} changed");
    }
    let (status, body) = lease(&client, &base, "never").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
}

/// `--never-lead` (ICE's out-of-service member): node 3 votes, so the
/// cluster elects with one of the two others down, but across 20 forced
/// elections (the leader SIGKILLed each time, then restarted) node 3 never
/// leads.
#[tokio::test]
async fn a_never_lead_node_votes_but_never_leads() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setups: Vec<_> = (1..=3)
        .map(|id| support::node_setup(dir.path(), id, "127.0.0.1"))
        .collect();
    setups[2].args.push("--never-lead".into());
    let mut cluster = Cluster::start_with(dir.path(), setups);
    let client = http_client();
    let mut leader = cluster.leader(&client).await;
    for round in 0..20 {
        assert_ne!(leader, 3, "round {round}: the --never-lead node leads");
        cluster.kill(leader);
        let next = cluster
            .leader_among(&client, &[1, 2, 3], 200)
            .await
            .unwrap_or_else(|| panic!("round {round}: no leader with node 3's vote"));
        assert_ne!(next, 3, "round {round}: the --never-lead node took over");
        cluster.start_node(leader).expect("restart");
        // The restarted node must hold the whole log before the next round
        // kills the leader: node 3 votes only for a candidate as up to date
        // as itself, and it never campaigns (README: the limit of
        // --never-lead).
        let caught_up = Instant::now();
        loop {
            let mine: Value = get_json(
                &client,
                &format!("{}/v1/cluster", cluster.url(leader)),
                "cluster",
            )
            .await;
            let theirs: Value = get_json(
                &client,
                &format!("{}/v1/cluster", cluster.url(next)),
                "cluster",
            )
            .await;
            if mine["leader"] == next && mine["last_log_index"] == theirs["last_log_index"] {
                break;
            }
            assert!(
                caught_up.elapsed() < Duration::from_secs(10),
                "{mine} / {theirs}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        leader = next;
    }
}

/// The leader this poll sees, if any (one pass over the running nodes).
async fn leader_now(client: &reqwest::Client, cluster: &Cluster) -> Option<u64> {
    cluster.leader_among(client, &[1, 2, 3], 1).await
}

/// Polls until node `want` leads (at most `within`), then watches for
/// `stable`: it must lead at every poll (no flapping).
async fn placed_on(
    client: &reqwest::Client,
    cluster: &Cluster,
    want: u64,
    within: Duration,
    stable: Duration,
) {
    let started = Instant::now();
    let mut last = None;
    while last != Some(want) {
        assert!(
            started.elapsed() < within,
            "node {want} did not get leadership within {within:?} (last seen: {last:?})"
        );
        last = leader_now(client, cluster).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let watching = Instant::now();
    let mut seen_leading = 0;
    while watching.elapsed() < stable {
        // Flapping is another node leading. A poll that finds no node
        // acting as leader is not a move: on a loaded machine a probe can
        // outlast its bound, or the leader's lease lapse for a heartbeat
        // (it then says `"leading":false` until the next acknowledgement).
        // A run of a helper's builds beside the suite failed here on such a
        // poll, leadership never having moved.
        if let Some(now) = leader_now(client, cluster).await {
            assert_eq!(now, want, "leadership left node {want} (flapping)");
            seen_leading += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen_leading > 0,
        "node {want} was never seen leading while watched"
    );
}

/// `palisade_election_leader_transfers` of node `id`.
async fn transfers(client: &reqwest::Client, cluster: &Cluster, id: u64) -> u64 {
    let text = send_retrying(|| client.get(format!("{}/metrics", cluster.url(id))))
        .await
        .text()
        .await
        .expect("metrics");
    text.lines()
        .find_map(|line| line.strip_prefix("palisade_election_leader_transfers_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node {id} has no transfer counter:\n{text}"))
}

/// `--priority` (ICE's server priority with consecutive wins): nodes of
/// priority 1, 5 and 10. Leadership settles on node 3 and stays there; with
/// node 3 SIGKILLed it settles on node 2 (whoever wins the election); once
/// node 3 is back and caught up, node 2 hands it back by a transfer. Every
/// placement is held for 2 s of polls (20 checks): no flapping; and every
/// transfer is accounted for (at most one per settling).
#[tokio::test]
async fn leadership_settles_on_the_highest_priority_and_stays() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let setups: Vec<_> = [(1, "1"), (2, "5"), (3, "10")]
        .into_iter()
        .map(|(id, priority)| {
            let mut setup = support::node_setup(dir.path(), id, "127.0.0.1");
            setup.args.extend(
                [
                    "--priority",
                    priority,
                    "--priority-checks",
                    "3",
                    "--priority-check-ms",
                    "100",
                ]
                .map(String::from),
            );
            setup
        })
        .collect();
    let mut cluster = Cluster::start_with(dir.path(), setups);
    let client = http_client();
    cluster.leader(&client).await;
    let view: Value = get_json(
        &client,
        &format!("{}/v1/cluster", cluster.url(3)),
        "cluster",
    )
    .await;
    assert_eq!(view["priority"], 10, "{view}");
    placed_on(
        &client,
        &cluster,
        3,
        Duration::from_secs(10),
        Duration::from_secs(2),
    )
    .await;
    let first = transfers(&client, &cluster, 1).await + transfers(&client, &cluster, 2).await;
    assert!(first <= 1, "{first} transfers to settle a fresh cluster");

    cluster.kill(3);
    placed_on(
        &client,
        &cluster,
        2,
        Duration::from_secs(10),
        Duration::from_secs(2),
    )
    .await;
    let second = transfers(&client, &cluster, 1).await;
    assert!(
        second <= first + 1,
        "node 1 transferred {second} times in all"
    );

    let before = transfers(&client, &cluster, 2).await;
    cluster.start_node(3).expect("restart");
    placed_on(
        &client,
        &cluster,
        3,
        Duration::from_secs(15),
        Duration::from_secs(2),
    )
    .await;
    // Node 3 came back as a follower of node 2 (a restarted node's
    // pre-vote loses to a live leader): only a transfer by node 2 puts it
    // back in charge, and exactly one.
    assert_eq!(transfers(&client, &cluster, 2).await, before + 1);
    assert_eq!(transfers(&client, &cluster, 3).await, 0);
}

/// One node killed for 20 s: the survivors' logs grow by at most 100
/// lines (at `info`, the default). Before, openraft warned once per
/// heartbeat to the dead node: 1 829 lines in 20 s, each a long line.
#[tokio::test]
async fn a_dead_peer_costs_the_survivors_a_few_log_lines() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = |id: u64| dir.path().join(format!("node{id}.log"));
    let setups = (1..=3)
        .map(|id| {
            let mut setup = support::node_setup(dir.path(), id, "127.0.0.1");
            setup.logs = palisade_local_cluster::Logs::File(log(id));
            setup.env = vec![("RUST_LOG".into(), "info".into())];
            setup
        })
        .collect();
    let mut cluster = Cluster::start_with(dir.path(), setups);
    let client = http_client();
    let leader = cluster.settled_leader(&client).await;
    let victim = (1..=3).find(|id| *id != leader).expect("a follower");
    let survivors: Vec<u64> = (1..=3).filter(|id| *id != victim).collect();
    let lines = |id: u64| {
        std::fs::read_to_string(log(id))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    };
    let before: Vec<usize> = survivors.iter().map(|id| lines(*id)).collect();
    cluster.kill(victim);
    tokio::time::sleep(Duration::from_secs(20)).await;
    for (id, before) in survivors.iter().zip(before) {
        let grew = lines(*id) - before;
        let text = std::fs::read_to_string(log(*id)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().skip(before).take(20).collect();
        assert!(
            grew <= 100,
            "node {id}'s log grew by {grew} lines in 20 s with node {victim} dead; the first: {tail:#?}"
        );
    }
    let leader_log = std::fs::read_to_string(log(leader)).unwrap_or_default();
    assert!(
        leader_log.contains("peer unreachable"),
        "the leader never said node {victim} is unreachable"
    );
}
