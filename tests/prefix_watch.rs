//! Issue 47's leases on real processes: a prefix watch (`GET /v1/watch`)
//! served by a follower replays the leases under its prefix, then streams
//! every change to one (and only those), resumes from an index, and sends
//! keep-alives; the history keeps `--history-len` transitions with RFC 3339
//! times; a held lease shows `acquire_time` and `renew_time` (the leader's);
//! `palisade lease watch --prefix` prints the changes and exits 0 when its
//! reader goes away.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_client::{ClientConfig, PrefixWatch, WatchEvent};
use serde_json::{json, Value};
use support::{acquire, http_client, node_setup, post_json, test_secret, Cluster};

/// Every wait of this file is bounded by this.
const PATIENCE: Duration = Duration::from_secs(20);

/// The next change of `watch` (keep-alives skipped), within [`PATIENCE`].
async fn next_change(watch: &mut PrefixWatch) -> WatchEvent {
    support::watch::next_change(watch, PATIENCE).await
}

/// `(lease, holder)` of a change event.
fn change(event: &WatchEvent) -> (String, Option<String>) {
    match event {
        WatchEvent::Changed { lease, .. } => (lease.lease.clone(), lease.holder.clone()),
        other => panic!("not a change: {other:?}"),
    }
}

/// GETs `url` until it answers something else than 503: the JSON body.
async fn get(client: &reqwest::Client, url: &str) -> Value {
    for _ in 0..100 {
        let answer = client.get(url).send().await.expect("GET");
        if answer.status() != 503 {
            assert_eq!(answer.status(), 200, "GET {url}");
            return answer.json().await.expect("JSON");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("GET {url} kept answering 503");
}

#[tokio::test]
async fn a_prefix_watch_replays_then_streams_its_prefix_and_resumes_from_an_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args.extend(["--history-len".into(), "3".into()]);
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let http = http_client();
    let leader = cluster.leader(&http).await;
    let base = cluster.url(leader);
    let (status, a) = acquire(&http, &base, "jobs.a", "w1", 60_000).await;
    assert_eq!(status, 200, "{a}");
    let (status, _) = acquire(&http, &base, "other.x", "w1", 60_000).await;
    assert_eq!(status, 200);
    // A follower serves it, from its applied state.
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let sdk = palisade_client::Client::new(ClientConfig::new([cluster.url(follower)]));
    let mut watch = sdk.watch_prefix("jobs.", 0).await.expect("a watch");
    let first = next_change(&mut watch).await;
    assert_eq!(change(&first), ("jobs.a".into(), Some("w1".into())));
    // A change outside the prefix, then one inside: only the second shows.
    let (status, _) = acquire(&http, &base, "other.y", "w1", 60_000).await;
    assert_eq!(status, 200);
    let (status, b) = acquire(&http, &base, "jobs.b", "w2", 60_000).await;
    assert_eq!(status, 200, "{b}");
    let second = next_change(&mut watch).await;
    assert_eq!(change(&second), ("jobs.b".into(), Some("w2".into())));
    assert!(second.index() > first.index());
    let release = json!({
        "holder": "w1", "token": a["token"], "secret": test_secret("w1"),
    });
    let (status, _) = post_json(&http, &format!("{base}/v1/leases/jobs.a/release"), release).await;
    assert_eq!(status, 200);
    let third = next_change(&mut watch).await;
    assert_eq!(
        change(&third),
        ("jobs.a".into(), None),
        "other.x never shows"
    );
    assert_eq!(watch.index(), third.index());

    // Resumed from the first event's index: only what changed after it.
    let mut resumed = sdk
        .watch_prefix("jobs.", first.index())
        .await
        .expect("a watch");
    let mut seen = vec![change(&next_change(&mut resumed).await)];
    seen.push(change(&next_change(&mut resumed).await));
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("jobs.a".into(), None),
            ("jobs.b".into(), Some("w2".into()))
        ]
    );

    keep_alives_name_the_applied_index(&http, &cluster.url(follower), third.index()).await;
    times_and_history(&http, &base).await;
    cli_prints_the_changes_and_exits_on_a_closed_stdout(&cluster.url(follower), &http, &base).await;
}

