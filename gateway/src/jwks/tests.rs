//! The key cache against fake election endpoints on loopback: the newest
//! answer wins, and an older one never replaces the cached set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use http::StatusCode;
use serde_json::{json, Value};

use crate::jwks::{JwksCache, KeyLookup, KeySource};

/// What a fake node answers: a status and a body.
type Answer = Arc<Mutex<(StatusCode, Value)>>;

async fn fake_node(answer: Answer) -> String {
    let app = Router::new()
        .route(
            "/v1/jwks",
            get(|State(answer): State<Answer>| async move {
                let (status, body) = answer.lock().expect("answer").clone();
                (status, Json(body))
            }),
        )
        .with_state(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A JWK named `kid` (any 32 bytes make a key the cache accepts).
fn jwk(kid: &str, fill: char) -> Value {
    // 43 base64url characters are 32 bytes; the last one's spare bits are 0.
    let x: String = std::iter::repeat_n(fill, 42).chain(['A']).collect();
    json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": kid, "x": x})
}

fn published(keys: &[Value], applied_index: u64) -> (StatusCode, Value) {
    (
        StatusCode::OK,
        json!({"keys": keys, "applied_index": applied_index}),
    )
}

async fn lookup(cache: &Arc<JwksCache>, kid: &str) -> &'static str {
    match KeySource::Jwks(cache.clone()).key_for(Some(kid)).await {
        KeyLookup::Found(_) => "found",
        KeyLookup::Unknown => "unknown",
        KeyLookup::Unreachable(_) => "unreachable",
    }
}

#[tokio::test]
async fn a_lagging_node_neither_hides_a_new_key_nor_revives_a_retired_one() {
    let lagging: Answer = Arc::new(Mutex::new(published(&[jwk("old", 'A')], 5)));
    let current: Answer = Arc::new(Mutex::new(published(&[jwk("new", 'B')], 9)));
    // The lagging node comes first, as a gateway's first --election URL.
    let endpoints = vec![
        fake_node(lagging.clone()).await,
        fake_node(current.clone()).await,
    ];
    let cache = Arc::new(JwksCache::new(
        endpoints,
        Duration::ZERO,
        Duration::from_secs(2),
    ));
    cache.refresh().await.expect("fetch");
    assert_eq!(cache.applied_index(), 9);
    assert_eq!(lookup(&cache, "new").await, "found");
    assert_eq!(lookup(&cache, "old").await, "unknown");

    // The current node is down; the lagging one still publishes a key the
    // cluster has since retired: the cache keeps the newer set.
    *current.lock().expect("answer") = (StatusCode::SERVICE_UNAVAILABLE, json!({}));
    *lagging.lock().expect("answer") = published(&[jwk("old", 'A'), jwk("retired", 'C')], 6);
    cache.refresh().await.expect("fetch");
    assert_eq!(cache.applied_index(), 9);
    assert_eq!(lookup(&cache, "retired").await, "unknown");
    assert_eq!(lookup(&cache, "new").await, "found");

    // A rotation seen by the current node, back up: the newer set wins.
    *current.lock().expect("answer") = published(&[jwk("newer", 'D'), jwk("new", 'B')], 12);
    assert_eq!(
        lookup(&cache, "newer").await,
        "found",
        "an unknown kid asks every node"
    );
    assert_eq!(cache.applied_index(), 12);
}

#[tokio::test]
async fn no_node_answering_is_unreachable_not_unknown() {
    let down: Answer = Arc::new(Mutex::new((StatusCode::SERVICE_UNAVAILABLE, json!({}))));
    let cache = Arc::new(JwksCache::new(
        vec![fake_node(down).await],
        Duration::ZERO,
        Duration::from_secs(2),
    ));
    assert_eq!(lookup(&cache, "any").await, "unreachable");
}
