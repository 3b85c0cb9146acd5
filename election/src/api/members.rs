//! Membership changes: `POST /v1/cluster/members` and
//! `DELETE /v1/cluster/members/{id}`. Every voter votes in every partition,
//! so a change applies to every group: the partitions other than 0 first
//! (each by its own leader: this node when it leads the partition, else
//! asked with `?partition=k`), then group 0, whose membership the node's
//! own calls read. A change for one partition (`?partition=k`) is
//! idempotent, so a change that failed part way is retried whole: the
//! partitions that already have it answer as if they had made it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use http::Method;
use openraft::alias::StoredMembershipOf;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use palisade_serve::policy::Principal;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admit::Flow;
use super::extract::{Checked, CheckedJson};
use super::forward::ask_leader;
use super::partitions::{partition_of, Caller};
use super::schema::ClusterChangeErrors;
use super::state::ApiState;
use crate::config::ElectionConfig;
use crate::error::ApiError;
use crate::group::Group;
use crate::raft::{Acting, NodeId, TypeConfig};

/// `POST /v1/cluster/members`: a node to add.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AddMember {
    id: NodeId,
    /// Its peer address, `host:port`.
    addr: String,
    /// How long it may take to catch up as a learner before the change is
    /// given up (it is then removed again): 1 ms .. 600 000 ms, default
    /// 60 000.
    #[serde(default)]
    wait_ms: Option<u64>,
}

impl Checked for AddMember {
    fn check(&self, _config: &ElectionConfig) -> Result<(), ApiError> {
        if self.id == 0 {
            return Err(ApiError::BadRequest("node ids start at 1".into()));
        }
        if matches!(self.wait_ms, Some(0) | Some(600_001..)) {
            return Err(ApiError::BadRequest("wait_ms must be 1 .. 600000".into()));
        }
        crate::config::parse_peers(&format!("{}={}", self.id, self.addr))
            .map(|_| ())
            .map_err(ApiError::BadRequest)
    }
}

/// How long adding a node waits for it to catch up as a learner, unless
/// the call says.
const CATCH_UP: Duration = Duration::from_secs(60);

/// `add_learner` may wait for the learner to catch up, longer than a
/// proposal's timeout: it runs on its own, and only a fresh leader's
/// refusal is retried (within the quorum timeout).
async fn learner_with_retries<F, Fut>(state: &ApiState, attempt: F) -> Result<(), ApiError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<
        Output = Result<
            openraft::raft::ClientWriteResponse<TypeConfig>,
            RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
        >,
    >,
{
    let deadline = tokio::time::Instant::now() + state.config.quorum_timeout;
    loop {
        match attempt().await {
            Ok(_) => return Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))
                if forward.leader_id.is_none() && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                return Err(ApiError::NoQuorum(
                    "leadership moved during the change; retry".into(),
                ))
            }
            Err(RaftError::APIError(err)) => return Err(ApiError::Conflict(err.to_string())),
            Err(RaftError::Fatal(err)) => return Err(ApiError::Internal(err.to_string())),
        }
    }
}

/// `group`'s membership as this node has it.
/// The ids of the cluster's members (voters and learners, group 0's view).
fn member_ids(state: &ApiState) -> Vec<NodeId> {
    membership_of(state.group_zero())
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .collect()
}

fn membership_of(group: &Group) -> Arc<StoredMembershipOf<TypeConfig>> {
    group
        .raft
        .metrics()
        .borrow_watched()
        .membership_config
        .clone()
}

fn voters(group: &Group) -> Vec<NodeId> {
    membership_of(group).membership().voter_ids().collect()
}

/// Who a change is made for, as its parts elsewhere carry it.
fn caller(principal: Option<Extension<Principal>>, flow: Option<Extension<Flow>>) -> Caller {
    Caller {
        principal: principal.map(|Extension(p)| p),
        flow: flow.map(|Extension(f)| f),
    }
}

