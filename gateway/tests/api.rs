//! The gateway's HTTP contract, request by request, against an in-process
//! router (no socket) — and, for the slow-body case, a real socket.
//!
//! Every refusal is checked for its status, its JSON error code, and for
//! having changed nothing. The contract's checks run on both engines
//! (`on_sled::`, `on_postgres::`): bad input is the same on PostgreSQL as on
//! sled. The PostgreSQL runs are skipped only when its binaries are missing
//! and `PALISADE_PG_STRICT` is unset.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::Router;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use palisade_gateway::{AppParts, AppState, GatewayConfig, KeySource, LeaseClaims, Verifier};
use palisade_store::{PostgresStore, PostgresStoreConfig, SledStore, SledStoreConfig};
use serde_json::Value;
use tower::ServiceExt;

struct Fixture {
    app: Router,
    signing: EncodingKey,
    public_pem: String,
    _dir: tempfile::TempDir,
}

const MAX_VALUE: usize = 1024;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// The engine a fixture's store runs on.
#[derive(Debug, Clone, Copy)]
enum Engine {
    Sled,
    Postgres,
}

tokio::task_local! {
    /// Set by the `on_postgres` tests; unset means sled.
    static ENGINE: Engine;
}

async fn fixture_with(config: GatewayConfig) -> Fixture {
    fixture_with_policy(config, None).await
}

async fn fixture_with_policy(
    config: GatewayConfig,
    policy: Option<Arc<palisade_serve::policy::LivePolicy>>,
) -> Fixture {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let der = key.to_pkcs8_der().expect("pkcs8");
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(Default::default())
        .expect("pem");
    let dir = tempfile::tempdir().expect("tempdir");
    let pem_path = dir.path().join("key.pem");
    std::fs::write(&pem_path, &public_pem).expect("write pem");
    let verifier = Arc::new(Verifier::new(
        KeySource::from_pem_file(&pem_path).expect("key"),
        0,
    ));
    let max_value_bytes = config.max_value_bytes;
    let app = match ENGINE.try_with(|e| *e).unwrap_or(Engine::Sled) {
        Engine::Sled => {
            let mut store_config = SledStoreConfig::new(dir.path().join("data"));
            store_config.max_value_bytes = max_value_bytes;
            palisade_gateway::router(AppState::new(AppParts {
                store: Arc::new(SledStore::open(&store_config).expect("open")),
                verifier,
                config: Arc::new(config),
                policy,
                observer: Default::default(),
            }))
        }
        Engine::Postgres => {
            let mut store_config = PostgresStoreConfig::new(pg::fresh_database());
            store_config.max_value_bytes = max_value_bytes;
            let store = Arc::new(
                PostgresStore::connect(&store_config)
                    .await
                    .expect("connect"),
            );
            let observer = palisade_gateway::observe::Observer::default().with_audit(store.clone());
            palisade_gateway::router(AppState::new(AppParts {
                store,
                verifier,
                config: Arc::new(config),
                policy,
                observer: Arc::new(observer),
            }))
        }
    };
    Fixture {
        app,
        signing: EncodingKey::from_ed_der(der.as_bytes()),
        public_pem,
        _dir: dir,
    }
}

async fn fixture() -> Fixture {
    fixture_with(GatewayConfig {
        max_value_bytes: MAX_VALUE,
        ..GatewayConfig::default()
    })
    .await
}

fn claims(lease: &str, token: u64) -> LeaseClaims {
    LeaseClaims {
        iss: "palisade".into(),
        sub: "tester".into(),
        lease: lease.into(),
        token,
        iat: now(),
        exp: now() + 60,
    }
}

