//! The key-rotation fault: node 1 — the first endpoint in the gateway's
//! `--election` list — is cut from its peers (it still answers clients,
//! with a JWKS that stops moving), the majority's leader rotates the
//! signing key, and a grant signed by the new key is written through the
//! gateway at once. The gateway must accept it (it asks every endpoint
//! before it answers 401 for an unknown key); a 401 is a violation.

use std::time::{Duration, Instant};

use serde_json::json;

use super::netns;
use super::support::{self, Cluster};

/// How long node 1 may take to apply the majority's entries once healed.
const REJOIN: Duration = Duration::from_secs(10);

/// Cuts node 1 from nodes 2 and 3, rotates the key through their leader,
/// writes a fresh grant's token through `gateway`, and keeps the cut
/// `hold` longer before healing it. Returns the new key id.
///
/// # Panics
/// If the majority elects no leader, the rotation fails, or the gateway
/// refuses the new grant's token (the violation this fault looks for).
pub async fn rotate_while_first_endpoint_lags(
    http: &reqwest::Client,
    cluster: &Cluster,
    gateway: &str,
    hold: Duration,
) -> String {
    netns::cut(1, 2);
    netns::cut(1, 3);
    let leader = cluster
        .leader_among(http, &[2, 3], 100)
        .await
        .expect("nodes 2 and 3 elected no leader while node 1 was cut off");
    let base = cluster.url(leader);
    let rotated =
        support::send_retrying(|| http.post(format!("{base}/v1/cluster/rotate-key"))).await;
    let status = rotated.status();
    let rotated: serde_json::Value = rotated.json().await.unwrap_or_default();
    assert_eq!(status, 200, "rotate-key: {rotated}");
    let kid = rotated["kid"].as_str().unwrap_or_default().to_owned();

    let lease = format!("keys.{}", super::monotonic_ns());
    let (status, grant) = support::acquire(http, &base, &lease, "rotator", 5_000).await;
    assert_eq!(status, 200, "acquire after the rotation: {grant}");
    let jwt = grant["jwt"].as_str().expect("jwt").to_owned();
    let signed_by = jsonwebtoken::decode_header(&jwt).expect("header").kid;
    assert_eq!(
        signed_by.as_deref(),
        Some(kid.as_str()),
        "not signed by the new key"
    );
    // Written the moment the grant answers; 503 (the gateway still
    // fetching) is retried for a bounded time, a 401 fails the run.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = http
            .put(format!("{gateway}/v1/objects/{lease}/probe"))
            .bearer_auth(&jwt)
            .body("new key")
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status() == 200 => break,
            Ok(answer) if answer.status() == 401 || answer.status() == 403 => panic!(
                "the gateway refused a token of the rotated key {kid} while its first \
                 endpoint lagged: {} {:?}",
                answer.status(),
                answer.text().await
            ),
            other => assert!(
                Instant::now() < deadline,
                "the gateway did not take the new grant's write: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(hold).await;
    netns::heal();
    // Node 1 rejoins: it applies what the majority committed while it was
    // cut off, which it can only do once it follows their term (a node 1
    // that led when it was cut off says it leads until then). The next
    // fault starts from the whole cluster.
    let view: serde_json::Value =
        support::get_json(http, &format!("{base}/v1/cluster"), "cluster").await;
    let committed = view["commit_index"].as_u64().unwrap_or(0);
    let rejoined = support::caught_up(http, &cluster.url(1), committed, REJOIN).await;
    eprintln!("fault suite: node 1 rejoined {rejoined:?} after the heal");
    // Released so the table does not keep it for a ttl (bounded; a lost
    // release only leaves the lease to expire).
    let _ = support::post_json(
        http,
        &format!("{base}/v1/leases/{lease}/release"),
        json!({"holder": "rotator", "token": grant["token"], "secret": support::test_secret("rotator")}),
    )
    .await;
    kid
}
