//! Keeping every node's knowledge of its peers' incarnations complete:
//! meeting every member early, and forgetting members that left.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::dialer::PeerDialer;
use super::incarnation::Incarnations;
use super::settings::PeerSettings;
use crate::raft::{NodeId, Raft};

/// Learns every member's incarnation as soon as both are up, by calling
/// each member it has not met (an authenticated `POST /raft/standing`:
/// the request teaches the peer this node's incarnation, the answer teaches
/// this node the peer's). Raft alone never makes two followers talk, and a
/// follower that never met another could not tell that one came back
/// without its data. Every 100 ms for the first 10 s, then every 2 s;
/// nothing is sent once every member is known.
pub async fn acquaint_peers(
    raft: Arc<Raft>,
    dialer: PeerDialer,
    incarnations: Arc<Incarnations>,
    me: NodeId,
) {
    let started = tokio::time::Instant::now();
    loop {
        let pause = if started.elapsed() < Duration::from_secs(10) {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        tokio::time::sleep(pause).await;
        let metrics = raft.metrics().borrow_watched().clone();
        let strangers: Vec<(NodeId, String)> = metrics
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != me && !incarnations.knows(**id))
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect();
        dialer
            .standings(&strangers, Duration::from_millis(500))
            .await;
    }
}

/// Forgets the incarnations and settings of nodes that left the
/// membership, so a node removed and added back (with a fresh data dir) is
/// learned afresh, and a removed node's timing no longer bounds the leader
/// lease.
pub async fn forget_removed_nodes(
    raft: Arc<Raft>,
    (incarnations, settings): (Arc<Incarnations>, Arc<PeerSettings>),
) {
    let mut membership = raft.metrics();
    loop {
        let members: Vec<NodeId> = membership
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        if !members.is_empty() {
            incarnations.forget_all_but(&members);
            settings.forget_all_but(&members);
        }
        if membership.changed().await.is_err() {
            return;
        }
    }
}