impl Fixture {
    fn jwt(&self, claims: &LeaseClaims) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some("k1".into());
        jsonwebtoken::encode(&header, claims, &self.signing).expect("sign")
    }

    fn token(&self, lease: &str, token: u64) -> String {
        self.jwt(&claims(lease, token))
    }

    async fn call(
        &self,
        method: &str,
        uri: &str,
        auth: Option<&str>,
        body: impl Into<Body>,
    ) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        self.call_as(None, method, uri, auth, body).await
    }

    /// A call carrying the API key `key` (`x-palisade-key`) when given.
    async fn call_as(
        &self,
        key: Option<&str>,
        method: &str,
        uri: &str,
        auth: Option<&str>,
        body: impl Into<Body>,
    ) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        self.call_with(key, method, uri, auth, &[], body).await
    }

    /// A call with `extra` headers too.
    async fn call_with(
        &self,
        key: Option<&str>,
        method: &str,
        uri: &str,
        auth: Option<&str>,
        extra: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        if let Some(key) = key {
            request = request.header(palisade_serve::policy::KEY_HEADER, key);
        }
        let response = self
            .app
            .clone()
            .oneshot(request.body(body.into()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        (status, headers, bytes)
    }

    async fn put(&self, key: &str, jwt: &str, body: &str) -> (StatusCode, Value) {
        let (status, _, bytes) = self
            .call(
                "PUT",
                &format!("/v1/objects/{key}"),
                Some(&format!("Bearer {jwt}")),
                body.to_owned(),
            )
            .await;
        (status, json(&bytes))
    }

    async fn fence(&self, lease: &str) -> u64 {
        let (status, _, bytes) = self
            .call("GET", &format!("/v1/fences/{lease}"), None, Body::empty())
            .await;
        assert_eq!(status, StatusCode::OK);
        json(&bytes)["fence"].as_u64().expect("fence is a number")
    }

    async fn object(&self, key: &str) -> Option<String> {
        let (status, _, bytes) = self
            .call("GET", &format!("/v1/objects/{key}"), None, Body::empty())
            .await;
        match status {
            StatusCode::OK => Some(String::from_utf8(bytes).expect("utf8")),
            StatusCode::NOT_FOUND => None,
            other => panic!("GET {key}: {other}"),
        }
    }

    /// Asserts a refusal: status, JSON error code, and that `jobs/a` and the
    /// fence of `jobs` are as they were.
    async fn assert_refused(
        &self,
        (status, body): (StatusCode, Value),
        want: StatusCode,
        code: &str,
    ) {
        assert_eq!(status, want, "{body}");
        assert_eq!(body["error"], code, "{body}");
        assert!(body["message"].is_string(), "{body}");
        assert_eq!(self.object("jobs/a").await.as_deref(), Some("v10"));
        assert_eq!(self.fence("jobs").await, 10);
    }

    /// The state every refusal test starts from: `jobs/a` = "v10" at token 10.
    async fn seeded() -> Self {
        let f = fixture().await;
        let (status, _) = f.put("jobs/a", &f.token("jobs", 10), "v10").await;
        assert_eq!(status, StatusCode::OK);
        f
    }
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

/// URL-safe base64 without padding, enough to forge test tokens.
fn b64(input: &[u8]) -> String {
    {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in input.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            let chars = chunk.len() + 1;
            for i in 0..chars {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }
}

async fn write_read_stale_write_and_fence_flow() {
    let f = fixture().await;
    let (status, body) = f.put("jobs/a", &f.token("jobs", 5), "first").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], "jobs/a");
    assert_eq!(body["token"], 5);
    let version = body["version"].as_u64().expect("version");

    let (status, headers, bytes) = f
        .call("GET", "/v1/objects/jobs/a", None, Body::empty())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bytes, b"first");
    assert_eq!(headers["etag"], version.to_string().as_str());
    assert_eq!(headers["fencing-token"], "5");
    assert!(headers.contains_key("x-request-id"));

    // The next holder raises the fence; the old one's write is refused.
    let (status, _, body) = f
        .call(
            "POST",
            "/v1/fences/jobs",
            Some(&format!("Bearer {}", f.token("jobs", 9))),
            Body::empty(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["fence"], 9);
    let (status, body) = f.put("jobs/a", &f.token("jobs", 5), "late").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "stale_token");
    assert_eq!(body["token"], 5);
    assert_eq!(body["fence"], 9);
    assert_eq!(f.object("jobs/a").await.as_deref(), Some("first"));

    let (status, body) = f.put("jobs/b", &f.token("jobs", 9), "x").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = f
        .call(
            "DELETE",
            "/v1/objects/jobs/b",
            Some(&format!("Bearer {}", f.token("jobs", 11))),
            Body::empty(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["deleted"], true);
    assert_eq!(f.object("jobs/b").await, None);
    assert_eq!(f.fence("jobs").await, 11);
    assert_eq!(f.fence("never").await, 0);

    let (status, _, _) = f.call("GET", "/healthz", None, Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
}

async fn bad_authorization_is_refused_and_changes_nothing() {
    let f = Fixture::seeded().await;
    let put = |auth: Option<String>| {
        let f = &f;
        async move {
            let (status, _, bytes) = f
                .call("PUT", "/v1/objects/jobs/a", auth.as_deref(), "evil")
                .await;
            (status, json(&bytes))
        }
    };
    let unauthorized = StatusCode::UNAUTHORIZED;
    f.assert_refused(put(None).await, unauthorized, "unauthorized")
        .await;
    for garbage in [
        "Basic Zm9vOmJhcg==",
        "Bearer",
        "Bearer not.a.jwt",
        "Bearer a.b",
        "bearer x",
    ] {
        f.assert_refused(
            put(Some(garbage.into())).await,
            unauthorized,
            "unauthorized",
        )
        .await;
    }

    // alg: none, with a payload that would otherwise pass.
    let payload = serde_json::to_vec(&claims("jobs", 99)).expect("claims");
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(&payload)
    );
    f.assert_refused(
        put(Some(format!("Bearer {none}"))).await,
        unauthorized,
        "unauthorized",
    )
    .await;

    // HS256 with the public key's bytes as the HMAC secret.
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims("jobs", 99),
        &EncodingKey::from_secret(f.public_pem.as_bytes()),
    )
    .expect("hs256");
    f.assert_refused(
        put(Some(format!("Bearer {hs}"))).await,
        unauthorized,
        "unauthorized",
    )
    .await;

    // A token signed by another key.
    let other = SigningKey::from_bytes(&[8u8; 32]);
    let forged = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims("jobs", 99),
        &EncodingKey::from_ed_der(other.to_pkcs8_der().expect("der").as_bytes()),
    )
    .expect("sign");
    f.assert_refused(
        put(Some(format!("Bearer {forged}"))).await,
        unauthorized,
        "unauthorized",
    )
    .await;

    // Expired, wrong issuer, out-of-range tokens.
    let mut expired = claims("jobs", 99);
    expired.exp = now() - 120;
    let mut wrong_issuer = claims("jobs", 99);
    wrong_issuer.iss = "someone-else".into();
    for bad in [
        expired,
        wrong_issuer,
        claims("jobs", 0),
        claims("jobs", u64::MAX),
    ] {
        let jwt = f.jwt(&bad);
        f.assert_refused(
            put(Some(format!("Bearer {jwt}"))).await,
            unauthorized,
            "unauthorized",
        )
        .await;
    }
}

