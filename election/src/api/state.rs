//! [`ApiState`]: what every handler of the client API shares.

use std::sync::{Arc, Mutex};

use openraft::async_runtime::WatchReceiver;

use crate::error::ApiError;
use crate::lessor::Lessor;
use crate::propose::Proposer;
use crate::read_batcher::ReadBatcher;
use crate::signing::{Signer, TokenCache};
use crate::state_machine::SharedState;
use crate::{ElectionConfig, NodeId, Raft};

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// This node's Raft: metrics (who leads, the membership).
    pub raft: Arc<Raft>,
    /// Puts commands through the log (the same path the leader's duties use).
    pub proposer: Proposer,
    /// The applied lease table.
    pub shared: SharedState,
    /// Deadlines (meaningful on the leader only).
    pub lessor: Arc<Lessor>,
    /// This node's settings.
    pub config: Arc<ElectionConfig>,
    /// Forwards requests to the leader, over the peer channel.
    pub forwarder: crate::network::PeerDialer,
    /// The signer built from the replicated key, once there is one.
    pub signer: Arc<Mutex<Option<Signer>>>,
    /// JWTs renewals answer again while they cover the renewed deadline.
    pub jwts: Arc<TokenCache>,
    /// Shares quorum confirmations between concurrent renewals and reads.
    pub reads: Arc<ReadBatcher>,
    /// Peers' incarnations (membership changes forget removed nodes').
    pub incarnations: Arc<crate::incarnation::Incarnations>,
    /// Permits for blocking calls (waiting acquires, watches): the cap.
    pub waiters: Arc<tokio::sync::Semaphore>,
}

impl ApiState {
    /// The signer of the replicated signing key (it follows rotations);
    /// [`ApiError::NotReady`] before the first leader has installed one.
    pub(super) fn signer(&self) -> Result<Signer, ApiError> {
        let current = self
            .shared
            .read(|s| s.table.signing_key.as_ref().map(|k| k.kid.clone()))
            .ok_or(ApiError::NotReady)?;
        let mut cached = self
            .signer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(signer) = cached.as_ref().filter(|s| s.kid() == current) {
            return Ok(signer.clone());
        }
        let record = self
            .shared
            .read(|s| s.table.signing_key.clone())
            .ok_or(ApiError::NotReady)?;
        let signer = Signer::from_record(&record)
            .ok_or_else(|| ApiError::Internal("the replicated signing key is malformed".into()))?;
        *cached = Some(signer.clone());
        Ok(signer)
    }

    /// `(leader id, its address)` as this node knows it.
    pub(super) fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let leader = metrics.current_leader?;
        let addr = metrics
            .membership_config
            .membership()
            .nodes()
            .find(|(id, _)| **id == leader)
            .map(|(_, node)| node.addr.clone())?;
        Some((leader, addr))
    }

    /// Whether this node is the leader, by its own metrics (a quorum
    /// confirmation is separate: [`ApiState::confirm_leadership`]).
    pub(super) fn is_leader(&self) -> bool {
        crate::leads(&self.raft.metrics().borrow_watched())
    }

    /// A permit to wait, or 429 when `max_waiters` calls already wait here.
    pub(super) fn waiter(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.waiters.clone().try_acquire_owned().map_err(|_| {
            ApiError::TooManyWaiters(format!(
                "{} calls already wait on this node; retry later",
                self.config.max_waiters
            ))
        })
    }

    /// Confirms with a quorum that this node still leads and that its state
    /// machine has applied everything committed before now. Concurrent callers
    /// share rounds ([`ReadBatcher`]).
    pub(super) async fn confirm_leadership(&self) -> Result<(), ApiError> {
        self.reads.confirm().await.map_err(ApiError::NoQuorum)
    }
}
