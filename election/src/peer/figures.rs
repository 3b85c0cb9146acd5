//! [`Figures`]: what a node tells a peer that asks for the status page —
//! its view of Raft and its last 15 minutes of samples — so whichever node
//! serves the page shows every member (reachable or not, how far behind)
//! and the whole cluster's figures (`api/ui/cluster.rs` puts them
//! together). Asked over the peer listener (`POST /raft/figures`), behind
//! the same gate as Raft's RPCs.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};

use super::dialer::PeerDialer;
use crate::raft::{NodeId, Raft};
use crate::series::{Sample, Series};

/// One node's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Its id.
    pub node: NodeId,
    /// Its Raft role as openraft names it (`Leader`, `Follower`, ...).
    pub role: String,
    /// Its term.
    pub term: u64,
    /// Who it takes for the leader.
    pub leader: Option<NodeId>,
    /// The last log index it applied.
    pub applied_index: u64,
    /// The last log index it knows committed.
    pub commit_index: u64,
    /// Its clock when it answered, ms since the Unix epoch.
    pub at_ms: u64,
    /// Its samples, oldest first.
    pub samples: Vec<Sample>,
}

impl Figures {
    /// This node's figures now.
    pub fn of(raft: &Raft, series: &Series) -> Self {
        let metrics = raft.metrics().borrow_watched().clone();
        Self {
            node: metrics.id,
            role: format!("{:?}", metrics.state),
            term: metrics.current_term,
            leader: metrics.current_leader,
            applied_index: metrics.last_applied.as_ref().map_or(0, |id| id.index),
            commit_index: metrics.cluster_committed.as_ref().map_or(0, |id| id.index),
            at_ms: crate::signing::unix_ms(),
            samples: series.samples(),
        }
    }
}

/// What the peer listener answers `POST /raft/figures` with.
pub type FiguresSource = Arc<dyn Fn() -> Figures + Send + Sync>;

impl PeerDialer {
    /// Asks each of `peers` (id, peer address) for its [`Figures`] at once,
    /// waiting at most `timeout`; the answers in the same order (an `Err`
    /// says why there is none).
    pub async fn figures(
        &self,
        peers: &[(NodeId, String)],
        timeout: Duration,
    ) -> Vec<Result<Figures, String>> {
        futures::future::join_all(peers.iter().map(|(id, addr)| async move {
            let response = self
                .request(reqwest::Method::POST, *id, addr, "/raft/figures")
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| short(&e))?;
            if !response.status().is_success() {
                return Err(format!("answered {}", response.status()));
            }
            self.answer_is_trusted(*id, &response)?;
            response.json().await.map_err(|e| short(&e))
        }))
        .await
    }
}

/// A transport error in a few words, for a table cell.
fn short(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        "no answer in time".to_owned()
    } else if err.is_connect() {
        "refused or unreachable".to_owned()
    } else {
        err.to_string()
    }
}
