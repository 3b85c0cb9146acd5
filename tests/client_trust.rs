//! Client trust on real processes: a 3-node cluster serving clients over
//! TLS with a policy, and a gateway over TLS with the same policy.
//!
//! - a principal limited to `orders.*` cannot acquire, read or write
//!   anything else, not even with a JWT it got legitimately;
//! - a third party with every right and everything `GET` shows (holder,
//!   token, grant index) cannot renew, release, re-acquire or shorten
//!   another's grant;
//! - without a key (or with an unknown one) nothing is served; plaintext to
//!   a TLS port is not served either.

use crate::support;

use std::time::Duration;

use palisade_client::Error;
use serde_json::{json, Value};
use support::{node_setup, spawn_node, Cluster};

fn setups(dir: &std::path::Path) -> Vec<palisade_local_cluster::NodeSetup> {
    (1..=3).map(|id| node_setup(dir, id, "127.0.0.1")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_stays_inside_its_prefixes_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, access) = Cluster::start_secure(dir.path(), setups(dir.path()));
    let admin = access.http("admin");
    cluster.leader(&admin).await;
    let gateway = spawn_node(access.gateway_for(&cluster, &dir.path().join("gateway")));
    assert!(gateway.url.starts_with("https://"), "{}", gateway.url);
    let orders = access.sdk(&cluster, Some(&gateway), "orders");

    // Inside its rights: acquire (fence-on-acquire included), write, read.
    let lease = orders
        .acquire("orders.eu", "o1", Duration::from_secs(10), None)
        .await
        .expect("orders may acquire orders.eu");
    lease.put("orders.eu/state", "v1").await.expect("write");
    let object = lease.get("orders.eu/state").await.expect("read");
    assert_eq!(object.expect("present").value.as_ref(), b"v1");

    // Outside: 403, typed by the SDK; nothing granted.
    let refused = orders
        .acquire("payments", "o1", Duration::from_secs(10), None)
        .await
        .expect_err("payments is outside orders.*");
    assert!(matches!(refused, Error::Forbidden(_)), "{refused:?}");
    let refused = orders.get_object("payments/state").await.expect_err("read");
    assert!(matches!(refused, Error::Forbidden(_)), "{refused:?}");
    let (status, _) = get(&admin, &format!("{}/v1/leases/payments", cluster.url(1))).await;
    assert_eq!(status, 404, "payments was never granted");

    // Its legitimate JWT for orders.eu cannot write under payments: the
    // policy refuses (403) before the lease claim would.
    let orders_http = access.http("orders");
    let jwt = lease.jwt().expect("held");
    for (client, who) in [(&orders_http, "orders"), (&admin, "admin")] {
        let answer = orders_http_put(client, &gateway.url, "payments/state", &jwt).await;
        assert_eq!(answer.0, 403, "{who}: {}", answer.1);
        assert_eq!(answer.1["error"], "forbidden", "{who}");
    }
    // A JWT for payments minted by nobody cannot exist; the admin, who may
    // acquire payments, gets one and still cannot write with orders' key.
    let admin_sdk = access.sdk(&cluster, Some(&gateway), "admin");
    let payments = admin_sdk
        .acquire("payments", "a1", Duration::from_secs(10), None)
        .await
        .expect("admin may acquire payments");
    let answer = orders_http_put(
        &orders_http,
        &gateway.url,
        "payments/state",
        &payments.jwt().expect("held"),
    )
    .await;
    assert_eq!(answer.0, 403, "{}", answer.1);
    let object = admin_sdk.get_object("payments/state").await.expect("read");
    assert!(object.is_none(), "no write under payments got through");

    // No key or an unknown key: 401 from both servers.
    let pem = std::fs::read(&access.ca).expect("ca");
    let anonymous = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    for url in [
        format!("{}/v1/leases/orders.eu", cluster.url(2)),
        format!("{}/v1/objects/orders.eu/state", gateway.url),
    ] {
        let (status, body) = get(&anonymous, &url).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("unauthorized")),
            "{url}"
        );
        let answer = anonymous
            .get(&url)
            .header("x-palisade-key", "pal_guess")
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), 401, "{url}");
    }
    // Plaintext to a TLS port gets no answer.
    let plain = cluster.url(1).replace("https://", "http://");
    let answer = support::http_client()
        .get(format!("{plain}/healthz"))
        .send()
        .await;
    assert!(answer.map_or(true, |r| !r.status().is_success()));
    lease.release().await.expect("release");
    payments.release().await.expect("release");
}

/// Every right (the admin principal) and every public value still cannot
/// touch another's grant: the grant's secret is the only way in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_with_everything_get_shows_cannot_use_a_grant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, access) = Cluster::start_secure(dir.path(), setups(dir.path()));
    let thief = access.http("admin");
    cluster.leader(&thief).await;
    let owner = access.sdk(&cluster, None, "orders");
    let lease = owner
        .acquire("orders.jobs", "A", Duration::from_secs(60), None)
        .await
        .expect("acquire");
    let base = cluster.url(3);
    let (status, public) = get(&thief, &format!("{base}/v1/leases/orders.jobs")).await;
    assert_eq!(status, 200, "{public}");
    assert!(
        public.get("secret").is_none(),
        "reads never show the secret"
    );
    let (holder, token) = (public["holder"].clone(), public["token"].clone());
    let forged = "x".repeat(43);
    for (call, body) in [
        ("renew", json!({"holder": holder, "token": token})),
        (
            "renew",
            json!({"holder": holder, "token": token, "secret": forged}),
        ),
        (
            "release",
            json!({"holder": holder, "token": token, "secret": forged, "grant_index": token}),
        ),
        ("acquire", json!({"holder": holder, "ttl_ms": 1000})),
        (
            "acquire",
            json!({"holder": holder, "ttl_ms": 1000, "secret": forged}),
        ),
    ] {
        let answer = thief
            .post(format!("{base}/v1/leases/orders.jobs/{call}"))
            .json(&body)
            .send()
            .await
            .expect("answer");
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        assert!(
            status == 409 || status == 400,
            "{call} with public data must be refused: {status} {body}"
        );
        assert!(
            body.get("secret").is_none() && body.get("jwt").is_none(),
            "{body}"
        );
    }
    // The 1 s acquire would have expired the grant by now had it shortened it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, after) = get(&thief, &format!("{base}/v1/leases/orders.jobs")).await;
    assert_eq!(
        (&after["holder"], &after["token"]),
        (&holder, &token),
        "{after}"
    );
    assert!(
        after["expires_in_ms"].as_u64().unwrap_or(0) > 50_000,
        "{after}"
    );
    assert!(lease.is_held(), "the owner still holds and renews");
    lease.release().await.expect("the owner's release works");
}

/// GET, retried for up to 5 s while the node answers 503 (a node that
/// has not yet heard of the new leader cannot forward).
async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    for _ in 0..100 {
        let answer = client.get(url).send().await.expect("answer");
        let status = answer.status().as_u16();
        if status != 503 {
            return (status, answer.json().await.unwrap_or(Value::Null));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url}: 503 for 5 s");
}

async fn orders_http_put(
    client: &reqwest::Client,
    gateway: &str,
    key: &str,
    jwt: &str,
) -> (u16, Value) {
    let answer = client
        .put(format!("{gateway}/v1/objects/{key}"))
        .bearer_auth(jwt)
        .body("stolen")
        .send()
        .await
        .expect("answer");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}