/// A membership change, as each partition makes it.
#[derive(Debug, Clone, Copy)]
enum Change<'a> {
    Add(&'a AddMember),
    Remove(NodeId),
}

impl Change<'_> {
    /// Makes the change in `group` (this node leads it), unless it is
    /// made there already.
    async fn make(self, state: &ApiState, group: &Group) -> Result<(), ApiError> {
        match self {
            Change::Add(body) if voters(group).contains(&body.id) => Ok(()),
            Change::Add(body) => add_to(state, group, body).await,
            Change::Remove(id) => match remove_from(group, id).await {
                Err(ApiError::NotFound(_)) => Ok(()),
                done => done,
            },
        }
    }

    /// The call that asks a partition's leader for it.
    fn request(self) -> Result<(Method, String, Option<Vec<u8>>), ApiError> {
        Ok(match self {
            Change::Add(body) => {
                let json = json!({ "id": body.id, "addr": body.addr, "wait_ms": body.wait_ms });
                let bytes = serde_json::to_vec(&json)
                    .map_err(|e| ApiError::Internal(format!("a member to add: {e}")))?;
                (Method::POST, "/v1/cluster/members".into(), Some(bytes))
            }
            Change::Remove(id) => (Method::DELETE, format!("/v1/cluster/members/{id}"), None),
        })
    }
}

/// Makes `change` in every partition but 0 at once, each by its leader
/// (this node, or asked for that partition alone); the caller then makes
/// it in group 0.
async fn in_other_partitions(
    state: &ApiState,
    caller: &Caller,
    change: Change<'_>,
) -> Result<(), ApiError> {
    let (method, path, body) = change.request()?;
    let others = state.groups().iter().skip(1).map(|group| {
        let (method, path, body) = (method.clone(), path.as_str(), body.clone());
        async move {
            let done = if group.acting() == Acting::Leads {
                change.make(state, group).await
            } else {
                ask_leader(state, group, caller, (method, path), (body, None))
                    .await
                    .map(|_| ())
            };
            done.map_err(|err| {
                ApiError::NoQuorum(format!(
                    "partition {} did not take the change ({err}); the partitions may \
                     differ until the same change is made again",
                    group.id
                ))
            })
        }
    });
    futures::future::try_join_all(others).await.map(|_| ())
}

/// Adds a node: first as a learner, which must catch up (acknowledge the
/// leader's whole log as it was when it was added) within `wait_ms`, then
/// as a voter. A learner that does not (unreachable: a typo, a node not
/// started) is removed again and the answer says why: the voters never
/// change for a node that cannot vote. (openraft's own blocking
/// `add_learner` counts a learner as caught up while the leader's log is
/// shorter than its `replication_lag_threshold`, 5 000 entries: on a young
/// cluster an unreachable node passed at once and became a voter.) A node
/// that lost its data joins this way under its old id after `remove`: its
/// new incarnation is learned afresh. With partitions, in every one.
#[utoipa::path(post, path = "/v1/cluster/members", tag = "cluster", request_body = AddMember,
    responses(ClusterChangeErrors, (status = 200, body = Object, description = "The node, now a voter")))]
pub(super) async fn add_member(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    flow: Option<Extension<Flow>>,
    uri: http::Uri,
    CheckedJson(body): CheckedJson<AddMember>,
) -> Result<Json<Value>, ApiError> {
    let added = json!({ "id": body.id, "addr": body.addr, "voter": true });
    if let Some(id) = partition_of(&state, &uri)? {
        // Checked here too: a caller may add a node partition by partition.
        let body = runs_as_many_partitions(&state, body).await?;
        Change::Add(&body).make(&state, state.group_of(id)).await?;
        return Ok(Json(added));
    }
    if voters(state.group_zero()).contains(&body.id) {
        return Err(ApiError::Conflict(format!(
            "node {} is already a voter; remove it first to replace it",
            body.id
        )));
    }
    let body = runs_as_many_partitions(&state, body).await?;
    in_other_partitions(&state, &caller(principal, flow), Change::Add(&body)).await?;
    add_to(&state, state.group_zero(), &body).await?;
    tracing::info!(id = body.id, addr = %body.addr, "added a voter");
    Ok(Json(added))
}