async fn token_for_another_lease_is_forbidden() {
    let f = Fixture::seeded().await;
    let other = f.token("other", 99);
    f.assert_refused(
        f.put("jobs/a", &other, "evil").await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let (status, _, body) = f
        .call(
            "POST",
            "/v1/fences/jobs",
            Some(&format!("Bearer {other}")),
            Body::empty(),
        )
        .await;
    f.assert_refused((status, json(&body)), StatusCode::FORBIDDEN, "forbidden")
        .await;
    let (status, _, body) = f
        .call(
            "DELETE",
            "/v1/objects/jobs/a",
            Some(&format!("Bearer {other}")),
            Body::empty(),
        )
        .await;
    f.assert_refused((status, json(&body)), StatusCode::FORBIDDEN, "forbidden")
        .await;
}

async fn bad_keys_are_refused() {
    let f = Fixture::seeded().await;
    let jwt = f.token("jobs", 99);
    let long = format!("jobs/{}", "x".repeat(2000));
    for key in [
        "",
        "jobs//a",
        "jobs/a/",
        "jobs/./a",
        "jobs/../a",
        "jobs/%2E%2E/a",
        "..",
        "jobs/%zz",
        "jobs/%",
        "jobs/%FF",
        "bad%20lease/a",
        long.as_str(),
    ] {
        let (status, body) = f.put(key, &jwt, "evil").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key}: {body}");
        f.assert_refused((status, body), StatusCode::BAD_REQUEST, "invalid_key")
            .await;
    }
    let (status, _, body) = f.call("GET", "/v1/fences/a%2Fb", None, Body::empty()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"], "invalid_key");
}

async fn oversized_bodies_are_refused() {
    let f = Fixture::seeded().await;
    let jwt = f.token("jobs", 99);
    let big = "x".repeat(MAX_VALUE + 1);
    f.assert_refused(
        f.put("jobs/a", &jwt, &big).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    // Without Content-Length (a stream), the limit still holds.
    let stream = futures_stream(big.into_bytes());
    let (status, _, body) = f
        .call(
            "PUT",
            "/v1/objects/jobs/a",
            Some(&format!("Bearer {jwt}")),
            stream,
        )
        .await;
    f.assert_refused(
        (status, json(&body)),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    let (status, body) = f
        .put("jobs/a", &f.token("jobs", 10), &"y".repeat(MAX_VALUE))
        .await;
    assert_eq!(status, StatusCode::OK, "exactly the limit is fine: {body}");
}

fn futures_stream(bytes: Vec<u8>) -> Body {
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = bytes
        .chunks(100)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    Body::from_stream(futures_util::stream::iter(chunks))
}

async fn malformed_fence_requests_are_refused() {
    let f = Fixture::seeded().await;
    let auth = format!("Bearer {}", f.token("jobs", 99));
    for body in [
        "{",
        "[]",
        r#"{"token": "x"}"#,
        r#"{"token": 98}"#,
        r#"{"other": 1}"#,
    ] {
        let (status, _, bytes) = f.call("POST", "/v1/fences/jobs", Some(&auth), body).await;
        f.assert_refused(
            (status, json(&bytes)),
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    let (status, _, bytes) = f
        .call("POST", "/v1/fences/jobs", Some(&auth), r#"{"token": 99}"#)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&bytes)["fence"], 99);
}

async fn unknown_routes_and_methods_answer_json() {
    let f = fixture().await;
    let (status, _, body) = f.call("GET", "/nope", None, Body::empty()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&body)["error"], "not_found");
    let (status, _, body) = f.call("PATCH", "/v1/objects/a", None, Body::empty()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json(&body)["error"], "method_not_allowed");
    let (status, _, body) = f
        .call("GET", "/v1/objects/missing", None, Body::empty())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&body)["error"], "not_found");
}

async fn a_body_sent_too_slowly_times_out_and_writes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let f = fixture_with(GatewayConfig {
        request_timeout: Duration::from_millis(300),
        ..GatewayConfig::default()
    })
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(palisade_gateway::serve(
        listener,
        f.app.clone(),
        None,
        std::future::pending(),
        Duration::from_secs(1),
        4096,
    ));
    let jwt = f.token("slow", 3);
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "PUT /v1/objects/slow/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {jwt}\r\ncontent-length: 10\r\n\r\nab"
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the server must answer, not wait for the body forever"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert_eq!(f.object("slow/x").await, None);
    assert_eq!(f.fence("slow").await, 0);
    server.abort();
}

/// Keys from a JWKS endpoint: a known `kid` verifies; an unknown one waits
/// for a fetch that started after it arrived (so a key published a moment ago
/// is found at once), concurrent unknown kids share fetches, a kid a fresh
/// JWKS lacks is 401, an unreachable cluster is 503, and a key the cluster no
/// longer publishes stops being trusted.
#[tokio::test]
async fn jwks_keys_are_fetched_fresh_for_unknown_kids_and_retired_keys_are_dropped() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let key = SigningKey::from_bytes(&[7u8; 32]);
    let x = b64(key.verifying_key().as_bytes());
    let fetches = Arc::new(AtomicUsize::new(0));
    let published = Arc::new(std::sync::Mutex::new(vec!["k1".to_owned()]));
    let jwks_app = {
        let fetches = fetches.clone();
        let published = published.clone();
        Router::new().route(
            "/v1/jwks",
            axum::routing::get(move || {
                fetches.fetch_add(1, Ordering::SeqCst);
                let kids = published.lock().expect("lock").clone();
                let keys: Vec<Value> = kids
                    .iter()
                    .map(|kid| serde_json::json!({"kty":"OKP","crv":"Ed25519","x":x,"kid":kid,"alg":"EdDSA","use":"sig"}))
                    .collect();
                async move { axum::Json(serde_json::json!({ "keys": keys })) }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let jwks_server = tokio::spawn(async move { axum::serve(listener, jwks_app).await });

    let cache = Arc::new(palisade_gateway::JwksCache::new(
        vec!["http://127.0.0.1:1".into(), url],
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));
    let verifier = Arc::new(Verifier::new(KeySource::Jwks(cache), 0));
    let der = key.to_pkcs8_der().expect("der");
    let signing = EncodingKey::from_ed_der(der.as_bytes());
    let sign = |kid: &str| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, &claims("jobs", 4), &signing).expect("sign")
    };

    let k1 = sign("k1");
    let verified = verifier.verify(&k1).await.expect("known kid");
    assert_eq!(verified.token.0, 4);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "first use fetches");

    // 20 requests with a made-up kid at once share one or two fetches.
    let k2 = sign("k2");
    let attempts: Vec<_> = (0..20)
        .map(|_| {
            let (verifier, k2) = (verifier.clone(), k2.clone());
            tokio::spawn(async move { verifier.verify(&k2).await })
        })
        .collect();
    for attempt in attempts {
        let refused = attempt.await.expect("join");
        assert!(
            matches!(refused, Err(palisade_gateway::ApiError::Unauthorized(_))),
            "{refused:?}"
        );
    }
    let after_flood = fetches.load(Ordering::SeqCst);
    assert!((2..=3).contains(&after_flood), "{after_flood} fetches");

    // Published now, used at once: found by the fetch the request waits for.
    published.lock().expect("lock").push("k2".into());
    verifier
        .verify(&k2)
        .await
        .expect("a fresh key is found at once");

    // k1 retired: after the next fetch its tokens, cached ones included, fail.
    published.lock().expect("lock").retain(|kid| kid != "k1");
    let _ = verifier.verify(&sign("k3")).await;
    let refused = verifier.verify(&k1).await;
    assert!(
        matches!(refused, Err(palisade_gateway::ApiError::Unauthorized(_))),
        "a retired key is still trusted: {refused:?}"
    );
    jwks_server.abort();

    // No node answers: 503, not 401.
    let dead = Arc::new(palisade_gateway::JwksCache::new(
        vec!["http://127.0.0.1:1".into()],
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));
    let verifier = Verifier::new(KeySource::Jwks(dead), 0);
    let unreachable = verifier.verify(&sign("k1")).await;
    assert!(
        matches!(unreachable, Err(palisade_gateway::ApiError::Unavailable(_))),
        "{unreachable:?}"
    );
}

/// With a policy, reads need the read right on the key's lease and writes
/// the acquire right, on top of a valid JWT; refusals change nothing.
async fn a_policy_limits_principals_to_their_prefixes() {
    use palisade_serve::policy::{key_digest, Policy};
    let orders_key = "pal_orders_test_key_0123456789abcdef";
    let reader_key = "pal_reader_test_key_0123456789abcdef";
    let policy = Policy::parse(&format!(
        r#"{{"principals": {{
            "orders": {{"keys": ["{}"], "acquire": ["orders."], "read": ["orders."]}},
            "reader": {{"keys": ["{}"], "read": [""]}}
        }}}}"#,
        key_digest(orders_key),
        key_digest(reader_key)
    ))
    .expect("policy");
    let f = fixture_with_policy(
        GatewayConfig {
            max_value_bytes: MAX_VALUE,
            ..GatewayConfig::default()
        },
        Some(Arc::new(policy.into())),
    )
    .await;
    let bearer = |lease: &str| format!("Bearer {}", f.token(lease, 5));
    let status = |r: (StatusCode, http::HeaderMap, Vec<u8>)| (r.0, json(&r.2)["error"].clone());

    // The lease's principal writes and reads its own objects.
    let put = f
        .call_as(
            Some(orders_key),
            "PUT",
            "/v1/objects/orders.eu/a",
            Some(&bearer("orders.eu")),
            "v1",
        )
        .await;
    assert_eq!(put.0, StatusCode::OK, "{:?}", json(&put.2));
    let get = f
        .call_as(
            Some(orders_key),
            "GET",
            "/v1/objects/orders.eu/a",
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(
        (get.0, get.2.as_slice()),
        (StatusCode::OK, b"v1".as_slice())
    );

    // No key, or an unknown one: 401, for reads and writes alike.
    for key in [None, Some("pal_nobody"), Some(&*key_digest(orders_key))] {
        let r = f
            .call_as(key, "GET", "/v1/objects/orders.eu/a", None, Body::empty())
            .await;
        assert_eq!(status(r), (StatusCode::UNAUTHORIZED, "unauthorized".into()));
        let r = f
            .call_as(
                key,
                "PUT",
                "/v1/objects/orders.eu/a",
                Some(&bearer("orders.eu")),
                "x",
            )
            .await;
        assert_eq!(status(r), (StatusCode::UNAUTHORIZED, "unauthorized".into()));
    }
    // Outside its prefixes: 403, even with a valid JWT for that lease.
    for (method, uri) in [
        ("GET", "/v1/objects/payments/a"),
        ("GET", "/v1/fences/payments"),
        ("PUT", "/v1/objects/payments/a"),
        ("DELETE", "/v1/objects/payments/a"),
        ("POST", "/v1/fences/payments"),
    ] {
        let r = f
            .call_as(
                Some(orders_key),
                method,
                uri,
                Some(&bearer("payments")),
                Body::empty(),
            )
            .await;
        assert_eq!(
            status(r),
            (StatusCode::FORBIDDEN, "forbidden".into()),
            "{method} {uri}"
        );
    }
    // A reader reads everything and writes nothing, JWT or not.
    let r = f
        .call_as(
            Some(reader_key),
            "GET",
            "/v1/fences/orders.eu",
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(r.0, StatusCode::OK);
    let r = f
        .call_as(
            Some(reader_key),
            "PUT",
            "/v1/objects/orders.eu/a",
            Some(&bearer("orders.eu")),
            "x",
        )
        .await;
    assert_eq!(status(r), (StatusCode::FORBIDDEN, "forbidden".into()));
    // Nothing changed: the object and the fences are as they were.
    let get = f
        .call_as(
            Some(orders_key),
            "GET",
            "/v1/objects/orders.eu/a",
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(get.2.as_slice(), b"v1".as_slice());
    let r = f
        .call_as(
            Some(reader_key),
            "GET",
            "/v1/fences/payments",
            None,
            Body::empty(),
        )
        .await;
    assert_eq!(json(&r.2)["fence"], 0);
    // Health stays open.
    assert_eq!(
        f.call("GET", "/healthz", None, Body::empty()).await.0,
        StatusCode::OK
    );
}

/// The PostgreSQL the `on_postgres` runs use: one throwaway server per test
/// binary (stopped when the binary exits), a fresh database per fixture.
mod pg {
    use std::sync::atomic::{AtomicU32, Ordering};

    use palisade_local_cluster::PostgresServer;

    static DATABASES: AtomicU32 = AtomicU32::new(0);

    /// Whether the PostgreSQL runs happen (else they are skipped, saying
    /// so; under `PALISADE_PG_STRICT` a missing PostgreSQL fails them).
    pub fn available() -> bool {
        server().is_some()
    }

    fn server() -> Option<&'static PostgresServer> {
        palisade_local_cluster::shared_test_server("palisade-gateway-pg-")
    }

    /// The URL of a new, empty database.
    pub fn fresh_database() -> String {
        let server = server().expect("PostgreSQL runs only when available");
        let name = format!("api_{}", DATABASES.fetch_add(1, Ordering::SeqCst));
        server
            .sql(&format!("CREATE DATABASE {name}"))
            .expect("create a database");
        server.url(&name)
    }
}

/// Each check once per engine: `on_sled::NAME` and `on_postgres::NAME`.
macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {
        mod on_sled {
            $(#[tokio::test]
            async fn $name() {
                super::ENGINE.scope(super::Engine::Sled, super::$name()).await
            })*
        }
        mod on_postgres {
            $(#[tokio::test]
            async fn $name() {
                if super::pg::available() {
                    super::ENGINE.scope(super::Engine::Postgres, super::$name()).await
                }
            })*
        }
    };
}

