//! The signing key as operators change it and gateways follow it, on real
//! processes: rotations under a steady writer refuse no valid write, a key
//! retired after its tokens expired stops being trusted, and a gateway that
//! starts with a fresh cluster never refuses the first grant's token.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{gateway_for, http_client, node_setup, published_kids, sdk, spawn_node, Cluster};

/// Clusters are heavy on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn kid_of(jwt: &str) -> String {
    let header = jsonwebtoken::decode_header(jwt).expect("header");
    header.kid.expect("kid")
}

#[tokio::test]
async fn rotations_under_load_refuse_no_valid_write_and_a_retired_key_is_refused() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Tokens live at most 3 s here, so a rotated-out key retires 5 s later.
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args = vec!["--max-ttl-ms".into(), "3000".into()];
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let mut spec = gateway_for(&cluster, &dir.path().join("gateway"));
    spec.args = vec!["--jwks-refresh-ms".into(), "500".into()];
    let gateway = spawn_node(spec);
    let http = http_client();
    cluster.leader(&http).await;
    let client = sdk(&cluster, Some(&gateway));
    let lease = client
        .acquire(
            "rot",
            "writer",
            Duration::from_millis(1000),
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("acquire");
    let first_jwt = lease.jwt().expect("held");
    let first_kid = kid_of(&first_jwt);

    let started = Instant::now();
    let (mut writes, mut refused, mut rotations) = (0u32, Vec::new(), Vec::new());
    while started.elapsed() < Duration::from_secs(12) {
        let due = [Duration::from_secs(2), Duration::from_secs(5)];
        if rotations.len() < due.len() && started.elapsed() >= due[rotations.len()] {
            rotations.push(client.rotate_key().await.expect("rotate"));
        }
        match lease.put("rot/x", format!("{writes}")).await {
            Ok(_) => writes += 1,
            Err(err) => refused.push(format!("{:?}: {err}", started.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused.is_empty(), "valid writes refused: {refused:?}");
    assert!(writes > 200, "only {writes} writes");
    assert!(lease.is_held());
    let now_kid = kid_of(&lease.jwt().expect("held"));
    assert_eq!(
        Some(&now_kid),
        rotations.last(),
        "renewals sign with the newest key"
    );

    // The first key retired (its tokens all expired), and the gateway, which
    // refetches every 500 ms, no longer trusts it.
    let leader = cluster.leader(&http).await;
    let kids = published_kids(&http, &cluster.url(leader)).await;
    assert!(
        !kids.contains(&first_kid),
        "{first_kid} still published: {kids:?}"
    );
    assert!(kids.contains(&now_kid));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let answer = http
        .put(format!("{}/v1/objects/rot/x", gateway.url))
        .bearer_auth(&first_jwt)
        .body("retired")
        .send()
        .await
        .expect("put");
    assert_eq!(answer.status(), 401);
    let body: Value = answer.json().await.expect("json");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("unknown signing key"), "{body}");
    lease.release().await.expect("release");
}

/// A gateway started with a fresh cluster meets the first grant's token
/// before it has ever fetched the key: it must wait for a fresh JWKS, never
/// answer 401.
#[tokio::test]
async fn the_first_grant_of_a_fresh_cluster_is_never_refused() {
    let _serial = SERIAL.lock().await;
    let http = http_client();
    let mut unauthorized = Vec::new();
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster = Cluster::start(dir.path());
        let gateway = spawn_node(gateway_for(&cluster, &dir.path().join("gateway")));
        let client = sdk(&cluster, None);
        let grant = loop {
            match client
                .acquire_grant("first", "w", Duration::from_secs(5), None)
                .await
            {
                Ok(grant) => break grant,
                Err(palisade_client::Error::Unavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => panic!("round {round}: {err}"),
            }
        };
        let answer = http
            .put(format!("{}/v1/objects/first/x", gateway.url))
            .bearer_auth(&grant.jwt)
            .body("at once")
            .send()
            .await
            .expect("put");
        match answer.status().as_u16() {
            200 => {}
            401 => unauthorized.push(format!("round {round}: {:?}", answer.text().await)),
            other => panic!("round {round}: {other} {:?}", answer.text().await),
        }
    }
    assert!(unauthorized.is_empty(), "{unauthorized:?}");
}
