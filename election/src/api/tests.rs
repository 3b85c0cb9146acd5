//! The client API in process: a one-node cluster, its router called with
//! `oneshot` (no socket), status codes and bodies checked.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use futures::StreamExt;
use http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::config::ElectionConfig;
use crate::node::ElectionNode;

/// The status pages: sessions, headers, origins, what a principal sees.
mod ui;

/// The prefix watch's bound on a reader that falls behind.
mod prefix_watch;

/// A one-node cluster that leads and can sign; the router over its state.
struct Node {
    app: Router,
    _node: ElectionNode,
    _dir: tempfile::TempDir,
}

async fn node() -> Node {
    node_with(|_| {}).await
}

/// A one-node cluster with `adjust` applied to its config.
async fn node_with(adjust: impl FnOnce(&mut ElectionConfig)) -> Node {
    let dir = tempfile::tempdir().expect("temp dir");
    let peers = BTreeMap::from([(1, "127.0.0.1:9".to_owned())]);
    let listen = "127.0.0.1:0".parse().expect("addr");
    let mut config = ElectionConfig::new(1, listen, dir.path().to_owned(), peers);
    config.peer_listen = Some("127.0.0.1:0".parse().expect("addr"));
    adjust(&mut config);
    let node = ElectionNode::start(config).await.expect("start");
    let state = node.state.clone();
    for _ in 0..500 {
        if state.group_zero().is_leader() && state.group_zero().signer().is_ok() {
            return Node {
                app: node.router(),
                _node: node,
                _dir: dir,
            };
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the one-node cluster did not elect itself and install a key");
}

impl Node {
    async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        let body = match body {
            Some(body) => {
                request = request.header("content-type", "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        self.send(request.body(body).expect("request")).await
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.app.clone().oneshot(request).await.expect("answer");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, body)
    }

    async fn post(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, uri, Some(body)).await
    }
}

fn error_code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("<none>")
}

/// Checks a new grant of `jobs` to `a` for 5 s has every documented field;
/// its token.
fn documented_grant(grant: &Value) -> u64 {
    let token = grant["token"].as_u64().expect("token");
    assert_eq!(grant["lease"], "jobs");
    assert_eq!(grant["holder"], "a");
    assert_eq!(grant["ttl_ms"], 5000);
    assert_eq!(
        grant["grant_index"], token,
        "a new grant's index is its token"
    );
    assert!(grant["jwt"]
        .as_str()
        .is_some_and(|j| j.split('.').count() == 3));
    assert!(grant["kid"].is_string());
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_answer_with_the_documented_bodies() {
    let node = node().await;
    let (status, grant) = node
        .post(
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let token = documented_grant(&grant);

    let (status, body) = node
        .post(
            "/v1/leases/jobs/acquire",
            json!({"holder": "b", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error_code(&body), "held");
    assert_eq!(body["holder"], "a");
    assert_eq!(body["token"], token);

    let (status, body) = node
        .post(
            "/v1/leases/jobs/renew",
            json!({"holder": "a", "token": token + 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error_code(&body), "lost");
    let secret = grant["secret"]
        .as_str()
        .expect("an acquire answers the secret");
    assert!(secret.len() >= 32);
    let (status, renewed) = node
        .post(
            "/v1/leases/jobs/renew",
            json!({"holder": "a", "token": token, "secret": secret}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["token"], token);
    assert!(renewed.get("secret").is_none(), "only the acquire shows it");

    let (status, body) = node
        .post(
            "/v1/leases/jobs/release",
            json!({"holder": "b", "token": token}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error_code(&body), "lost");
    let (status, body) = node
        .post(
            "/v1/leases/jobs/release",
            json!({"holder": "a", "token": token, "grant_index": token, "secret": secret}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"lease": "jobs", "released": true, "token": token})
    );

    let (status, lease) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!lease.to_string().contains(secret));
    assert_eq!(lease["holder"], Value::Null);
    assert_eq!(lease["token"], token);
    assert_eq!(lease["transitions"], 2);
    let (status, list) = node.call(Method::GET, "/v1/leases", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["leases"].as_array().map(Vec::len), Some(1));
}

/// Everything a read shows (holder, token, grant index) does not let a third
/// party renew, release, re-acquire or shorten another client's grant; the
/// answer is the same as for a lease that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_lease_data_cannot_take_a_grant_over() {
    let node = node().await;
    let (status, grant) = node
        .post(
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 60_000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let token = grant["token"].clone();
    let secret = grant["secret"].as_str().expect("secret").to_owned();
    let (_, shown) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(shown["holder"], "a");
    let wrong = "w".repeat(43);
    for presented in [None, Some(wrong.as_str())] {
        let mut named = json!({"holder": "a", "token": token, "grant_index": token});
        if let Some(presented) = presented {
            named["secret"] = json!(presented);
        }
        let mut again = json!({"holder": "a", "ttl_ms": 1000});
        if let Some(presented) = presented {
            again["secret"] = json!(presented);
        }
        let (status, body) = node.post("/v1/leases/jobs/acquire", again).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(error_code(&body), "held");
        assert!(body.get("jwt").is_none());
        let (status, renewed) = node.post("/v1/leases/jobs/renew", named.clone()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{renewed}");
        let (status, released) = node.post("/v1/leases/jobs/release", named.clone()).await;
        assert_eq!(status, StatusCode::CONFLICT, "{released}");
        // The same answer as for a lease nobody ever held.
        let (status, absent) = node.post("/v1/leases/nobody/renew", named).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(error_code(&absent), error_code(&renewed));
    }
    let (_, after) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(after["holder"], "a");
    assert_eq!(after["ttl_ms"], 60_000, "the ttl was not shortened");
    assert_eq!(after["transitions"], 1);
    let (status, _) = node
        .post(
            "/v1/leases/jobs/renew",
            json!({"holder": "a", "token": token, "secret": secret}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the holder still holds it");
    // A client that chose its own secret gets the same grant back on retry.
    let mine = "m".repeat(40);
    let (status, first) = node
        .post(
            "/v1/leases/own/acquire",
            json!({"holder": "b", "ttl_ms": 5000, "secret": mine}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, retry) = node
        .post(
            "/v1/leases/own/acquire",
            json!({"holder": "b", "ttl_ms": 5000, "secret": mine}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{retry}");
    assert_eq!(retry["token"], first["token"]);
    let (status, short) = node
        .post(
            "/v1/leases/own/acquire",
            json!({"holder": "b", "ttl_ms": 5000, "secret": "short"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{short}");
}

/// Revoke stops renewals at once but frees the lease only at the grant's
/// deadline, so the holder is never overlapped while its SDK believes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_is_not_renewed_and_ends_at_its_deadline() {
    let node = node().await;
    let (_, grant) = node
        .post(
            "/v1/leases/r/acquire",
            json!({"holder": "a", "ttl_ms": 1000}),
        )
        .await;
    let (token, secret) = (grant["token"].clone(), grant["secret"].clone());
    let (status, body) = node
        .post(
            "/v1/leases/r/revoke",
            json!({"token": token.as_u64().map(|t| t + 1)}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "another grant: {body}");
    let revoked_at = tokio::time::Instant::now();
    let (status, body) = node
        .post("/v1/leases/r/revoke", json!({"token": token}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["revoked"], true);
    let renew = json!({"holder": "a", "token": token, "secret": secret});
    let (status, body) = node.post("/v1/leases/r/renew", renew).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "lost");
    let (_, shown) = node.call(Method::GET, "/v1/leases/r", None).await;
    assert_eq!(shown["holder"], "a", "still held until its deadline");
    assert_eq!(shown["revoked"], true);
    let (status, next) = node
        .post(
            "/v1/leases/r/acquire",
            json!({"holder": "b", "ttl_ms": 1000, "wait_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert!(next["token"].as_u64() > token.as_u64());
    assert!(
        revoked_at.elapsed() >= Duration::from_millis(900),
        "freed before the deadline: {:?}",
        revoked_at.elapsed()
    );
}

/// Calls that are each malformed in one way: a bad name, a ttl, holder or
/// wait out of range, an unknown field, a token of the wrong type or past
/// int64, a missing field.
fn malformed_calls() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/leases/a%20b/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        ),
        (
            "/v1/leases/../acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 10}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 3_600_001}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "", "ttl_ms": 5000}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a\n", "ttl_ms": 5000}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a".repeat(257), "ttl_ms": 5000}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 5000, "wait_ms": 60_001}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 5000, "extra": 1}),
        ),
        (
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": -1}),
        ),
        (
            "/v1/leases/jobs/renew",
            json!({"holder": "a", "token": "7"}),
        ),
        // Past the schema's int64 (schemathesis found it accepted).
        (
            "/v1/leases/jobs/renew",
            json!({"holder": "a", "token": u64::MAX}),
        ),
        (
            "/v1/leases/jobs/revoke",
            json!({"token": 9_223_372_036_854_775_808_u64}),
        ),
        ("/v1/leases/jobs/release", json!({"holder": "a"})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_and_changes_nothing() {
    let node = node().await;
    let cases = malformed_calls();
    for (uri, body) in cases {
        let (status, answer) = node.post(uri, body.clone()).await;
        // `..` is normalized away by no one here: the router sees a bad name
        // or no route at all; either way nothing is granted.
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{uri} {body}: {status} {answer}"
        );
        assert!(answer["message"].is_string(), "{uri} {body}: {answer}");
    }
    let not_json = Request::post("/v1/leases/jobs/acquire")
        .header("content-type", "text/plain")
        .body(Body::from(r#"{"holder":"a","ttl_ms":5000}"#))
        .expect("request");
    let (status, answer) = node.send(not_json).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let huge = Request::post("/v1/leases/jobs/acquire")
        .header("content-type", "application/json")
        .body(Body::from(vec![b' '; super::MAX_BODY_BYTES + 1]))
        .expect("request");
    assert_eq!(node.send(huge).await.0, StatusCode::BAD_REQUEST);
    let (status, answer) = node
        .call(Method::GET, "/v1/leases/jobs/watch?index=x", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, answer) = node
        .call(Method::GET, "/v1/leases/jobs/watch?wait_ms=60001", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    let (status, list) = node.call(Method::GET, "/v1/leases", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["leases"], json!([]), "nothing was granted");

    // A holder is bounded in characters, as the schema's maxLength counts:
    // 256 four-byte characters are one holder, 257 ASCII ones are not.
    let (status, answer) = node
        .post(
            "/v1/leases/jobs/acquire",
            json!({"holder": "\u{1F512}".repeat(256), "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_outside_the_api_are_404_and_wrong_methods_405() {
    let node = node().await;
    let (status, body) = node.call(Method::GET, "/v1/leases/never", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "not_found");
    let (status, body) = node.call(Method::GET, "/v1/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "not_found");
    for raft in ["/raft/vote", "/raft/append", "/raft/snapshot"] {
        let (status, _) = node.post(raft, json!({})).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{raft} is not a client route"
        );
    }
    let (status, body) = node
        .call(Method::GET, "/v1/leases/jobs/acquire", None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_code(&body), "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_any_node_show_the_cluster_and_its_key() {
    let node = node().await;
    let (status, cluster) = node.call(Method::GET, "/v1/cluster", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cluster["node_id"], 1);
    assert_eq!(cluster["leader"], 1);
    let (status, jwks) = node.call(Method::GET, "/v1/jwks", None).await;
    assert_eq!(status, StatusCode::OK);
    let keys = jwks["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["alg"], "EdDSA");
    assert!(keys[0].get("d").is_none(), "no private part is published");
    assert_eq!(
        node.call(Method::GET, "/healthz", None).await.0,
        StatusCode::OK
    );

    // A watch answers at once when the lease changed after `index`.
    let (status, grant) = node
        .post(
            "/v1/leases/w/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, seen) = node
        .call(Method::GET, "/v1/leases/w/watch?index=0&wait_ms=100", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(seen["holder"], "a");
    assert_eq!(seen["modify_index"], grant["token"]);
}

/// A rotation signs new grants with the new key at once and keeps the old
/// one published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_signs_with_the_new_key_and_keeps_the_old_one_published() {
    let node = node().await;
    let (_, before) = node
        .post(
            "/v1/leases/r/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    let (status, rotated) = node.post("/v1/cluster/rotate-key", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_ne!(rotated["kid"], before["kid"]);
    let (_, jwks) = node.call(Method::GET, "/v1/jwks", None).await;
    let kids: Vec<&Value> = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| &k["kid"])
        .collect();
    assert_eq!(
        kids,
        [&rotated["kid"], &before["kid"]],
        "new first, old kept"
    );
    let renew = json!({"holder": "a", "token": before["token"], "secret": before["secret"]});
    let (status, renewed) = node.post("/v1/leases/r/renew", renew).await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["kid"], rotated["kid"], "renewals use the new key");
}

/// The list comes in pages, in name order, filtered by prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_list_is_paginated_and_filtered_by_prefix() {
    let node = node().await;
    for name in ["a.1", "a.2", "a.3", "b.1"] {
        let (status, _) = node
            .post(
                &format!("/v1/leases/{name}/acquire"),
                json!({"holder": "h", "ttl_ms": 5000}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let names = |page: &Value| -> Vec<String> {
        page["leases"]
            .as_array()
            .expect("leases")
            .iter()
            .map(|l| l["lease"].as_str().expect("name").to_owned())
            .collect()
    };
    let (_, first) = node
        .call(Method::GET, "/v1/leases?prefix=a.&limit=2", None)
        .await;
    assert_eq!(names(&first), ["a.1", "a.2"]);
    assert_eq!(first["next"], "a.2");
    let (_, second) = node
        .call(Method::GET, "/v1/leases?prefix=a.&limit=2&after=a.2", None)
        .await;
    assert_eq!(names(&second), ["a.3"]);
    assert_eq!(second["next"], Value::Null);
    let (_, all) = node.call(Method::GET, "/v1/leases", None).await;
    assert_eq!(names(&all), ["a.1", "a.2", "a.3", "b.1"]);
    // An `after` before the prefix starts at the prefix (the scan never
    // walks the names in between); one past it ends the list.
    for (query, expected) in [
        ("prefix=b.&after=", vec!["b.1"]),
        ("prefix=b.&after=a.1", vec!["b.1"]),
        ("prefix=a.&after=z", vec![]),
    ] {
        let (status, page) = node
            .call(Method::GET, &format!("/v1/leases?{query}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{query}");
        assert_eq!(names(&page), expected, "{query}");
    }
    for bad in ["limit=0", "limit=1001", "limit=x", "bogus=1"] {
        let (status, _) = node
            .call(Method::GET, &format!("/v1/leases?{bad}"), None)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// Over the cap on waiting calls a node answers 429 with Retry-After at once,
/// and answers others as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_over_the_cap_get_a_fast_429() {
    let node = std::sync::Arc::new(node_with(|config| config.max_waiters = 2).await);
    let (status, _) = node
        .post(
            "/v1/leases/w/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let node = node.clone();
            tokio::spawn(async move {
                node.call(
                    Method::GET,
                    "/v1/leases/w/watch?index=999999&wait_ms=1500",
                    None,
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let over = Request::get("/v1/leases/w/watch?index=999999&wait_ms=1500")
        .body(Body::empty())
        .expect("request");
    let response = node.app.clone().oneshot(over).await.expect("answer");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(started.elapsed() < Duration::from_millis(500), "not fast");
    let (status, body) = node
        .post(
            "/v1/leases/w/acquire",
            json!({"holder": "b", "ttl_ms": 5000, "wait_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let (status, _) = node
        .post(
            "/v1/leases/x/acquire",
            json!({"holder": "b", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a call that does not wait is served"
    );
    for waiter in waiting {
        assert_eq!(waiter.await.expect("join").0, StatusCode::OK);
    }
    let (status, _) = node
        .call(
            Method::GET,
            "/v1/leases/w/watch?index=999999&wait_ms=10",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "permits come back");
}

/// At the cap on the table's size, an acquire of a new name is a fast 429
/// that changes nothing; names already in the table are still granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_refuses_new_names_only() {
    let node = node_with(|config| config.max_leases = 2).await;
    let acquire = |holder: &str| json!({"holder": holder, "ttl_ms": 5000});
    for name in ["a", "b"] {
        let (status, body) = node
            .post(&format!("/v1/leases/{name}/acquire"), acquire("x"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = node.post("/v1/leases/c/acquire", acquire("x")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(error_code(&body), "too_many_leases");
    let (status, _) = node.call(Method::GET, "/v1/leases/c", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    let (status, body) = node.post("/v1/leases/a/acquire", acquire("y")).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "an existing name is served: {body}"
    );
}

/// The last two transitions of `lease`'s history, newest first, as
/// `(cause, index, token)`, read from the history rather than counted in
/// the log (an entry elsewhere in the log, another lease's or the leader's
/// duties', does not count); and the whole history.
async fn last_two_transitions(node: &Node, lease: &str) -> (Vec<(String, u64, u64)>, Value) {
    let uri = format!("/v1/leases/{lease}/history");
    let (status, history) = node.call(Method::GET, &uri, None).await;
    assert_eq!(status, StatusCode::OK, "{history}");
    let last = history["history"]
        .as_array()
        .expect("history")
        .iter()
        .rev()
        .take(2)
        .map(|t| {
            let field = |k: &str| t[k].as_u64().expect("number");
            let cause = t["cause"].as_str().expect("cause").to_owned();
            (cause, field("index"), field("token"))
        })
        .collect();
    (last, history)
}

/// Blocking acquirers of a held lease are served first come, first served,
/// and each handoff costs one log entry (the head's acquire, the entry
/// right after the release), not one per waiter; a waiter whose wait ends
/// hears who holds the lease now; a watch wakes only for its own lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_lease_goes_to_the_longest_waiter_with_one_entry() {
    let node = std::sync::Arc::new(node().await);
    let acquire = |holder: &str, wait_ms: u64| json!({"holder": holder, "ttl_ms": 60_000, "wait_ms": wait_ms});
    let (status, first) = node.post("/v1/leases/q/acquire", acquire("a", 0)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let other = node.post("/v1/leases/other/acquire", acquire("z", 0)).await;
    assert_eq!(other.0, StatusCode::OK);
    // A watch on another lease sleeps through everything below.
    let other_index = other.1["token"].as_u64().expect("token");
    let watcher = {
        let node = node.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let uri = format!("/v1/leases/other/watch?index={other_index}&wait_ms=3000");
            let (status, _) = node.call(Method::GET, &uri, None).await;
            (status, started.elapsed())
        })
    };
    let mut waiters = Vec::new();
    for i in 0..5 {
        let node = node.clone();
        waiters.push(tokio::spawn(async move {
            node.post("/v1/leases/q/acquire", acquire(&format!("w{i}"), 20_000))
                .await
        }));
        // Each is queued before the next arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut holder, mut token) = ("a".to_owned(), first["token"].as_u64().expect("token"));
    let mut secret = first["secret"].as_str().expect("secret").to_owned();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let release = json!({"holder": holder, "token": token, "secret": secret});
        let (status, body) = node.post("/v1/leases/q/release", release).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, grant) = waiter.await.expect("join");
        assert_eq!(status, StatusCode::OK, "{grant}");
        assert_eq!(grant["holder"], format!("w{i}"), "first come, first served");
        let next = grant["token"].as_u64().expect("token");
        // The handoff is the release and the head's acquire, one entry
        // after it: no other waiter proposed in between.
        let (last, history) = last_two_transitions(&node, "q").await;
        assert_eq!(
            last,
            [
                ("acquire".to_owned(), next, next),
                ("release".to_owned(), next - 1, token)
            ],
            "release + one acquire per handoff: {history}"
        );
        (holder, token) = (format!("w{i}"), next);
        secret = grant["secret"].as_str().expect("secret").to_owned();
    }
    // A waiter whose wait ends is told the holder now.
    let (status, body) = node
        .post("/v1/leases/q/acquire", acquire("late", 300))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["holder"], "w4");
    assert_eq!(body["token"], token);
    let (status, waited) = watcher.await.expect("join");
    assert_eq!(status, StatusCode::OK);
    assert!(
        waited >= Duration::from_millis(2900),
        "woken by another lease after {waited:?}"
    );
    assert_eq!(
        node._node
            .state
            .group_zero()
            .applied
            .bells
            .leases_waited_on(),
        0,
        "nothing left queued"
    );
}

/// A node with a policy: every call needs a known key (401), and a
/// principal only reaches the leases and calls its rights name (403);
/// refusals change nothing. JWKS and health stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_limits_principals_to_their_prefixes_and_rights() {
    use palisade_serve::policy::{key_digest, Policy, KEY_HEADER};
    let orders = "pal_orders_key_for_the_api_test_000001";
    let operator = "pal_operator_key_for_the_api_test_0001";
    let policy = Policy::parse(&format!(
        r#"{{"principals": {{
            "orders": {{"keys": ["{}"], "acquire": ["orders."], "read": ["orders."]}},
            "operator": {{"keys": ["{}"], "read": [""], "admin": [""], "cluster": true}}
        }}}}"#,
        key_digest(orders),
        key_digest(operator)
    ))
    .expect("policy");
    let node = node_with(|c| c.policy = Some(std::sync::Arc::new(policy.into()))).await;
    let call = |key: Option<&'static str>, method: Method, uri: &str, body: Option<Value>| {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(key) = key {
            request = request.header(KEY_HEADER, key);
        }
        let body = match body {
            Some(body) => {
                request = request.header("content-type", "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        node.send(request.body(body).expect("request"))
    };
    let acquire = json!({"holder": "a", "ttl_ms": 5000});

    // No key, or an unknown one: 401 on every guarded route.
    for key in [None, Some("pal_not_a_key")] {
        for (method, uri, body) in [
            (
                Method::POST,
                "/v1/leases/orders.eu/acquire",
                Some(acquire.clone()),
            ),
            (Method::GET, "/v1/leases/orders.eu", None),
            (Method::GET, "/v1/leases?prefix=orders.", None),
            (Method::GET, "/v1/leases/orders.eu/watch?wait_ms=0", None),
            (Method::GET, "/v1/cluster", None),
            (Method::POST, "/v1/cluster/rotate-key", None),
        ] {
            let (status, body) = call(key, method.clone(), uri, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {uri}: {body}");
            assert_eq!(error_code(&body), "unauthorized");
        }
    }
    // Inside its rights: served.
    let (status, grant) = call(
        Some(orders),
        Method::POST,
        "/v1/leases/orders.eu/acquire",
        Some(acquire.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let token = grant["token"].as_u64().expect("token");
    let (status, _) = call(
        Some(orders),
        Method::GET,
        "/v1/leases?prefix=orders.e",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(Some(orders), Method::GET, "/v1/cluster", None).await;
    assert_eq!(status, StatusCode::OK);
    // Outside them: 403, and nothing changed.
    for (method, uri, body) in [
        (
            Method::POST,
            "/v1/leases/payments/acquire",
            Some(acquire.clone()),
        ),
        (
            Method::POST,
            "/v1/leases/orders/acquire",
            Some(acquire.clone()),
        ),
        (Method::GET, "/v1/leases/payments", None),
        (Method::GET, "/v1/leases/payments/watch?wait_ms=0", None),
        (Method::GET, "/v1/leases", None),
        (Method::GET, "/v1/leases?prefix=orders", None),
        (
            Method::POST,
            "/v1/leases/orders.eu/revoke",
            Some(json!({"token": token})),
        ),
        (Method::POST, "/v1/cluster/rotate-key", None),
        (Method::DELETE, "/v1/cluster/members/1", None),
    ] {
        let (status, body) = call(Some(orders), method.clone(), uri, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {body}");
        assert_eq!(error_code(&body), "forbidden");
    }
    // A batch renewal checks each lease: the one outside the caller's
    // prefix is that renewal's 403; without a key the whole batch is 401.
    let batch = json!({"renewals": [
        {"lease": "orders.eu", "holder": "a", "token": token, "secret": grant["secret"]},
        {"lease": "payments", "holder": "a", "token": token},
    ]});
    let (status, body) = call(Some(orders), Method::POST, "/v1/renew", Some(batch.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"][0]["status"], 200, "{body}");
    assert_eq!(body["results"][1]["status"], 403, "{body}");
    assert_eq!(body["results"][1]["error"], "forbidden", "{body}");
    let (status, _) = call(None, Method::POST, "/v1/renew", Some(batch)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(Some(operator), Method::GET, "/v1/leases/payments", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "payments was never granted");
    let (_, lease) = call(Some(operator), Method::GET, "/v1/leases/orders.eu", None).await;
    assert_eq!(
        (lease["holder"].as_str(), lease["revoked"].as_bool()),
        (Some("a"), None)
    );
    // The operator may not acquire: it has no acquire right.
    let (status, _) = call(
        Some(operator),
        Method::POST,
        "/v1/leases/jobs/acquire",
        Some(acquire),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // ...but may revoke and rotate.
    let (status, body) = call(
        Some(operator),
        Method::POST,
        "/v1/leases/orders.eu/revoke",
        Some(json!({"token": token})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Open routes.
    assert_eq!(
        call(None, Method::GET, "/v1/jwks", None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(None, Method::GET, "/healthz", None).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_answers_each_lease_on_its_own() {
    let node = node().await;
    let mut held = Vec::new();
    for lease in ["shard-1", "shard-2", "shard-3"] {
        let (status, grant) = node
            .post(
                &format!("/v1/leases/{lease}/acquire"),
                json!({"holder": "w", "ttl_ms": 5000}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{grant}");
        held.push(grant);
    }
    // shard-2 is lost: released, then granted to someone else.
    let (status, body) = node
        .post(
            "/v1/leases/shard-2/release",
            json!({"holder": "w", "token": held[1]["token"], "secret": held[1]["secret"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, other) = node
        .post(
            "/v1/leases/shard-2/acquire",
            json!({"holder": "x", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{other}");
    let entry = |g: &Value| json!({"lease": g["lease"], "holder": g["holder"], "token": g["token"], "secret": g["secret"]});
    let mut forged = entry(&held[2]);
    forged["secret"] = json!("A".repeat(43));
    let renewals = json!({"renewals": [
        entry(&held[0]),
        entry(&held[1]),
        forged,
        entry(&held[2]),
    ]});
    let (status, body) = node.post("/v1/renew", renewals).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = body["results"].as_array().expect("results");
    let outcome: Vec<(&str, u64, &str)> = results
        .iter()
        .map(|r| {
            (
                r["lease"].as_str().unwrap_or(""),
                r["status"].as_u64().unwrap_or(0),
                r["error"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        outcome,
        [
            ("shard-1", 200, ""),
            ("shard-2", 409, "lost"),
            ("shard-3", 409, "lost"),
            ("shard-3", 200, ""),
        ]
    );
    for (result, grant) in [(&results[0], &held[0]), (&results[3], &held[2])] {
        assert_eq!(result["grant"]["token"], grant["token"]);
        assert_eq!(result["grant"]["ttl_ms"], 5000);
        assert!(result["grant"]["jwt"].is_string());
        assert!(
            result["grant"].get("secret").is_none(),
            "a renewal never shows the secret"
        );
    }
    // The lost lease is untouched: still x's.
    let (_, lease) = node.call(Method::GET, "/v1/leases/shard-2", None).await;
    assert_eq!(lease["holder"], "x");
    assert_eq!(lease["token"], other["token"]);

    malformed_batches_are_refused_whole(&node, entry(&held[0])).await;
}

/// Malformed batches are refused whole, even when only one entry is (as
/// the schema says), and renew nothing; `one` is a well-formed entry.
async fn malformed_batches_are_refused_whole(node: &Node, one: Value) {
    let with = |field: &str, value: Value| {
        let mut bad = one.clone();
        bad[field] = value;
        json!({"renewals": [one.clone(), bad]})
    };
    for bad in [
        with("lease", json!("..")),
        with("holder", json!("h".repeat(257))),
        with("holder", json!("a\u{7}b")),
        with("token", json!(u64::MAX)),
        json!({"renewals": []}),
        json!({"renewals": vec![one.clone(); super::MAX_BATCH_RENEWALS + 1]}),
        json!({"renewals": [one.clone()], "extra": 1}),
        json!({"renewals": [{"lease": "shard-1", "holder": "w"}]}),
        json!([one]),
    ] {
        let (status, body) = node.post("/v1/renew", bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(error_code(&body), "bad_request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_reuse_the_jwt_and_it_covers_the_deadline() {
    let node = node().await;
    let (status, grant) = node
        .post(
            "/v1/leases/jobs/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let renew = json!({"holder": "a", "token": grant["token"], "secret": grant["secret"]});
    let (status, renewed) = node.post("/v1/leases/jobs/renew", renew).await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["jwt"], grant["jwt"], "no new signature needed");
    let claims = |jwt: &Value| -> Value {
        let payload = jwt.as_str().and_then(|j| j.split('.').nth(1)).expect("jwt");
        let bytes =
            base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload)
                .expect("base64");
        serde_json::from_slice(&bytes).expect("claims")
    };
    let c = claims(&renewed["jwt"]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let exp = c["exp"].as_u64().expect("exp");
    assert!(
        exp >= now + 5,
        "covers the renewed deadline: exp {exp}, now {now}"
    );
    assert!(
        exp <= now + 11,
        "at most two ttls (and a second): exp {exp}, now {now}"
    );
}

/// Seed semantics, in process: `(status, body)` of an acquire of `lease`.
async fn acquire(node: &Node, lease: &str, body: Value) -> (StatusCode, Value) {
    node.post(&format!("/v1/leases/{lease}/acquire"), body)
        .await
}

fn grant_of(g: &Value) -> Value {
    json!({"holder": g["holder"], "token": g["token"], "secret": g["secret"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_reserves_the_lease_for_the_successor_with_a_higher_token() {
    let node = std::sync::Arc::new(node().await);
    let (_, a) = acquire(&node, "jobs", json!({"holder": "A", "ttl_ms": 5000})).await;
    // Bad input changes nothing: to oneself, a bad window, not the holder.
    let mut to_self = grant_of(&a);
    to_self["to"] = json!("A");
    let mut bad_window = grant_of(&a);
    bad_window["to"] = json!("B");
    bad_window["window_ms"] = json!(10);
    let (status, body) = node.post("/v1/leases/jobs/handover", to_self).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "conflict")
    );
    let (status, body) = node.post("/v1/leases/jobs/handover", bad_window).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let mut not_holder = grant_of(&a);
    not_holder["holder"] = json!("C");
    not_holder["to"] = json!("B");
    let (status, body) = node.post("/v1/leases/jobs/handover", not_holder).await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "lost"));
    let mut forged = grant_of(&a);
    forged["secret"] = json!("A".repeat(43));
    forged["to"] = json!("B");
    let (status, _) = node.post("/v1/leases/jobs/handover", forged).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, lease) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(lease["holder"], "A", "unchanged: {lease}");

    // B waits in the queue before the handover; C queued ahead of it.
    let waiter = |holder: &'static str| {
        let node = node.clone();
        tokio::spawn(async move {
            let body = json!({"holder": holder, "ttl_ms": 5000, "wait_ms": 4000});
            node.post("/v1/leases/jobs/acquire", body).await
        })
    };
    let c = waiter("C");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = waiter("B");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut handover = grant_of(&a);
    handover["to"] = json!("B");
    let (status, handed) = node.post("/v1/leases/jobs/handover", handover).await;
    assert_eq!(status, StatusCode::OK, "{handed}");
    assert!(handed["token"].as_u64() > a["token"].as_u64(), "{handed}");
    let (status, b) = b.await.expect("B");
    assert_eq!(status, StatusCode::OK, "B takes it past C: {b}");
    assert_eq!(b["token"], handed["token"], "with the handover's token");
    // A's renewal is refused; C still waits, then times out held by B.
    let (status, body) = node.post("/v1/leases/jobs/renew", grant_of(&a)).await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "lost"));
    let (status, body) = c.await.expect("C");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["holder"], "B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclaimed_handover_is_reserved_then_expires() {
    let node = node().await;
    let (_, a) = acquire(&node, "jobs", json!({"holder": "A", "ttl_ms": 5000})).await;
    let mut handover = grant_of(&a);
    handover["to"] = json!("B");
    handover["window_ms"] = json!(600);
    let (status, handed) = node.post("/v1/leases/jobs/handover", handover).await;
    assert_eq!(status, StatusCode::OK, "{handed}");
    let (_, lease) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(
        (lease["holder"].clone(), lease["reserved"].clone()),
        (json!("B"), json!(true))
    );
    // Nobody else, nor a renewal naming B without B's acquire, takes it.
    let (status, body) = acquire(&node, "jobs", json!({"holder": "C", "ttl_ms": 5000})).await;
    assert_eq!(
        (status, body["holder"].clone()),
        (StatusCode::CONFLICT, json!("B"))
    );
    let (status, _) = node
        .post(
            "/v1/leases/jobs/renew",
            json!({"holder": "B", "token": handed["token"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, body) = acquire(
        &node,
        "jobs",
        json!({"holder": "C", "ttl_ms": 5000, "wait_ms": 3000}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "free once the window passed: {body}"
    );
    assert!(body["token"].as_u64() > handed["token"].as_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_higher_priority_preempts_a_preemptible_holder() {
    let node = std::sync::Arc::new(node().await);
    let (_, low) = acquire(
        &node,
        "jobs",
        json!({"holder": "low", "ttl_ms": 3000, "priority": 1, "preemptible": true}),
    )
    .await;
    // Out of range is a 400; equal priority, or not waiting, preempts nothing.
    let (status, _) = acquire(
        &node,
        "jobs",
        json!({"holder": "x", "ttl_ms": 3000, "priority": 1001}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = acquire(
        &node,
        "jobs",
        json!({"holder": "same", "ttl_ms": 3000, "priority": 1, "wait_ms": 200}),
    )
    .await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "held"));
    let (status, _) = acquire(
        &node,
        "jobs",
        json!({"holder": "high", "ttl_ms": 3000, "priority": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, renewed) = node.post("/v1/leases/jobs/renew", grant_of(&low)).await;
    assert_eq!(status, StatusCode::OK, "not preempted yet: {renewed}");

    let high = {
        let node = node.clone();
        tokio::spawn(async move {
            let body = json!({"holder": "high", "ttl_ms": 3000, "priority": 5, "wait_ms": 5000});
            node.post("/v1/leases/jobs/acquire", body).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, lease) = node.call(Method::GET, "/v1/leases/jobs", None).await;
    assert_eq!(lease["preempted_by"], "high", "{lease}");
    let (status, body) = node.post("/v1/leases/jobs/renew", grant_of(&low)).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "preempted"),
        "{body}"
    );
    // The preempted holder lets go: the candidate is granted at once.
    let released_at = tokio::time::Instant::now();
    let (status, _) = node.post("/v1/leases/jobs/release", grant_of(&low)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, granted) = high.await.expect("high");
    assert_eq!(status, StatusCode::OK, "{granted}");
    assert!(
        released_at.elapsed() < Duration::from_secs(2),
        "granted on the release, not at expiry"
    );
    assert!(granted["token"].as_u64() > low["token"].as_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_grant_with_a_lock_delay_holds_the_lease_back_and_a_release_does_not() {
    let node = node().await;
    let (status, _) = acquire(
        &node,
        "jobs",
        json!({"holder": "x", "ttl_ms": 500, "lock_delay_ms": 60_001}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, first) = acquire(
        &node,
        "jobs",
        json!({"holder": "x", "ttl_ms": 500, "lock_delay_ms": 1500}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    // x never renews: the grant expires, then the lease is held back.
    let mut freed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (_, lease) = node.call(Method::GET, "/v1/leases/jobs", None).await;
        if lease["holder"].is_null() {
            assert_eq!(lease["lock_delayed"], true, "{lease}");
            freed = true;
            break;
        }
    }
    assert!(freed, "the grant expired");
    let (status, body) = acquire(&node, "jobs", json!({"holder": "y", "ttl_ms": 5000})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "lock_delay"),
        "{body}"
    );
    let left = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(left > 500 && left <= 1500, "{left}");
    // A waiting acquire is granted once the delay has passed.
    let asked = tokio::time::Instant::now();
    let (status, second) = acquire(
        &node,
        "jobs",
        json!({"holder": "y", "ttl_ms": 5000, "wait_ms": 5000}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert!(asked.elapsed() >= Duration::from_millis(left - 100));
    // A clean release leaves no delay.
    let (status, _) = node
        .post("/v1/leases/jobs/release", grant_of(&second))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = acquire(&node, "jobs", json!({"holder": "z", "ttl_ms": 5000})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_stop_at_the_max_hold() {
    let node = node().await;
    let (status, g) = acquire(
        &node,
        "jobs",
        json!({"holder": "x", "ttl_ms": 500, "max_hold_ms": 1200}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{g}");
    let started = tokio::time::Instant::now();
    let mut refused = None;
    while started.elapsed() < Duration::from_secs(3) {
        let (status, body) = node.post("/v1/leases/jobs/renew", grant_of(&g)).await;
        if status != StatusCode::OK {
            refused = Some((started.elapsed(), status, error_code(&body).to_owned()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (after, status, code) = refused.expect("a renewal was refused");
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "max_hold"));
    // Refused once now + ttl would pass the cap: not before 1200 - 500 ms.
    assert!(after >= Duration::from_millis(650), "{after:?}");
}

/// A repeated acquire by the holder of a grant that can no longer be
/// extended (its max-hold reached) and runs for a long ttl yet: at the end
/// of its wait it is told why (409 `max_hold`), not 503 "retry" (found by
/// schemathesis: the grant could not end within the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_acquire_of_a_maxed_out_grant_says_why() {
    let node = node().await;
    let (status, g) = acquire(
        &node,
        "maxed",
        json!({"holder": "x", "ttl_ms": 60_000, "max_hold_ms": 200}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{g}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = json!({"holder": "x", "ttl_ms": 60_000, "secret": g["secret"], "wait_ms": 300});
    let (status, body) = acquire(&node, "maxed", again).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "max_hold"),
        "{body}"
    );
}

#[tokio::test]
async fn a_repeated_key_is_refused_on_the_integral_float_path_too() {
    let node = node().await;
    // `ttl_ms` as 5000.0 sends the body down the integral-float path; the
    // repeated `holder` must be refused there as by the typed parse.
    for body in [
        r#"{"holder":"a","ttl_ms":5000.0,"holder":"b"}"#,
        r#"{"holder":"a","ttl_ms":5000,"holder":"b"}"#,
    ] {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/v1/leases/dup/acquire")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let (status, answer) = node.send(request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(error_code(&answer), "bad_request");
    }
    let (status, _) = node.call(Method::GET, "/v1/leases/dup", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was granted");
}

/// A whole number written with a fraction is that integer, exactly, even
/// past 2^53 where an `f64` cannot hold every integer (schemathesis sent a
/// batch renewal's token as 9007199254740992.0 and was refused 400).
#[tokio::test]
async fn whole_numbers_written_as_decimals_are_read_exactly() {
    let node = node().await;
    for token in ["9007199254740992.0", "9007199254740993.0", "1e3"] {
        let body = format!(r#"{{"renewals":[{{"lease":"w","holder":"h","token":{token}}}]}}"#);
        let request = Request::builder()
            .method(Method::POST)
            .uri("/v1/renew")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let (status, answer) = node.send(request).await;
        assert_eq!(status, StatusCode::OK, "{token}: {answer}");
        assert_eq!(
            answer["results"][0]["status"], 409,
            "{token}: no such grant: {answer}"
        );
    }
    let (status, answer) = acquire(&node, "w", json!({"holder": "h", "ttl_ms": 1500.5})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a real fraction: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_one_page_of_leases_and_links_the_next() {
    let node = node().await;
    for i in 0..205 {
        let (status, body) = acquire(
            &node,
            &format!("p.{i:03}"),
            json!({"holder": "h", "ttl_ms": 60_000}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let html = |uri: String| {
        let app = node.app.clone();
        async move {
            let request = Request::builder()
                .uri(uri)
                .body(Body::empty())
                .expect("request");
            let response = app.oneshot(request).await.expect("answer");
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
                .await
                .expect("body");
            String::from_utf8(bytes.to_vec()).expect("utf-8")
        }
    };
    let first = html("/ui?prefix=p.".into()).await;
    assert_eq!(first.matches("<td class=\"lease\">").count(), 200);
    assert!(first.contains("p.199") && !first.contains("p.200"));
    let next = first
        .split("id=\"next\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a next-page link")
        .replace("&amp;", "&");
    assert_eq!(next, "/ui?prefix=p.&after=p.199");
    let second = html(next).await;
    assert_eq!(second.matches("<td class=\"lease\">").count(), 5);
    assert!(second.contains("p.204") && !second.contains("id=\"next\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_answered_408_within_the_deadline() {
    let node = node_with(|c| c.body_deadline = Duration::from_millis(300)).await;
    // The first bytes, then nothing: the sender never finishes its body.
    let first: Result<bytes::Bytes, std::io::Error> =
        Ok(bytes::Bytes::from_static(b"{\"holder\":"));
    let stalled = futures::stream::iter([first]).chain(futures::stream::pending());
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/leases/slow/acquire")
        .header("content-type", "application/json")
        .body(Body::from_stream(stalled))
        .expect("request");
    let started = std::time::Instant::now();
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), node.send(request))
        .await
        .expect("answered, not hung");
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(error_code(&body), "request_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let (status, _) = node.call(Method::GET, "/v1/leases/slow", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was granted");
}

/// Under a policy, a principal owns at most its quota of leases (its
/// policy entry's `max_leases`, else the node's default): one more is a
/// fast 429 `over_quota` that creates nothing, a lease it already owns is
/// granted again, another principal is not affected, and a freed lease
/// stops counting once reclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_owns_at_most_its_quota_of_leases() {
    use palisade_serve::policy::{key_digest, Policy, KEY_HEADER};
    let (hog, other) = (
        "pal_hog_key_for_the_quota_test_000001",
        "pal_other_key_for_the_quota_test_00001",
    );
    let policy = Policy::parse(&format!(
        r#"{{"principals": {{
            "hog": {{"keys": ["{}"], "acquire": [""], "read": [""], "max_leases": 2}},
            "other": {{"keys": ["{}"], "acquire": [""], "read": [""]}}
        }}}}"#,
        key_digest(hog),
        key_digest(other)
    ))
    .expect("policy");
    let node = node_with(|c| {
        c.policy = Some(std::sync::Arc::new(policy.into()));
        c.max_leases_per_principal = 3;
        c.reclaim_after = Duration::from_millis(300);
    })
    .await;
    let call = |key: &'static str, method: Method, uri: String, body: Option<Value>| {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(KEY_HEADER, key);
        let body = match body {
            Some(body) => {
                request = request.header("content-type", "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        node.send(request.body(body).expect("request"))
    };
    let acquire = |key, lease: &str| {
        let body = json!({"holder": "h", "ttl_ms": 5000, "secret": "s".repeat(43)});
        call(
            key,
            Method::POST,
            format!("/v1/leases/{lease}/acquire"),
            Some(body),
        )
    };
    for lease in ["hog.a", "hog.b"] {
        let (status, body) = acquire(hog, lease).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = acquire(hog, "hog.c").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(error_code(&body), "over_quota", "{body}");
    let (status, _) = call(hog, Method::GET, "/v1/leases/hog.c".into(), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    let (status, body) = acquire(hog, "hog.a").await;
    assert_eq!(status, StatusCode::OK, "a lease it owns again: {body}");
    // Another principal has its own (default) quota.
    for lease in ["other.a", "other.b", "other.c"] {
        let (status, body) = acquire(other, lease).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = acquire(other, "other.d").await;
    assert_eq!(error_code(&body), "over_quota", "{status} {body}");

    // Released, hog.a still counts until reclaimed; then hog.c fits.
    let (status, body) = call(
        hog,
        Method::POST,
        "/v1/leases/hog.a/release".into(),
        Some(
            json!({"holder": "h", "token": body_token(&node, hog).await, "secret": "s".repeat(43)}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = acquire(hog, "hog.c").await;
    assert_eq!(
        error_code(&body),
        "over_quota",
        "freed, not reclaimed: {body}"
    );
    let mut granted = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, _) = acquire(hog, "hog.c").await;
        if status == StatusCode::OK {
            granted = true;
            break;
        }
    }
    assert!(granted, "a reclaimed lease stopped counting");
}

/// The token of `hog.a`, read as `key`.
async fn body_token(node: &Node, key: &'static str) -> u64 {
    use palisade_serve::policy::KEY_HEADER;
    let request = Request::builder()
        .uri("/v1/leases/hog.a")
        .header(KEY_HEADER, key)
        .body(Body::empty())
        .expect("request");
    let (status, body) = node.send(request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["token"].as_u64().expect("token")
}