on_both_engines!(
    write_read_stale_write_and_fence_flow,
    bad_authorization_is_refused_and_changes_nothing,
    token_for_another_lease_is_forbidden,
    bad_keys_are_refused,
    oversized_bodies_are_refused,
    malformed_fence_requests_are_refused,
    unknown_routes_and_methods_answer_json,
    a_body_sent_too_slowly_times_out_and_writes_nothing,
    a_policy_limits_principals_to_their_prefixes,
    conditional_writes_answer_412_and_change_nothing,
    malformed_preconditions_are_refused,
    a_listing_pages_through_a_prefix,
    head_answers_what_get_would_without_the_bytes,
    a_listing_shows_only_what_the_caller_may_read,
);

impl Fixture {
    /// A conditional write of `jobs/a` with `token`: (status, body, headers).
    async fn write_if(
        &self,
        method: &str,
        token: u64,
        condition: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, Value, http::HeaderMap) {
        let (status, headers, bytes) = self
            .call_with(
                None,
                method,
                "/v1/objects/jobs/a",
                Some(&format!("Bearer {}", self.token("jobs", token))),
                condition,
                body.to_owned(),
            )
            .await;
        (status, json(&bytes), headers)
    }

    async fn version(&self, key: &str) -> u64 {
        let (status, headers, _) = self
            .call("GET", &format!("/v1/objects/{key}"), None, Body::empty())
            .await;
        assert_eq!(status, StatusCode::OK);
        headers["etag"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("a number")
    }

    async fn list(&self, key: Option<&str>, query: &str) -> (StatusCode, Value) {
        let (status, _, bytes) = self
            .call_as(
                key,
                "GET",
                &format!("/v1/objects?{query}"),
                None,
                Body::empty(),
            )
            .await;
        (status, json(&bytes))
    }
}

/// A write whose `If-Match`/`If-None-Match` fails is 412 with the current
/// version, and changes nothing: not the object, not the fence (even when
/// its token would have raised it). A stale token is 409 whatever the
/// condition.
async fn conditional_writes_answer_412_and_change_nothing() {
    let f = Fixture::seeded().await;
    let v = f.version("jobs/a").await;
    let wrong = (v + 1).to_string();
    for (method, condition) in [
        ("PUT", [("if-match", wrong.as_str())]),
        ("PUT", [("if-none-match", "*")]),
        ("DELETE", [("if-match", wrong.as_str())]),
    ] {
        let (status, body, headers) = f.write_if(method, 11, &condition, "x").await;
        assert_eq!(body["key"], "jobs/a", "{body}");
        assert_eq!(body["current_version"], v, "{body}");
        assert_eq!(headers["etag"], v.to_string().as_str());
        f.assert_refused(
            (status, body),
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed",
        )
        .await;
    }
    let quoted = format!("\"{v}\"");
    let (status, body, _) = f.write_if("PUT", 9, &[("if-match", &quoted)], "x").await;
    f.assert_refused((status, body), StatusCode::CONFLICT, "stale_token")
        .await;

    // The version matches: written, fence raised, a new version.
    let (status, body, _) = f.write_if("PUT", 11, &[("if-match", &quoted)], "v11").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["version"].as_u64().expect("version") > v);
    assert_eq!(f.fence("jobs").await, 11);
    let (status, body, _) = f.write_if("DELETE", 11, &[("if-match", "*")], "").await;
    assert_eq!(
        (status, &body["deleted"]),
        (StatusCode::OK, &Value::Bool(true)),
        "{body}"
    );
    // Nothing there: "current_version" is null, and no ETag.
    let (status, body, headers) = f.write_if("DELETE", 12, &[("if-match", "*")], "").await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
    assert_eq!(body.get("current_version"), Some(&Value::Null), "{body}");
    assert!(!headers.contains_key("etag"));
    assert_eq!(f.fence("jobs").await, 11, "a failed delete raises nothing");
    let (status, body, _) = f
        .write_if("PUT", 12, &[("if-none-match", "*")], "new")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(f.object("jobs/a").await.as_deref(), Some("new"));
}

