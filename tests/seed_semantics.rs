//! Leadership semantics from the seed systems, on real processes (three
//! election nodes and a gateway): a directed handover and preemption by
//! priority, each while the old holder keeps writing; the fence refuses the
//! old holder from the moment the new one holds.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_client::{AcquireOptions, Client, Error, Lease};
use support::{http_client, sdk, spawn_gateway_for, Cluster, Process};
use tokio::time::Instant;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Acquires once the gateway has the cluster's keys (it fetches the JWKS
/// after it starts; until then the SDK's fence-on-acquire gets a 401).
async fn acquire_when_ready(
    client: &Client,
    lease: &str,
    holder: &str,
    ttl: Duration,
    options: AcquireOptions,
) -> Lease {
    for _ in 0..200 {
        match client
            .acquire_with(lease, holder, ttl, Some(Duration::from_secs(5)), options)
            .await
        {
            Ok(lease) => return lease,
            Err(Error::Protocol { status: 401, .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("{holder} acquires {lease}: {err}"),
        }
    }
    panic!("{holder} never acquired {lease}");
}

/// A three-node cluster with a leader, a gateway, and an SDK client of both.
async fn cluster_with_gateway(dir: &std::path::Path) -> (Cluster, Process, Client) {
    let cluster = Cluster::start(dir);
    let gateway = spawn_gateway_for(&cluster, &dir.join("gateway"));
    let client = sdk(&cluster, Some(&gateway));
    cluster.leader(&http_client()).await;
    (cluster, gateway, client)
}

/// A raw write to `key` with `jwt`, outside any SDK check: the gateway's
/// status.
async fn raw_put(gateway: &Process, jwt: &str, key: &str) -> u16 {
    http_client()
        .put(format!("{}/v1/objects/{key}", gateway.url))
        .bearer_auth(jwt)
        .body("raw")
        .send()
        .await
        .expect("gateway answers")
        .status()
        .as_u16()
}

/// Writes through `lease` every 20 ms until a write is refused; the
/// outcomes in order.
fn keep_writing(
    lease: Arc<Lease>,
    key: &'static str,
) -> tokio::task::JoinHandle<Vec<Result<(), Error>>> {
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for i in 0..1000 {
            let written = lease.put(key, format!("write {i}")).await.map(|_| ());
            let refused = written.is_err();
            outcomes.push(written);
            if refused {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        outcomes
    })
}

#[tokio::test]
async fn a_handover_moves_the_lease_to_the_successor_and_fences_the_old_holder() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_cluster, gateway, client) = cluster_with_gateway(dir.path()).await;
    let ttl = Duration::from_secs(3);
    let a = Arc::new(
        acquire_when_ready(&client, "handover", "A", ttl, AcquireOptions::default()).await,
    );
    let a_jwt = a.jwt().expect("A holds");
    let writes = keep_writing(a.clone(), "handover/state");
    // B waits for the lease (as a standby would).
    let b_client = client.clone();
    let b = tokio::spawn(async move {
        b_client
            .acquire("handover", "B", ttl, Some(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Bad input first: to oneself is refused and A still holds.
    let refused = a.handover_to("A").await;
    assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
    assert!(a.is_held());

    let handed_at = Instant::now();
    let token = a.handover_to("B").await.expect("handover");
    assert!(token > a.token(), "the successor's token is higher");
    assert!(!a.is_held(), "A let go the moment it handed over");
    let b = b.await.expect("B's task").expect("B acquires");
    assert_eq!(b.token(), token, "B holds with the handover's token");
    assert!(
        handed_at.elapsed() < Duration::from_secs(2),
        "B got it at once, not at an expiry: {:?}",
        handed_at.elapsed()
    );
    b.put("handover/state", "from B")
        .await
        .expect("B's first write succeeds");
    // A's writer stopped at its first refusal, which was local.
    let outcomes = writes.await.expect("writer");
    assert!(outcomes.len() > 5, "A wrote while it held: {outcomes:?}");
    assert!(
        matches!(outcomes.last(), Some(Err(Error::LeaseLost(_)))),
        "{:?}",
        outcomes.last()
    );
    // Outside the SDK, A's JWT is refused by the fence B raised.
    assert_eq!(raw_put(&gateway, &a_jwt, "handover/state").await, 409);
    let stored = b.get("handover/state").await.expect("get").expect("object");
    assert_eq!(stored.value, "from B");
}

#[tokio::test]
async fn a_higher_priority_preempts_a_writing_holder_without_overlap() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_cluster, gateway, client) = cluster_with_gateway(dir.path()).await;
    let ttl = Duration::from_secs(3);
    let low_terms = AcquireOptions {
        priority: 1,
        preemptible: true,
        ..AcquireOptions::default()
    };
    let low = Arc::new(acquire_when_ready(&client, "preempt", "low", ttl, low_terms).await);
    let low_jwt = low.jwt().expect("low holds");
    // When low's SDK stopped believing it holds; then, like a worker, low
    // campaigns again at once: it must not slip in ahead of high.
    let lost_at = Arc::new(Mutex::new(None));
    let watcher = {
        let (low, lost_at, client) = (low.clone(), lost_at.clone(), client.clone());
        tokio::spawn(async move {
            low.lost().await;
            *lost_at.lock().expect("lock") = Some(Instant::now());
            client
                .acquire_with(
                    "preempt",
                    "low",
                    ttl,
                    Some(Duration::from_secs(4)),
                    low_terms,
                )
                .await
                .map(|lease| lease.token())
        })
    };
    let writes = keep_writing(low.clone(), "preempt/state");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Equal priority, waiting, preempts nothing (stickiness).
    let same = AcquireOptions {
        priority: 1,
        ..AcquireOptions::default()
    };
    let refused = client
        .acquire_with(
            "preempt",
            "same",
            ttl,
            Some(Duration::from_millis(800)),
            same,
        )
        .await;
    assert!(matches!(refused, Err(Error::Held { .. })), "{refused:?}");
    assert!(low.is_held());

    let high_terms = AcquireOptions {
        priority: 5,
        ..AcquireOptions::default()
    };
    let asked = Instant::now();
    let high = client
        .acquire_with(
            "preempt",
            "high",
            ttl,
            Some(Duration::from_secs(10)),
            high_terms,
        )
        .await
        .expect("high acquires");
    let granted_at = Instant::now();
    assert!(high.token() > low.token());
    let lost_at = lost_at.lock().expect("lock").expect("low lost the lease");
    // S3: low stopped believing before high was granted.
    assert!(
        lost_at <= granted_at,
        "overlap: low lost {:?} after high's grant",
        lost_at - granted_at
    );
    // The gap: low learns at its next renewal (ttl/3) and releases; high is
    // granted on that release, well before low's grant would have expired.
    assert!(
        granted_at - asked < Duration::from_secs(2),
        "high waited {:?}",
        granted_at - asked
    );
    // From low letting go to high's grant: the release's commit and the
    // grant's, not low's deadline.
    assert!(
        granted_at - lost_at < Duration::from_millis(500),
        "high was granted {:?} after low let go",
        granted_at - lost_at
    );
    // Low's new campaign waited behind high (who renews) and gave up.
    let again = watcher.await.expect("watcher");
    assert!(matches!(again, Err(Error::Held { .. })), "{again:?}");
    let outcomes = writes.await.expect("writer");
    let last = outcomes.last().expect("low wrote");
    assert!(matches!(last, Err(Error::Preempted(_))), "{last:?}");
    assert!(last.as_ref().expect_err("refused").is_lease_lost());
    // S1: low's JWT is refused by the fence high raised.
    assert_eq!(raw_put(&gateway, &low_jwt, "preempt/state").await, 409);
    high.put("preempt/state", "from high")
        .await
        .expect("high writes");
}

/// The fencing sidecar inside `palisade run`: the child gets
/// `PALISADE_PROXY`, writes through it succeed for ten ttls (the JWT it
/// stamps is renewed underneath), and once the grant is revoked the
/// sidecar refuses within about one renew interval.
#[tokio::test]
async fn a_child_writes_through_the_sidecar_while_the_lease_is_held() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    cluster.leader(&http).await;
    let gateway = spawn_gateway_for(&cluster, &dir.path().join("gw"));
    let url_file = dir.path().join("proxy.url");
    let bin = env!("CARGO_BIN_EXE_palisade");
    let script = format!(
        "echo \"$PALISADE_PROXY\" > {}; exec sleep 60",
        url_file.display()
    );
    let ttl_ms = 600u64;
    // The gateway may still be fetching the JWKS: `run` retries nothing,
    // so wait until a raw fence read answers.
    for _ in 0..100 {
        let ready = http
            .get(format!("{}/readyz", gateway.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut run = std::process::Command::new(bin)
        .args([
            "run",
            "--lease",
            "sidecar",
            "--holder",
            "runner",
            "--ttl-ms",
            &ttl_ms.to_string(),
            "--election",
            &cluster.urls().join(","),
            "--gateway",
            &gateway.url,
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("palisade run");
    let mut proxy = String::new();
    for _ in 0..200 {
        proxy = std::fs::read_to_string(&url_file)
            .unwrap_or_default()
            .trim()
            .to_owned();
        if !proxy.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        proxy.starts_with("http://127.0.0.1:"),
        "PALISADE_PROXY: {proxy:?}"
    );
    let put = |key: &str, value: String| {
        http.put(format!("{proxy}/v1/objects/{key}"))
            .body(value)
            .send()
    };
    // Ten ttls of writes, every 100 ms: every one succeeds.
    let started = Instant::now();
    let mut writes = 0;
    while started.elapsed() < Duration::from_millis(10 * ttl_ms) {
        let answer = put("sidecar/state", format!("w{writes}"))
            .await
            .expect("proxy answers");
        assert_eq!(
            answer.status().as_u16(),
            200,
            "write {writes}: {:?}",
            answer.text().await
        );
        writes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Outside the lease, and reads, through the same endpoint.
    let outside = put("other/state", "x".into()).await.expect("proxy answers");
    assert_eq!(outside.status().as_u16(), 403);
    let read: serde_json::Value = http
        .get(format!("{proxy}/v1/objects/sidecar/state"))
        .send()
        .await
        .expect("read")
        .json()
        .await
        .expect("json");
    assert_eq!(read["value"], format!("w{}", writes - 1));

    // Take the lease away: revoke its grant (renewals are refused).
    let lease: serde_json::Value = http
        .get(format!("{}/v1/leases/sidecar", cluster.urls()[0]))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let revoked = http
        .post(format!("{}/v1/leases/sidecar/revoke", cluster.urls()[0]))
        .json(&serde_json::json!({ "token": lease["token"] }))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    let revoked_at = Instant::now();
    let refused_after = loop {
        match put("sidecar/state", "late".into()).await {
            Ok(answer) if answer.status().is_success() => {}
            Ok(answer) => {
                assert_eq!(answer.status().as_u16(), 409, "refused as lost");
                break revoked_at.elapsed();
            }
            // The sidecar stopped with the child: refused too.
            Err(_) => break revoked_at.elapsed(),
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(5),
            "never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // One renew interval is ttl/3 (200 ms); allow for a loaded machine.
    assert!(
        refused_after < Duration::from_millis(ttl_ms / 3 + 600),
        "refused {refused_after:?} after the revoke"
    );
    let status = run.wait().expect("palisade run exits");
    assert_eq!(status.code(), Some(3), "lost: the child was stopped");
}

/// The attack the preemption reservation closes, over raw HTTP: the
/// preempted holder sends its release and, at the same moment, a fresh
/// acquire (another secret, waiting), hoping its acquire is proposed while
/// the lease still looks held and applies just after the release freed it
/// — ahead of the preemptor queued in the leader's memory. The lease must
/// go to the preemptor, every time.
#[tokio::test]
async fn a_preempted_holder_cannot_slip_in_ahead_of_its_preemptor() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    let base = cluster.url(cluster.leader(&http).await);
    for round in 0..5 {
        let lease = format!("barge-{round}");
        let url = |call: &str| format!("{base}/v1/leases/{lease}/{call}");
        let (status, low) = support::post_json(
            &http,
            &url("acquire"),
            serde_json::json!({"holder": "low", "ttl_ms": 10_000, "preemptible": true,
                               "secret": support::test_secret("low")}),
        )
        .await;
        assert_eq!(status, 200, "{low}");
        let high = tokio::spawn({
            let (http, url) = (http.clone(), url("acquire"));
            async move {
                // With a secret, so a retry after a 503 (a leader election
                // on a loaded machine) is the same acquire.
                support::post_json(
                    &http,
                    &url,
                    serde_json::json!({"holder": "high", "ttl_ms": 10_000, "priority": 10,
                                       "wait_ms": 3_000, "secret": support::test_secret("high")}),
                )
                .await
            }
        });
        // The holder learns of the preemption on a renewal (once the
        // waiting acquire's preemption is applied: bounded, a loaded
        // machine can take a while).
        let grant = serde_json::json!({"holder": "low", "token": low["token"],
                                       "secret": support::test_secret("low")});
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (status, renewed) =
                support::post_json_once(&http, &url("renew"), grant.clone()).await;
            if (status, renewed["error"].as_str()) == (409, Some("preempted")) {
                break;
            }
            // 503: a leader election, which a loaded machine can cause.
            assert!(
                (status == 200 || status == 503) && tokio::time::Instant::now() < deadline,
                "round {round}: never told it was preempted: {status} {renewed}"
            );
        }
        let mut release = grant;
        release["grant_index"] = low["grant_index"].clone();
        let barge = serde_json::json!({"holder": "low", "ttl_ms": 10_000, "wait_ms": 2_000,
                                       "secret": support::test_secret("low-again")});
        let (release_url, acquire_url) = (url("release"), url("acquire"));
        let (released, barged) = tokio::join!(
            support::post_json(&http, &release_url, release),
            support::post_json(&http, &acquire_url, barge),
        );
        assert_eq!(released.0, 200, "{}", released.1);
        let (status, granted) = high.await.expect("high");
        assert_eq!(
            status, 200,
            "round {round}: high was not granted: {granted}"
        );
        assert_eq!(
            (barged.0, barged.1["error"].as_str()),
            (409, Some("held")),
            "round {round}: the preempted holder slipped in: {}",
            barged.1
        );
    }
}
