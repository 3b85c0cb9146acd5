//! [`Group`]: one Raft group and everything that is its own — its Raft,
//! the path into its log, its applied table, its lessor, its signer and
//! token cache, its read rounds, its handoff and the lease rule its
//! renewals follow. The node ([`crate::api::state::ApiState`]) owns the
//! rest: settings, the peer dialer, incarnations, admission, waiters.
//!
//! A node runs one group per partition (`--partitions`, 1 by default).
//! Group 0's names on disk and on the wire are the ones every earlier
//! version used ([`GroupId::names`], in `group_id.rs`); group 0 also holds
//! the cluster's signing keys, which every group signs with. A lease
//! belongs to one group for ever ([`GroupId::of`]), and its fencing token
//! is that group's log index.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::error::ApiError;
use crate::group_id::GroupId;
use crate::leader::lessor::Lessor;
use crate::peer::settings::PeerSettings;
use crate::raft::applied::SharedState;
use crate::raft::lease::{self, Handoff, RaftFacts, Refusal, RenewLease};
use crate::raft::propose::Proposer;
use crate::raft::read_batcher::ReadBatcher;
use crate::raft::{Acting, NodeId, Raft};
use crate::signing::{Signer, TokenCache};

/// 503 from a leader that lost its quorum: openraft would refuse its
/// proposals, and the voters may be electing another leader already.
pub(crate) fn lapsed(since: Option<Duration>) -> ApiError {
    let since = since.map_or("this term".to_owned(), |d| format!("{} ms", d.as_millis()));
    ApiError::NoQuorum(format!(
        "this node was leader but no quorum has acknowledged it for {since}; \
         another node may be elected: retry (any node)"
    ))
}

/// One Raft group on this node and what is its own.
#[derive(Debug)]
pub struct Group {
    /// Which group: names its trees, snapshot and routes.
    pub id: GroupId,
    /// This group's Raft: metrics (who leads, the membership).
    pub raft: Arc<Raft>,
    /// Puts commands through the log (the same path the leader's duties use).
    pub proposer: Proposer,
    /// The applied lease table.
    pub applied: SharedState,
    /// Deadlines (meaningful on the leader only).
    pub lessor: Arc<Lessor>,
    /// Group 0's applied state, where the cluster's signing keys live (for
    /// group 0, its own `applied`).
    pub keys: SharedState,
    /// The signer built from the replicated key, once there is one (one
    /// cache for every group of the node).
    pub signer: Arc<Mutex<Option<Signer>>>,
    /// JWTs renewals answer again while they cover the renewed deadline.
    pub tokens: Arc<TokenCache>,
    /// Shares quorum confirmations between concurrent reads.
    pub reads: Arc<ReadBatcher>,
    /// Set before this node hands the group's leadership over (placement):
    /// renewals stop here for that term.
    pub handoff: Arc<Handoff>,
    /// When a renewal may be answered on the leader lease, by this node's
    /// own settings ([`crate::config::ElectionConfig::renew_lease`]);
    /// [`Group::renew_lease`] bounds it by every voter's.
    pub rule: RenewLease,
    /// The timing every peer announced (`peer/settings.rs`).
    pub settings: Arc<PeerSettings>,
}

impl Group {
    /// The signer of the replicated signing key (it follows rotations);
    /// [`ApiError::NotReady`] before the first leader has installed one.
    pub(crate) fn signer(&self) -> Result<Signer, ApiError> {
        let current = self
            .keys
            .read(|s| s.table.signing_key.as_ref().map(|k| k.kid.clone()))
            .ok_or(ApiError::NotReady)?;
        let mut cached = palisade_plumbing::sync::lock(&self.signer);
        if let Some(signer) = cached.as_ref().filter(|s| s.kid() == current) {
            return Ok(signer.clone());
        }
        let record = self
            .keys
            .read(|s| s.table.signing_key.clone())
            .ok_or(ApiError::NotReady)?;
        let signer = Signer::from_record(&record)
            .ok_or_else(|| ApiError::Internal("the replicated signing key is malformed".into()))?;
        *cached = Some(signer.clone());
        Ok(signer)
    }

    /// `(leader id, its address)` as this node knows it.
    pub(crate) fn leader(&self) -> Option<(NodeId, String)> {
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

    /// Whether this node leads the group, by its own metrics (a quorum
    /// confirmation is separate: [`Group::confirm_leadership`]).
    pub(crate) fn is_leader(&self) -> bool {
        crate::raft::leads(&self.raft.metrics().borrow_watched())
    }

    /// The rule renewals are judged by: this node's, inside the shortest
    /// vote lease any voter announced, less the margin the most drift any
    /// assumed asks of it.
    pub(crate) fn renew_lease(&self) -> RenewLease {
        self.settings.renew_lease(self.rule)
    }

    /// openraft's leader lease: `election_timeout_max`.
    pub(crate) fn leader_lease(&self) -> Duration {
        self.rule.first_ack
    }

    /// Whether this node acts as the group's leader now
    /// ([`crate::raft::acting`]).
    pub(crate) fn acting(&self) -> Acting {
        crate::raft::acting(&self.raft.metrics().borrow_watched(), self.leader_lease())
    }

    /// [`Group::acting`], but a leader whose lease lapsed less than its
    /// patience ([`crate::config::ElectionConfig::patience`]) ago waits until
    /// then for a quorum to acknowledge a heartbeat: a stall of the loaded
    /// machine (a follower's fsync, a busy core) is waited out, as the
    /// proposer and the read rounds wait it out; a leader cut off or deposed
    /// is refused once its followers can have elected another.
    pub(crate) async fn acting_now(&self) -> Acting {
        let lease = self.leader_lease();
        let acting = self.acting();
        let Acting::Lapsed { since } = acting else {
            return acting;
        };
        // No acknowledgement yet in this term (just elected, or cut off
        // since): one lease for the first, not the whole limit per call.
        let wait = match since {
            Some(since) => self.rule.patience.saturating_sub(since),
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

    /// Waits until this node may answer a renewal on its leader lease
    /// (`raft::lease`): at once while a quorum acknowledged an append sent
    /// less than the lease (less the margin) ago; after the next
    /// acknowledgement when the last is older; refused when it does not
    /// lead, hands leadership over, or no quorum answered it within its
    /// patience.
    pub(crate) async fn confirm_lease(&self) -> Result<(), ApiError> {
        let mut facts = RaftFacts::new(&self.raft, &self.handoff);
        lease::confirm(|| self.renew_lease(), &mut facts)
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
    pub(crate) async fn confirm_leadership(&self) -> Result<(), ApiError> {
        self.reads.confirm().await.map_err(ApiError::NoQuorum)
    }
}
