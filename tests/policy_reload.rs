//! A policy change without a restart, on real processes: a 3-node cluster
//! over TLS and a gateway, both with the policy file `Access` writes. A
//! principal added to the file is refused (401) until the servers get
//! SIGHUP, then served (through a follower as soon as that follower has
//! reloaded: a forwarded call is authorized once, where it came in); a
//! principal removed is refused after it; a file that does not parse
//! changes nothing.

use crate::support;

use std::path::Path;
use std::time::Duration;

use palisade_serve::policy::{add, Rules};
use support::{node_setup, spawn_node, Access, Cluster};

fn setups(dir: &Path) -> Vec<palisade_local_cluster::NodeSetup> {
    (1..=3).map(|id| node_setup(dir, id, "127.0.0.1")).collect()
}

fn hang_up(pids: &[u32]) {
    for pid in pids {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -HUP {pid}");
    }
}

/// The statuses `principal` gets from every node (a lease read) and the
/// gateway (a fence read).
async fn statuses(access: &Access, cluster: &Cluster, gateway: &str, principal: &str) -> Vec<u16> {
    let client = access.http(principal);
    let mut urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| format!("{u}/v1/leases?prefix=orders."))
        .collect();
    urls.push(format!("{gateway}/v1/fences/orders.x"));
    let mut statuses = Vec::new();
    for url in urls {
        let answer = client.get(&url).send().await.expect("request");
        statuses.push(answer.status().as_u16());
    }
    statuses
}

/// Polls (bounded) until `principal` gets `want` everywhere.
async fn until_everywhere(
    access: &Access,
    cluster: &Cluster,
    gateway: &str,
    principal: &str,
    want: u16,
) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = statuses(access, cluster, gateway, principal).await;
        if seen.iter().all(|s| *s == want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy_and_a_broken_file_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, access) = Cluster::start_secure(dir.path(), setups(dir.path()));
    cluster.leader(&access.http("admin")).await;
    let gateway = spawn_node(access.gateway_for(&cluster, &dir.path().join("gateway")));
    let mut pids: Vec<u32> = (1..=3)
        .filter_map(|id| cluster.node(id).map(|n| n.pid()))
        .collect();
    pids.push(gateway.node.pid());
    let url = gateway.url.clone();
    let all = |status: u16| vec![status; 4];

    // A principal added to the file: unknown until the servers hang up.
    let rules = Rules {
        read: vec!["orders.".into()],
        ..Rules::default()
    };
    add(&access.keys, "late", &rules).expect("add late");
    let policy = access.policy.clone();
    assert_eq!(statuses(&access, &cluster, &url, "late").await, all(401));
    // A forwarded call is authorized once, where it came in: with every
    // server but the leader reloaded, `late`'s list (the leader's, which a
    // follower forwards) is served through the followers, though the
    // leader does not know `late` yet, and refused at the leader.
    let leader = cluster.settled_leader(&access.http("admin")).await;
    let leader_pid = cluster.node(leader).map(|n| n.pid()).expect("leader pid");
    let others: Vec<u32> = pids.iter().copied().filter(|p| *p != leader_pid).collect();
    hang_up(&others);
    let want: Vec<u16> = (1..=3u64)
        .map(|id| if id == leader { 401 } else { 200 })
        .chain([200])
        .collect();
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = statuses(&access, &cluster, &url, "late").await;
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen, want,
        "late with all but the leader (node {leader}) reloaded"
    );
    hang_up(&[leader_pid]);
    let seen = until_everywhere(&access, &cluster, &url, "late", 200).await;
    assert_eq!(seen, all(200), "late after SIGHUP");

    // A principal removed: refused after the next SIGHUP.
    assert_eq!(
        statuses(&access, &cluster, &url, "intruder").await,
        all(200)
    );
    let mut document: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&policy).expect("read")).expect("json");
    document["principals"]
        .as_object_mut()
        .expect("principals")
        .remove("intruder");
    std::fs::write(&policy, serde_json::to_vec_pretty(&document).expect("json")).expect("write");
    hang_up(&pids);
    let seen = until_everywhere(&access, &cluster, &url, "intruder", 401).await;
    assert_eq!(seen, all(401), "intruder after SIGHUP");

    // A broken file: the policy in force stays (late in, intruder out).
    std::fs::write(&policy, "{\"principals\": ").expect("break");
    hang_up(&pids);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(statuses(&access, &cluster, &url, "late").await, all(200));
    assert_eq!(
        statuses(&access, &cluster, &url, "intruder").await,
        all(401)
    );
}
