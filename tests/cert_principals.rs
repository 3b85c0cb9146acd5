//! Client certificates as principals (issue 31), on real processes: a
//! 3-node cluster and a gateway over client TLS with a policy in which
//! `billing` has no API key but the certificate name `client.palisade`
//! (the client certificate `palisade certs init` issues).
//!
//! - With that certificate and no key, a client is `billing` on every
//!   node — a follower names it to the leader when it forwards — and on
//!   the gateway: it gets exactly billing's rights (`billing.*`: 200;
//!   `orders.*`: 403).
//! - A certificate from the same CA that no principal names is 401, as is
//!   no certificate and no key; a certificate from another CA fails the
//!   handshake.
//! - A key, when sent, wins over the certificate; a client cannot name a
//!   principal itself (`x-palisade-principal` is honoured only from a
//!   peer).
//! - The Rust SDK (`with_client_cert_files`) and the CLI
//!   (`PALISADE_CLIENT_CERT`/`PALISADE_CLIENT_KEY`) present it too.

use crate::support;

use std::path::Path;
use std::time::Duration;

use palisade_serve::certs::Authority;
use palisade_serve::policy::{add, Rules};
use serde_json::{json, Value};
use support::{node_setup, post_json, spawn_node, test_secret, Cluster};

/// A client trusting the cluster's CA, presenting `identity` (cert, key
/// PEM) if given, sending `key` if given.
fn client(certs: &Path, identity: Option<(String, String)>, key: Option<&str>) -> reqwest::Client {
    let ca = std::fs::read(certs.join("ca.pem")).expect("ca.pem");
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("ca"))
        .timeout(Duration::from_secs(10));
    if let Some((cert, private)) = identity {
        let pem = format!("{cert}\n{private}");
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("identity"));
    }
    if let Some(key) = key {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            palisade_serve::policy::KEY_HEADER,
            key.parse().expect("key header"),
        );
        builder = builder.default_headers(headers);
    }
    builder.build().expect("client")
}

