//! S5 on the wire: only authenticated members change Raft state. Each attack
//! from issue 11 is tried against a real three-node cluster — forged votes
//! (max term, leadership transfer), appends, snapshots and transfers — on the
//! client port (404), on the peer port without TLS, without a client
//! certificate, with another CA's certificate, with a certificate that is not
//! a node's, with a non-member's, and with a member's speaking for another.
//! Afterwards leader, term, membership, the lease table and the JWKS are
//! unchanged.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::{acquire, get_json, http_client, make_certs, Cluster};

const RAFT_PATHS: [&str; 7] = [
    "/raft/append",
    "/raft/beats",
    "/raft/vote",
    "/raft/pre-vote",
    "/raft/snapshot",
    "/raft/transfer-leader",
    "/raft/standing",
];

/// A vote for `node` with the highest term there is.
fn forged_vote(node: u64) -> Value {
    json!({
        "vote": {"leader_id": {"term": u64::MAX, "node_id": node}, "committed": true},
        "last_log_id": null,
        "leadership_transfer": true,
    })
}

/// An append from `node` carrying a membership that makes everyone a
/// learner of an attacker's node 9.
fn forged_append(node: u64) -> Value {
    json!({
        "vote": {"leader_id": {"term": u64::MAX, "node_id": node}, "committed": true},
        "prev_log_id": null,
        "entries": [{
            "log_id": {"leader_id": {"term": u64::MAX, "node_id": node}, "index": 1},
            "payload": {"Membership": {"configs": [[9]], "nodes": {"9": {"addr": "attacker:1"}}}}
        }],
        "leader_commit": null,
    })
}

/// `append` as the heartbeat batch of partition 0 alone (`/raft/beats`).
fn beats(append: Value) -> Value {
    json!([{"group": 0, "rpc": append}])
}

/// A peer client for `cluster`'s node `target`, presenting `identity`
/// (cert, key) and trusting `ca`.
fn peer_client(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    cluster: &Cluster,
    target: u64,
) -> reqwest::Client {
    let config = palisade_serve::tls::client_config(ca, identity).expect("client config");
    let addr = cluster.peer_addr(target).parse().expect("peer addr");
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .resolve(&palisade_serve::certs::node_name(target), addr)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

fn peer_url(cluster: &Cluster, target: u64, path: &str) -> String {
    let port = cluster.peer_ports[(target - 1) as usize];
    format!(
        "https://{}:{port}{path}",
        palisade_serve::certs::node_name(target)
    )
}

/// What must not change: per node (leader, term, members), the lease, the keys.
async fn observe(client: &reqwest::Client, cluster: &Cluster) -> Value {
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let view: Value = get_json(
            client,
            &format!("{}/v1/cluster", cluster.url(id)),
            "cluster",
        )
        .await;
        nodes.push(json!([view["leader"], view["term"], view["members"]]));
    }
    let leader = cluster.leader(client).await;
    let lease: Value = get_json(
        client,
        &format!("{}/v1/leases/kept", cluster.url(leader)),
        "lease",
    )
    .await;
    let jwks: Value = get_json(client, &format!("{}/v1/jwks", cluster.url(leader)), "jwks").await;
    json!({
        "nodes": nodes,
        "lease": [lease["holder"], lease["token"], lease["transitions"], lease["modify_index"]],
        "jwks": jwks,
    })
}