/// With nothing changing, a raw stream sends `{"index": N}` lines, N at
/// least the last change's index: where a client resumes from.
async fn keep_alives_name_the_applied_index(http: &reqwest::Client, base: &str, last: u64) {
    let url = format!("{base}/v1/watch?prefix=jobs.&index={last}&keepalive_ms=100");
    let mut response = http.get(&url).send().await.expect("GET /v1/watch");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/x-ndjson",
        "one JSON object per line"
    );
    let mut text = Vec::new();
    let started = Instant::now();
    while text.iter().filter(|b| **b == b'\n').count() < 2 {
        assert!(started.elapsed() < PATIENCE, "no keep-alive: {text:?}");
        let left = PATIENCE.saturating_sub(started.elapsed());
        let chunk = tokio::time::timeout(left, response.chunk()).await;
        text.extend_from_slice(&chunk.expect("in time").expect("read").expect("open"));
    }
    for line in String::from_utf8_lossy(&text).lines().take(2) {
        let line: Value = serde_json::from_str(line).expect("a JSON line");
        let object = line.as_object().expect("an object");
        assert_eq!(
            object.len(),
            1,
            "a keep-alive carries the index alone: {line}"
        );
        assert!(line["index"].as_u64().expect("index") >= last, "{line}");
    }
    // A prefix the query cannot parse is refused before any stream.
    let bad = http
        .get(format!("{base}/v1/watch?index=x"))
        .send()
        .await
        .expect("GET");
    assert_eq!(bad.status(), 400);
}

/// The lease at `url` once it shows a `renew_time`: the leader's lessor's,
/// absent for a moment after a leader change (bounded: 10 s).
async fn with_renew_time(http: &reqwest::Client, url: &str) -> Value {
    for _ in 0..100 {
        let lease = get(http, url).await;
        if lease.get("renew_time").is_some() {
            return lease;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never showed a renew_time");
}

/// `acquire_time`, `renew_time` and the history's `at`, and its bound.
async fn times_and_history(http: &reqwest::Client, base: &str) {
    let parse = |v: &Value| palisade_names::time::parse_rfc3339_ms(v.as_str().expect("a time"));
    let lease = with_renew_time(http, &format!("{base}/v1/leases/jobs.b")).await;
    let acquired = parse(&lease["acquire_time"]).expect("acquire_time in RFC 3339");
    let renewed = parse(&lease["renew_time"]).expect("renew_time in RFC 3339");
    assert!(renewed + 1_000 >= acquired, "{lease}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let renew = json!({ "holder": "w2", "token": lease["token"], "secret": test_secret("w2") });
    let (status, _) = post_json(http, &format!("{base}/v1/leases/jobs.b/renew"), renew).await;
    assert_eq!(status, 200);
    let after = with_renew_time(http, &format!("{base}/v1/leases/jobs.b")).await;
    assert_eq!(
        after["acquire_time"], lease["acquire_time"],
        "the same grant"
    );
    let renewed_again = parse(&after["renew_time"]).expect("renew_time");
    assert!(renewed_again >= renewed + 250, "{lease} then {after}");
    // jobs.a was acquired and released: free, no grant times.
    let free = get(http, &format!("{base}/v1/leases/jobs.a")).await;
    assert!(
        free.get("acquire_time").is_none() && free.get("renew_time").is_none(),
        "{free}"
    );
    // Five more transitions of jobs.a; --history-len 3 keeps the last 3.
    for round in 0..3 {
        let holder = format!("h{round}");
        let (status, grant) = acquire(http, base, "jobs.a", &holder, 60_000).await;
        assert_eq!(status, 200, "{grant}");
        if round < 2 {
            let release = json!({
                "holder": holder, "token": grant["token"], "secret": test_secret(&holder),
            });
            let url = format!("{base}/v1/leases/jobs.a/release");
            assert_eq!(post_json(http, &url, release).await.0, 200);
        }
    }
    let history = get(http, &format!("{base}/v1/leases/jobs.a/history")).await;
    assert_eq!(history["kept"], 3, "{history}");
    let entries = history["history"].as_array().expect("entries");
    assert_eq!(entries.len(), 3, "{history}");
    for entry in entries {
        let at = parse(&entry["at"]).expect("at in RFC 3339");
        assert_eq!(
            Some(at),
            entry["at_ms"].as_u64(),
            "the same instant: {entry}"
        );
    }
}

/// What `palisade args` prints on stdout (it must succeed).
fn palisade_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .env_remove("PALISADE_ELECTION")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run palisade");
    assert!(out.status.success(), "palisade {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `lease get` and `lease history` show absolute times beside relative
/// ones; `palisade lease watch --prefix` prints one line per change, then
/// exits 0 once its reader is gone and it writes again.
async fn cli_prints_the_changes_and_exits_on_a_closed_stdout(
    follower: &str,
    http: &reqwest::Client,
    base: &str,
) {
    // `renew_time` is the leader's lessor's: right after a leader change,
    // before the new leader tracks the grant, it is absent (documented).
    let mut get = String::new();
    for _ in 0..100 {
        get = palisade_stdout(&["lease", "get", "jobs.b", "--election", base]);
        if get.contains("; renewed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        get.contains("; acquired 20") && get.contains("Z ("),
        "{get}"
    );
    assert!(
        get.contains("; renewed 20") && get.contains("s ago)"),
        "{get}"
    );
    let history = palisade_stdout(&["lease", "history", "jobs.a", "--election", base]);
    let lines: Vec<&str> = history.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{history}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("Z (") && l.ends_with("s ago)")),
        "{history}"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "lease",
            "watch",
            "--prefix",
            "jobs.",
            "--election",
            follower,
        ])
        .env_remove("PALISADE_ELECTION")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("palisade lease watch --prefix");
    let stdout = child.stdout.take().expect("stdout");
    let first = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().expect("a line").expect("readable");
        drop(lines); // the reader goes away, as `| head -1` does
        line
    });
    let first = tokio::time::timeout(PATIENCE, first)
        .await
        .expect("a first line in time")
        .expect("the reader");
    assert!(first.starts_with("jobs."), "{first}");
    assert!(
        first.contains("acquired 20") || first.contains("free"),
        "{first}"
    );
    // Changes make it write to the closed pipe: it stops, exit 0.
    let started = Instant::now();
    let mut round = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(started.elapsed() < PATIENCE, "watch did not exit");
        round += 1;
        let (status, _) = acquire(http, base, &format!("jobs.cli{round}"), "c", 60_000).await;
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status.code(), Some(0));
}