/// The node to add must run as many partitions as the cluster: with
/// another count it would hash a lease to another partition than every
/// other node, and two partitions could grant it at once. It is asked
/// (`POST /raft/standing`) until it answers or the change's wait ends (it
/// may be added before it is started); a node from before partitions
/// counts as one. Nothing changes when it differs. What the change may
/// still wait (to catch up) is what is left of its `wait_ms`: the body
/// with that wait.
async fn runs_as_many_partitions(state: &ApiState, body: AddMember) -> Result<AddMember, ApiError> {
    let deadline =
        tokio::time::Instant::now() + body.wait_ms.map_or(CATCH_UP, Duration::from_millis);
    let peer = [(body.id, body.addr.clone())];
    let ask = state.config.quorum_timeout.min(Duration::from_secs(1));
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let answer = state.dialer.standings(&peer, ask.min(left)).await.remove(0);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match answer {
            Ok(standing) if standing.partitions == state.partitions() => {
                let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
                return Ok(AddMember {
                    wait_ms: Some(left),
                    ..body
                });
            }
            Ok(standing) => {
                // Asking taught this node its incarnation; a node refused
                // is no member, and may come back with a fresh data dir.
                let members = member_ids(state);
                state.incarnations.forget_all_but(&members);
                // Nor do its settings bound or trouble this node.
                state.settings.forget_all_but(&members);
                return Err(ApiError::Conflict(format!(
                    "node {} at {} runs {} partition(s) and this cluster {}; start it with \
                     --partitions {} (on an empty data dir) and add it again",
                    body.id,
                    body.addr,
                    standing.partitions,
                    state.partitions(),
                    state.partitions()
                )));
            }
            Err(why) if left.is_zero() => {
                state.settings.forget_all_but(&member_ids(state));
                return Err(ApiError::NotCaughtUp(format!(
                    "node {} at {} never answered within the change's wait ({why}): is it \
                     started, and is the address right? Nothing changed: the voters are \
                     unchanged",
                    body.id, body.addr
                )));
            }
            Err(_) => tokio::time::sleep(left.min(Duration::from_millis(200))).await,
        }
    }
}

/// [`add_member`] in one group, which this node leads.
async fn add_to(state: &ApiState, group: &Group, body: &AddMember) -> Result<(), ApiError> {
    let known = membership_of(group)
        .membership()
        .get_node(&body.id)
        .map(|node| node.addr.clone());
    if let Some(addr) = known.filter(|addr| *addr != body.addr) {
        // openraft keeps a member's first address: adding it again
        // elsewhere would wait on the old one.
        return Err(ApiError::Conflict(format!(
            "node {} is already a learner at {addr}; remove it first to add it at {}",
            body.id, body.addr
        )));
    }
    let wait = body.wait_ms.map_or(CATCH_UP, Duration::from_millis);
    let deadline = tokio::time::Instant::now() + wait;
    let node = BasicNode {
        addr: body.addr.clone(),
    };
    let learner = || group.raft.add_learner(body.id, node.clone(), false);
    learner_with_retries(state, learner).await?;
    if let Err(why) = caught_up(group, body.id, deadline).await {
        let removed = group
            .proposer
            .write(|| {
                group
                    .raft
                    .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([body.id])), false)
            })
            .await;
        let after = match removed {
            Ok(_) => "it was removed again; the voters are unchanged".to_owned(),
            Err(err) => format!(
                "removing it again failed ({err}): it may stay a learner; the voters are unchanged"
            ),
        };
        tracing::warn!(id = body.id, addr = %body.addr, %why, "a node to add did not catch up");
        return Err(ApiError::NotCaughtUp(format!(
            "node {} at {} did not catch up within {} ms: {why}; {after}",
            body.id,
            body.addr,
            wait.as_millis()
        )));
    }
    let voter = BTreeSet::from([body.id]);
    group
        .proposer
        .write(|| {
            group
                .raft
                .change_membership(ChangeMembers::AddVoterIds(voter.clone()), false)
        })
        .await?;
    Ok(())
}