async fn malformed_preconditions_are_refused() {
    let f = Fixture::seeded().await;
    for (method, condition) in [
        ("PUT", vec![("if-match", "W/\"1\"")]),
        ("PUT", vec![("if-match", "1, 2")]),
        ("PUT", vec![("if-match", "one")]),
        ("PUT", vec![("if-none-match", "1")]),
        ("PUT", vec![("if-match", "1"), ("if-none-match", "*")]),
        ("DELETE", vec![("if-none-match", "*")]),
    ] {
        let (status, body, _) = f.write_if(method, 11, &condition, "x").await;
        f.assert_refused(
            (status, body),
            StatusCode::BAD_REQUEST,
            "invalid_precondition",
        )
        .await;
    }
}

/// `GET /v1/objects`: pages in key order, across leases, `next` until the
/// prefix is done; bad queries are 400.
async fn a_listing_pages_through_a_prefix() {
    let f = fixture().await;
    let keys = ["jobs/c", "jobs/a", "jobsx/a", "jobs/b/deep", "other/a"];
    for key in keys {
        let lease = key.split('/').next().expect("lease");
        let (status, body) = f.put(key, &f.token(lease, 3), key).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let mut seen = Vec::new();
    let mut query = "prefix=jobs&limit=2".to_owned();
    for _ in 0..4 {
        let (status, page) = f.list(None, &query).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for object in page["objects"].as_array().expect("objects") {
            let key = object["key"].as_str().expect("key");
            assert_eq!(object["size"], key.len(), "{object}");
            assert_eq!(object["token"], 3);
            assert!(object["version"].as_u64().is_some());
            seen.push(key.to_owned());
        }
        match page["next"].as_str() {
            Some(next) => query = format!("prefix=jobs&limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["jobs/a", "jobs/b/deep", "jobs/c", "jobsx/a"]);
    let (_, all) = f.list(None, "").await;
    assert_eq!(all["objects"].as_array().expect("objects").len(), 5);
    assert_eq!(all["next"], Value::Null);
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "color=red",
        "prefix=%00",
        "after=a%0A",
    ] {
        let (status, body) = f.list(None, bad).await;
        assert_eq!(
            (status, &body["error"]),
            (StatusCode::BAD_REQUEST, &Value::from("bad_request")),
            "{bad}: {body}"
        );
    }
}

async fn head_answers_what_get_would_without_the_bytes() {
    let f = Fixture::seeded().await;
    let v = f.version("jobs/a").await;
    let (status, headers, bytes) = f
        .call("HEAD", "/v1/objects/jobs/a", None, Body::empty())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(bytes.is_empty());
    assert_eq!(headers["etag"], v.to_string().as_str());
    assert_eq!(headers["fencing-token"], "10");
    assert_eq!(headers["content-length"], "3");
    let (status, _, _) = f
        .call("HEAD", "/v1/objects/jobs/none", None, Body::empty())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Under a policy a listing needs a known key, and shows only the keys of
/// leases the caller may read; walking every page of every prefix, `next`
/// never names another key either (it once named every key of the
/// gateway, one page at a time).
async fn a_listing_shows_only_what_the_caller_may_read() {
    use palisade_serve::policy::{key_digest, Policy};
    let orders_key = "pal_orders_test_key_0123456789abcdef";
    let writer_key = "pal_writer_test_key_0123456789abcdef";
    let nobody_key = "pal_nobody_test_key_0123456789abcdef";
    let policy = Policy::parse(&format!(
        r#"{{"principals": {{
            "orders": {{"keys": ["{}"], "acquire": ["orders."], "read": ["orders.", "x/"]}},
            "writer": {{"keys": ["{}"], "acquire": [""], "read": [""]}},
            "nobody": {{"keys": ["{}"]}}
        }}}}"#,
        key_digest(orders_key),
        key_digest(writer_key),
        key_digest(nobody_key)
    ))
    .expect("policy");
    let f = fixture_with_policy(GatewayConfig::default(), Some(Arc::new(policy.into()))).await;
    let others = [
        "a.first/k",
        "b.secret/payroll-2026.csv",
        "orders/x",
        "ordersz/y",
        "x/k",
        "zz.last/k",
    ];
    for key in others
        .iter()
        .chain(["orders.eu/a", "orders.eu/b", "orders.us/a"].iter())
    {
        let lease = key.split('/').next().expect("lease");
        let put = f
            .call_as(
                Some(writer_key),
                "PUT",
                &format!("/v1/objects/{key}"),
                Some(&format!("Bearer {}", f.token(lease, 2))),
                "x",
            )
            .await;
        assert_eq!(put.0, StatusCode::OK, "{key}");
    }
    for (who, key, readable) in [
        (
            "orders",
            orders_key,
            vec!["orders.eu/a", "orders.eu/b", "orders.us/a"],
        ),
        ("nobody", nobody_key, vec![]),
    ] {
        for prefix in ["", "o", "orders", "orders.", "orders.eu/", "b", "x", "zz"] {
            for limit in [1, 2, 100] {
                let mut seen = Vec::new();
                let mut after: Option<String> = None;
                for _ in 0..20 {
                    let query = match &after {
                        Some(a) => format!("prefix={prefix}&limit={limit}&after={a}"),
                        None => format!("prefix={prefix}&limit={limit}"),
                    };
                    let (status, page) = f.list(Some(key), &query).await;
                    assert_eq!(status, StatusCode::OK, "{who} {query}: {page}");
                    for object in page["objects"].as_array().expect("objects") {
                        seen.push(object["key"].as_str().expect("key").to_owned());
                    }
                    match page["next"].as_str() {
                        Some(next) => {
                            assert!(readable.contains(&next), "{who} {query}: next {next}");
                            after = Some(next.to_owned());
                        }
                        None => break,
                    }
                }
                let wanted: Vec<&str> = readable
                    .iter()
                    .copied()
                    .filter(|k| k.starts_with(prefix))
                    .collect();
                assert_eq!(seen, wanted, "{who} prefix={prefix} limit={limit}");
            }
        }
    }
    let (status, body) = f.list(None, "").await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::UNAUTHORIZED, &Value::from("unauthorized"))
    );
}