fn read_pair(certs: &Path, name: &str) -> (String, String) {
    let read = |file: String| std::fs::read_to_string(certs.join(file)).expect("pem");
    (read(format!("{name}.pem")), read(format!("{name}-key.pem")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_its_principal_with_exactly_its_rights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| node_setup(dir.path(), id, "127.0.0.1"))
        .collect();
    let (cluster, access) = Cluster::start_secure_edited(dir.path(), setups, |access| {
        let billing = Rules {
            acquire: vec!["billing.".into()],
            read: vec!["billing.".into()],
            certificates: vec!["client.palisade".into()],
            ..Rules::default()
        };
        add(&access.keys, "billing", &billing).expect("policy: billing");
    });
    let certs = dir.path().join("certs");
    let gateway = spawn_node(access.gateway_for(&cluster, &dir.path().join("gateway")));
    let admin = access.http("admin");
    let leader = cluster.leader(&admin).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let billing = client(&certs, Some(read_pair(&certs, "client")), None);

    // Through a follower (forwarded, named to the leader) and the leader.
    let mut jwt = String::new();
    for (i, node) in [follower, leader].into_iter().enumerate() {
        let base = cluster.url(node);
        let lease = format!("billing.run-{i}");
        let body = json!({"holder": "b", "ttl_ms": 10_000, "secret": test_secret("b")});
        let url = format!("{base}/v1/leases/{lease}/acquire");
        let (status, grant) = post_json(&billing, &url, body.clone()).await;
        assert_eq!(
            status, 200,
            "billing's own lease through node {node}: {grant}"
        );
        jwt = grant["jwt"].as_str().expect("jwt").to_owned();
        let url = format!("{base}/v1/leases/orders.run-{i}/acquire");
        let (status, refused) = post_json(&billing, &url, body).await;
        assert_eq!(status, 403, "orders' lease through node {node}: {refused}");
        let read = billing
            .get(format!("{base}/v1/leases/{lease}"))
            .send()
            .await
            .expect("read");
        assert_eq!(
            read.status(),
            200,
            "reading its own lease through node {node}"
        );
    }

    // The gateway: its own lease's objects, not orders'.
    let put = billing
        .put(format!("{}/v1/objects/billing.run-1/ledger", gateway.url))
        .bearer_auth(&jwt)
        .body("paid")
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 200, "{:?}", put.text().await);
    let other = billing
        .get(format!("{}/v1/objects/orders.run-1/x", gateway.url))
        .send()
        .await
        .expect("get");
    assert_eq!(other.status(), 403);

    // A certificate of the same CA that no principal names; none at all.
    let stranger = Authority::load(&certs)
        .expect("the CA")
        .issue("stranger.palisade", &["stranger.palisade".into()], &[])
        .expect("issue");
    let stranger = client(&certs, Some((stranger.cert_pem, stranger.key_pem)), None);
    let anonymous = client(&certs, None, None);
    let base = cluster.url(follower);
    let body = json!({"holder": "s", "ttl_ms": 10_000});
    for (who, http) in [("stranger", &stranger), ("anonymous", &anonymous)] {
        let (status, answer) = post_json(
            http,
            &format!("{base}/v1/leases/billing.x/acquire"),
            body.clone(),
        )
        .await;
        assert_eq!(status, 401, "{who}: {answer}");
        let at_gateway = http
            .get(format!("{}/v1/objects/billing.run-1/ledger", gateway.url))
            .send()
            .await
            .expect("get");
        assert_eq!(at_gateway.status(), 401, "{who} at the gateway");
    }
    // A client naming a principal itself is not believed.
    let forged = anonymous
        .post(format!("{base}/v1/leases/billing.x/acquire"))
        .header("x-palisade-principal", "admin")
        .json(&body)
        .send()
        .await
        .expect("forged");
    assert_eq!(forged.status(), 401);

    // Another CA's certificate does not get past the handshake.
    let foreign = Authority::new("elsewhere")
        .expect("CA")
        .issue("client.palisade", &["client.palisade".into()], &[])
        .expect("issue");
    let foreign = client(&certs, Some((foreign.cert_pem, foreign.key_pem)), None);
    let handshake = foreign
        .get(format!("{base}/v1/leases/billing.run-0"))
        .send()
        .await;
    assert!(
        handshake.is_err(),
        "a foreign CA's certificate was accepted: {handshake:?}"
    );

    // The SDK and the CLI present the certificate as well.
    let config = palisade_client::ClientConfig::new(cluster.urls())
        .with_gateway(gateway.url.clone())
        .with_ca_file(&certs.join("ca.pem"))
        .expect("ca")
        .with_client_cert_files(&certs.join("client.pem"), &certs.join("client-key.pem"))
        .expect("client certificate");
    let sdk = palisade_client::Client::new(config);
    let lease = sdk
        .acquire(
            "billing.sdk",
            "sdk",
            Duration::from_secs(5),
            Some(Duration::from_secs(5)),
        )
        .await
        .expect("the SDK acquires as billing");
    lease
        .put("billing.sdk/ledger", "from the SDK")
        .await
        .expect("the SDK writes as billing");
    lease.release().await.expect("release");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["lease", "acquire", "billing.cli", "--holder", "cli"])
        .env("PALISADE_ELECTION", cluster.urls().join(","))
        .env("PALISADE_CA", certs.join("ca.pem"))
        .env("PALISADE_CLIENT_CERT", certs.join("client.pem"))
        .env("PALISADE_CLIENT_KEY", certs.join("client-key.pem"))
        .env_remove("PALISADE_API_KEY")
        .env_remove("PALISADE_API_KEY_FILE")
        .output()
        .expect("run the CLI");
    assert!(
        cli.status.success(),
        "the CLI with the certificate: {}",
        String::from_utf8_lossy(&cli.stderr)
    );

    // The key wins over the certificate: admin's rights, not billing's.
    let both = client(
        &certs,
        Some(read_pair(&certs, "client")),
        Some(&access.key("admin")),
    );
    let (status, answer): (u16, Value) = post_json(
        &both,
        &format!("{base}/v1/leases/orders.by-key/acquire"),
        json!({"holder": "k", "ttl_ms": 10_000}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}