/// Clusters are heavy on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Observes until three observations in a row agree (every node sees the
/// same leader and term, the lease is readable): the baseline.
async fn settled(client: &reqwest::Client, cluster: &Cluster) -> Value {
    let mut last = Value::Null;
    let mut same = 0;
    for _ in 0..100 {
        let now = observe(client, cluster).await;
        let agreed = now["nodes"].as_array().is_some_and(|n| {
            n.iter()
                .all(|v| v[0] == n[0][0] && v[1] == n[0][1] && !v[0].is_null())
        });
        same = if agreed && now == last { same + 1 } else { 0 };
        if same == 2 {
            return now;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the cluster did not settle: {last}");
}

#[tokio::test]
async fn forged_raft_traffic_is_refused_and_changes_nothing() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let (status, grant) = acquire(&client, &cluster.url(leader), "kept", "owner", 3_600_000).await;
    assert_eq!(status, 200, "{grant}");
    let before = settled(&client, &cluster).await;

    // 1. The client port knows no Raft route.
    for id in 1..=3 {
        for path in RAFT_PATHS {
            let answer = client
                .post(format!("{}{path}", cluster.url(id)))
                .json(&forged_vote(id))
                .send()
                .await
                .expect("client port answers");
            assert_eq!(answer.status(), 404, "{path} on node {id}'s client port");
        }
    }

    let certs = dir.path().join("certs");
    let ca = certs.join("ca.pem");
    let foreign = dir.path().join("foreign");
    make_certs(&foreign);
    let file = |dir: &Path, name: &str| dir.join(name);
    for target in 1..=3 {
        // 2. Plain HTTP to the peer port.
        let plain = client
            .post(format!("http://{}/raft/vote", cluster.peer_addr(target)))
            .json(&forged_vote(target))
            .send()
            .await;
        assert!(
            plain.as_ref().map_or(true, |r| !r.status().is_success()),
            "plaintext admitted: {plain:?}"
        );
        // 3. TLS without a client certificate; 4. another CA's node certificate.
        let anonymous = peer_client(&ca, None, &cluster, target);
        let stranger = peer_client(
            &ca,
            Some((
                &file(&foreign, "node-1.pem"),
                &file(&foreign, "node-1-key.pem"),
            )),
            &cluster,
            target,
        );
        for refused in [anonymous, stranger] {
            for path in RAFT_PATHS {
                let answer = refused
                    .post(peer_url(&cluster, target, path))
                    .header("x-palisade-from", "1")
                    .json(&forged_vote(1))
                    .send()
                    .await;
                assert!(answer.is_err(), "handshake admitted on {path}: {answer:?}");
            }
        }
        // 5. The cluster's client certificate (not a node's) claiming node 1;
        // 6. node 4's certificate (same CA, not a member); 7. node 3's
        // certificate claiming to be another node, or voting for another.
        let as_client = peer_client(
            &ca,
            Some((&file(&certs, "client.pem"), &file(&certs, "client-key.pem"))),
            &cluster,
            target,
        );
        let as_node4 = peer_client(
            &ca,
            Some((&file(&certs, "node-4.pem"), &file(&certs, "node-4-key.pem"))),
            &cluster,
            target,
        );
        let as_node3 = peer_client(
            &ca,
            Some((&file(&certs, "node-3.pem"), &file(&certs, "node-3-key.pem"))),
            &cluster,
            target,
        );
        let attempts = [
            (&as_client, "1", forged_vote(1), "/raft/vote"),
            (&as_client, "1", forged_append(1), "/raft/append"),
            (&as_node4, "4", forged_vote(4), "/raft/vote"),
            (&as_node4, "4", forged_append(4), "/raft/append"),
            (&as_node4, "4", json!({}), "/forward/v1/leases/kept/release"),
            (&as_node4, "4", json!({}), "/raft/standing"),
            (&as_node3, "1", forged_vote(1), "/raft/vote"),
            (&as_node3, "3", forged_vote(1), "/raft/vote"),
            (&as_node3, "3", forged_vote(1), "/raft/pre-vote"),
            (&as_node3, "3", forged_append(1), "/raft/append"),
            (&as_node4, "4", beats(forged_append(4)), "/raft/beats"),
            (&as_node3, "3", beats(forged_append(1)), "/raft/beats"),
            (
                &as_node3,
                "3",
                json!({"from_leader": {"leader_id": {"term": u64::MAX, "node_id": 1}, "committed": true}, "to_node_id": 3, "last_log_id": null}),
                "/raft/transfer-leader",
            ),
        ];
        for (peer, from, body, path) in attempts {
            let answer = peer
                .post(peer_url(&cluster, target, path))
                .header("x-palisade-from", from)
                .json(&body)
                .send()
                .await
                .expect("a CA-signed certificate completes the handshake");
            assert_eq!(answer.status(), 403, "{path} as {from} on node {target}");
        }
    }

    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = observe(&client, &cluster).await;
    assert_eq!(before, after, "a forged RPC changed the cluster");
}

/// The signing key lives in the log and snapshots, the objects in the
/// gateway's store: no file or directory of a node's or the gateway's data
/// dir may be readable by group or others.
#[tokio::test]
async fn data_dirs_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let (status, grant) = acquire(&client, &cluster.url(leader), "k", "h", 5000).await;
    assert_eq!(status, 200);
    // The gateway's data dir holds every object: its owner's alone too.
    let gateway = support::spawn_gateway_for(&cluster, &dir.path().join("gateway"));
    let jwt = grant["jwt"].as_str().expect("jwt").to_owned();
    let written = support::send_retrying(|| {
        client
            .put(format!("{}/v1/objects/k/secret", gateway.url))
            .bearer_auth(&jwt)
            .body("payroll")
    })
    .await;
    assert_eq!(written.status(), 200);
    let mut checked = 0;
    let mut pending = vec![
        dir.path().join("node1"),
        dir.path().join("certs"),
        dir.path().join("gateway"),
    ];
    while let Some(path) = pending.pop() {
        let meta = std::fs::metadata(&path).expect("metadata");
        let mode = meta.permissions().mode() & 0o777;
        let secret = path.extension().is_none_or(|e| e != "pem")
            || path.to_string_lossy().ends_with("-key.pem");
        if secret {
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", path.display());
        }
        checked += 1;
        if meta.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(checked > 5, "only {checked} paths seen");
}
