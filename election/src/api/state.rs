//! [`ApiState`]: what every handler of the client API shares.

use std::sync::{Arc, Mutex};

use openraft::async_runtime::WatchReceiver;

use palisade_serve::admission::Admission;

use crate::config::ElectionConfig;
use crate::error::ApiError;
use crate::leader::lessor::Lessor;
use crate::raft::applied::SharedState;
use crate::raft::lease::{self, Handoff, RaftFacts, Refusal};
use crate::raft::propose::Proposer;
use crate::raft::read_batcher::ReadBatcher;
use crate::raft::{Acting, NodeId, Raft};
use crate::signing::{Signer, TokenCache};

/// 503 from a leader that lost its quorum: openraft would refuse its
/// proposals, and the voters may be electing another leader already.
pub(in crate::api) fn lapsed(since: Option<std::time::Duration>) -> ApiError {
    let since = since.map_or("this term".to_owned(), |d| format!("{} ms", d.as_millis()));
    ApiError::NoQuorum(format!(
        "this node was leader but no quorum has acknowledged it for {since}; \
         another node may be elected: retry (any node)"
    ))
}

/// What every handler shares: one `Arc`, so the clone axum makes for every
/// handler and middleware of every request is one atomic increment (as a
/// struct of a dozen `Arc`s it was ~4% of a renewal's CPU in a profile).
#[derive(Debug, Clone)]
pub struct ApiState(Arc<ApiParts>);

impl ApiState {
    /// Shares `parts` with every handler.
    pub fn new(parts: ApiParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiParts;

    fn deref(&self) -> &ApiParts {
        &self.0
    }
}

/// The parts of [`ApiState`].
#[derive(Debug)]
pub struct ApiParts {
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
    pub forwarder: crate::peer::dialer::PeerDialer,
    /// The signer built from the replicated key, once there is one.
    pub signer: Arc<Mutex<Option<Signer>>>,
    /// JWTs renewals answer again while they cover the renewed deadline.
    pub jwts: Arc<TokenCache>,
    /// Shares quorum confirmations between concurrent reads.
    pub reads: Arc<ReadBatcher>,
    /// Set before this node hands leadership over (placement): renewals
    /// stop here for that term.
    pub handoff: Arc<Handoff>,
    /// The gateway the status page reads (`--ui-gateway`), its client built
    /// once.
    pub ui_gateway: Option<super::ui::gateway::GatewayReader>,
    /// The status page's sign-ins on this node (`ui/sessions.rs`).
    pub sessions: Arc<super::ui::sessions::Sessions>,
    /// What the status page plots (`ui/series.rs`).
    pub series: Arc<crate::series::Series>,
    /// Peers' incarnations (membership changes forget removed nodes').
    pub incarnations: Arc<crate::peer::incarnation::Incarnations>,
    /// Permits for blocking calls (waiting acquires, watches): the cap.
    pub waiters: Arc<tokio::sync::Semaphore>,
    /// Request seats per flow on the client API (`api/admit.rs`).
    pub admission: Admission,
    /// Seats per flow on the forwarding connection to the leader (its
    /// HTTP/2 streams), so no flow takes them all.
    pub forwarding: Admission,
}

impl ApiState {
    /// Blocking calls (waiting acquires, watches) waiting on this node now.
    pub(super) fn waiting(&self) -> u64 {
        (self.config.max_waiters - self.waiters.available_permits()) as u64
    }

    /// The signer of the replicated signing key (it follows rotations);
    /// [`ApiError::NotReady`] before the first leader has installed one.
    pub(super) fn signer(&self) -> Result<Signer, ApiError> {
        let current = self
            .shared
            .read(|s| s.table.signing_key.as_ref().map(|k| k.kid.clone()))
            .ok_or(ApiError::NotReady)?;
        let mut cached = palisade_names::sync::lock(&self.signer);
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
        crate::raft::leads(&self.raft.metrics().borrow_watched())
    }

    /// openraft's leader lease: `election_timeout_max`.
    pub(super) fn leader_lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.raft_election_timeout().1)
    }

    /// Whether this node acts as the leader now ([`crate::raft::acting`]).
    pub(super) fn acting(&self) -> Acting {
        crate::raft::acting(&self.raft.metrics().borrow_watched(), self.leader_lease())
    }

    /// [`ApiState::acting`], but a leader whose lease lapsed less than
    /// its patience ([`ElectionConfig::patience`]) ago waits until then for a quorum to acknowledge a
    /// heartbeat: a stall of the loaded machine (a follower's fsync, a busy
    /// core) is waited out, as the proposer and the read rounds wait it
    /// out; a leader cut off or deposed is refused once its followers can
    /// have elected another.
    pub(super) async fn acting_now(&self) -> Acting {
        let lease = self.leader_lease();
        let acting = self.acting();
        let Acting::Lapsed { since } = acting else {
            return acting;
        };
        // No acknowledgement yet in this term (just elected, or cut off
        // since): one lease for the first, not the whole limit per call.
        let wait = match since {
            Some(since) => self.config.patience().saturating_sub(since),
            None => lease,
        };
        if wait.is_zero() {
            return acting;
        }
        let settled = |m: &openraft::RaftMetrics<crate::raft::TypeConfig>| {
            !matches!(crate::raft::acting(m, lease), Acting::Lapsed { .. })
        };
        match self
            .raft
            .wait(Some(wait))
            .metrics(settled, "a quorum's ack")
            .await
        {
            Ok(metrics) => crate::raft::acting(&metrics, lease),
            Err(_) => self.acting(),
        }
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

    /// Waits until this node may answer a renewal on its leader lease
    /// (`raft::lease`): at once while a quorum acknowledged an append sent
    /// less than the lease (less the margin) ago; after the next
    /// acknowledgement when the last is older; refused when it does not
    /// lead, hands leadership over, or no quorum answered it within its
    /// patience.
    pub(super) async fn confirm_lease(&self) -> Result<(), ApiError> {
        let rule = self.config.renew_lease();
        let mut facts = RaftFacts::new(&self.raft, &self.handoff);
        lease::confirm(&rule, &mut facts)
            .await
            .map_err(|refusal| match refusal {
                Refusal::Follows => ApiError::NoQuorum(
                    "this node does not lead: renew at the leader (any node forwards)".into(),
                ),
                Refusal::HandingOff { to } => ApiError::NoQuorum(format!(
                    "this node is handing leadership to node {to}: renew there"
                )),
                Refusal::Lapsed { since } => lapsed(since),
            })
    }

    /// Confirms with a quorum that this node still leads and that its state
    /// machine has applied everything committed before now. Concurrent callers
    /// share rounds ([`ReadBatcher`]).
    pub(super) async fn confirm_leadership(&self) -> Result<(), ApiError> {
        self.reads.confirm().await.map_err(ApiError::NoQuorum)
    }
}
