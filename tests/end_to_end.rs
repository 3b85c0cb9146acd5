//! The whole promise, end to end with real processes: a 3-node election
//! cluster and a gateway that fetches the cluster's keys from `/v1/jwks`.
//! Holder A acquires and writes; A stops renewing (as if paused); its lease
//! expires; B acquires, raises the fence, writes; A's late write is refused
//! with 409 and changes nothing (S1).

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::{acquire, gateway_for, http_client, spawn_node, Cluster};

#[tokio::test]
async fn a_paused_leaders_late_write_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let gateway_dir = dir.path().join("gateway");
    let mut gateway = gateway_for(&cluster, &gateway_dir);
    // A generous leeway: the fence, not the clock, must refuse A.
    gateway.args = vec!["--exp-leeway-secs".into(), "30".into()];
    let gateway = spawn_node(gateway);
    let leader = cluster.leader(&client).await;
    let election = cluster.url(leader);

    let (status, a) = acquire(&client, &election, "orders", "A", 1000).await;
    assert_eq!(status, 200, "{a}");
    let put = |jwt: String, body: &'static str| {
        let client = client.clone();
        let url = format!("{}/v1/objects/orders/state", gateway.url);
        async move {
            let response = client
                .put(url)
                .bearer_auth(jwt)
                .body(body)
                .send()
                .await
                .expect("put");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    let a_jwt = a["jwt"].as_str().expect("jwt").to_owned();
    // The gateway may still be fetching the JWKS: retry 401s briefly.
    let mut first = (0, Value::Null);
    for _ in 0..50 {
        first = put(a_jwt.clone(), "from A").await;
        if first.0 != 401 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first.0, 200, "{}", first.1);

    // A stops renewing. B waits for the lease, then fences before writing.
    let b = loop {
        let (status, body) = acquire(&client, &election, "orders", "B", 5000).await;
        if status == 200 {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let b_jwt = b["jwt"].as_str().expect("jwt").to_owned();
    assert!(b["token"].as_u64() > a["token"].as_u64());
    let fenced = client
        .post(format!("{}/v1/fences/orders", gateway.url))
        .bearer_auth(&b_jwt)
        .send()
        .await
        .expect("fence");
    assert_eq!(fenced.status(), 200);
    let (status, body) = put(b_jwt, "from B").await;
    assert_eq!(status, 200, "{body}");

    // A wakes up and writes with its old token, which the gateway still
    // accepts as a signature: the fence refuses it.
    let (status, body) = put(a_jwt, "late A").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_token");
    assert_eq!(body["fence"], b["token"]);
    let stored = client
        .get(format!("{}/v1/objects/orders/state", gateway.url))
        .send()
        .await
        .expect("get");
    assert_eq!(
        stored.headers()["fencing-token"],
        b["token"].to_string().as_str()
    );
    assert_eq!(stored.text().await.expect("body"), "from B");
}