/// Waits until learner `id` has acknowledged the leader's log up to its last
/// index as it is now (by the leader's replication metrics), or `deadline`:
/// then why not.
async fn caught_up(
    group: &Group,
    id: NodeId,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    let target = group.raft.metrics().borrow_watched().last_log_index;
    let matched = |m: &openraft::RaftMetrics<TypeConfig>| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned())
            .flatten()
            .map(|log_id| log_id.index)
    };
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    let done = group
        .raft
        .wait(Some(wait))
        .metrics(
            |m| crate::raft::leads(m) && matched(m) >= target,
            "the learner to catch up",
        )
        .await;
    if done.is_ok() {
        return Ok(());
    }
    let now = group.raft.metrics().borrow_watched().clone();
    Err(if !crate::raft::leads(&now) {
        "this node stopped leading during the change; retry".to_owned()
    } else {
        match matched(&now) {
            None => "it never acknowledged an append (is it started, and is the address right?)"
                .to_owned(),
            Some(index) => format!(
                "it acknowledged the log up to {index} of {}",
                target.unwrap_or(0)
            ),
        }
    })
}

/// `DELETE /v1/cluster/members/{id}`: removes a node from the membership
/// (a voter or a learner), in every partition. The last voter is never
/// removed.
#[utoipa::path(delete, path = "/v1/cluster/members/{id}", tag = "cluster",
    params(("id" = u64, Path, description = "The node id")),
    responses(ClusterChangeErrors, (status = 200, body = Object, description = "The node removed")))]
pub(super) async fn remove_member(
    State(state): State<ApiState>,
    principal: Option<Extension<Principal>>,
    flow: Option<Extension<Flow>>,
    uri: http::Uri,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id: NodeId = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("{id:?} is not a node id")))?;
    let removed = json!({ "id": id, "removed": true });
    if let Some(partition) = partition_of(&state, &uri)? {
        Change::Remove(id)
            .make(&state, state.group_of(partition))
            .await?;
        return Ok(Json(removed));
    }
    // Refused before any partition changes: not a member, or the last voter.
    check_removal(state.group_zero(), id)?;
    in_other_partitions(&state, &caller(principal, flow), Change::Remove(id)).await?;
    remove_from(state.group_zero(), id).await?;
    tracing::info!(id, "removed a member");
    Ok(Json(removed))
}

/// The change that removes `id` from `group`: 404 when it is not a member,
/// 409 when it is the last voter.
fn check_removal(group: &Group, id: NodeId) -> Result<ChangeMembers<NodeId, BasicNode>, ApiError> {
    let stored = membership_of(group);
    let membership = stored.membership();
    if !membership.nodes().any(|(member, _)| *member == id) {
        return Err(ApiError::NotFound(format!("node {id} is not a member")));
    }
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    if !voters.contains(&id) {
        return Ok(ChangeMembers::RemoveNodes(BTreeSet::from([id])));
    }
    if voters.len() == 1 {
        return Err(ApiError::Conflict(format!(
            "node {id} is the last voter; the cluster would have none"
        )));
    }
    Ok(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
}

/// Removes `id` from `group`, which this node leads.
async fn remove_from(group: &Group, id: NodeId) -> Result<(), ApiError> {
    let change = check_removal(group, id)?;
    group
        .proposer
        .write(|| group.raft.change_membership(change.clone(), false))
        .await?;
    Ok(())
}