/// The next line of a raw watch answer that `wanted` accepts (earlier lines
/// skipped), within [`PATIENCE`]; `None` if the answer ends first.
async fn line_where(
    response: &mut reqwest::Response,
    buffer: &mut Vec<u8>,
    wanted: impl Fn(&Value) -> bool,
) -> Option<Value> {
    let started = Instant::now();
    loop {
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            let line: Value = serde_json::from_slice(&line).expect("a JSON line");
            if wanted(&line) {
                return Some(line);
            }
        }
        let left = PATIENCE.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, response.chunk()).await {
            Ok(Ok(Some(chunk))) => buffer.extend_from_slice(&chunk),
            Ok(_) => return None,
            Err(_) => panic!(
                "no wanted line in time: {:?}",
                String::from_utf8_lossy(buffer)
            ),
        }
    }
}

/// Under a policy: a prefix watch needs `read` on the whole prefix; one
/// principal's open watches are bounded by its share of the node's `long`
/// seats (as single watches are), and another principal still gets one; a
/// policy reload that takes the right away ends the stream with a last
/// `forbidden` line.
#[tokio::test]
async fn under_a_policy_a_prefix_watch_needs_read_is_bounded_per_principal_and_revocable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            // 8 `long` seats: one principal may take 6 of them.
            setup.args.extend(["--max-requests".into(), "64".into()]);
            setup
        })
        .collect();
    let (cluster, access) = Cluster::start_secure(dir.path(), setups);
    let admin = access.http("admin");
    let base = cluster.url(cluster.leader(&admin).await);
    let orders = access.http_with_timeout("orders", PATIENCE * 3);
    let (status, grant) = acquire(&orders, &base, "orders.a", "o1", 60_000).await;
    assert_eq!(status, 200, "{grant}");
    let everything = orders
        .get(format!("{base}/v1/watch"))
        .send()
        .await
        .expect("GET");
    assert_eq!(everything.status(), 403, "orders may read orders.* only");

    let url = format!("{base}/v1/watch?prefix=orders.");
    let mut open = Vec::new();
    let refused = loop {
        let response = orders.get(&url).send().await.expect("GET /v1/watch");
        if response.status() != 200 {
            break response;
        }
        open.push(response);
        assert!(
            open.len() < 32,
            "one principal opened 32 watches on one node"
        );
    };
    assert_eq!(refused.status(), 429, "over its share");
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"], "over_share", "{body}");
    assert!(
        open.len() >= 2,
        "a principal gets more than one: {}",
        open.len()
    );
    let theirs = admin
        .get(format!("{base}/v1/watch"))
        .send()
        .await
        .expect("GET");
    assert_eq!(theirs.status(), 200, "another principal still finds a seat");

    let mut watch = open.pop().expect("an open watch");
    let mut buffer = Vec::new();
    let first = line_where(&mut watch, &mut buffer, |l| l.get("lease").is_some()).await;
    assert_eq!(first.expect("the catch-up")["lease"]["lease"], "orders.a");
    let mut policy: Value =
        serde_json::from_slice(&std::fs::read(&access.policy).expect("policy")).expect("JSON");
    policy["principals"]["orders"]["read"] = json!(["orders.other."]);
    std::fs::write(
        &access.policy,
        serde_json::to_vec_pretty(&policy).expect("JSON"),
    )
    .expect("write the policy");
    for id in 1..=3 {
        let pid = cluster.node(id).map(|n| n.pid()).expect("a node");
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success());
    }
    let last = line_where(&mut watch, &mut buffer, |l| l.get("error").is_some()).await;
    let last = last.expect("a last line naming why");
    assert_eq!(last["error"], "forbidden", "{last}");
    assert!(last["index"].as_u64().is_some(), "where to resume: {last}");
    assert!(
        line_where(&mut watch, &mut buffer, |_| true)
            .await
            .is_none(),
        "the stream ends after its last line"
    );
}
