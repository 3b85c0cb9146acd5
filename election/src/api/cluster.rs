//! What any node answers from its own state: the cluster view, the JWKS and
//! the health check.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::Instant as _;
use openraft::{BasicNode, ChangeMembers};
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::{Checked, CheckedJson};
use super::schema::ClusterChangeErrors;
use super::state::ApiState;
use crate::config::ElectionConfig;
use crate::error::ApiError;
use crate::error::ErrorBody;
use crate::lease_table::command::{Command, KeySecret};
use crate::raft::{Acting, NodeId, TypeConfig};
use crate::signing::{generate_key, Signer};

/// `GET /v1/cluster`: this node's view of the cluster (Raft metrics).
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses((status = 200, body = Object, description = "This node's view: node_id, priority, never_lead, election_timeout_ms (the range openraft draws from; one value with --timing-seed), state (openraft's), leading (this node acts as leader: it leads and a quorum acknowledged it within the leader lease), not_leading_reason (set when state is Leader but leading is false), leader (null on a leader whose lease lapsed), term, members (id, addr, voter), replication (on the leader, per member: id, matched_index, last_ack_ms; null elsewhere), last_log_index, commit_index, applied_index, snapshot_index, purged_index"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub(super) async fn cluster(State(state): State<ApiState>) -> Json<Value> {
    let metrics = state.group_zero().raft.metrics().borrow_watched().clone();
    let acting = crate::raft::acting(&metrics, state.group_zero().leader_lease());
    // A leader whose lease lapsed names no leader: it may not act as one,
    // and another may be elected already.
    let (leader, reason) = match acting {
        Acting::Lapsed { since } => (
            None,
            Some(format!(
                "Raft state Leader, but no quorum acknowledged it for {}: not acting as leader",
                since.map_or("this term".to_owned(), |d| format!("{} ms", d.as_millis()))
            )),
        ),
        _ => (metrics.current_leader, None),
    };
    let members = members(&metrics);
    let replication = replication(&metrics);
    Json(json!({
        "node_id": state.config.id,
        "priority": state.config.placement.priority,
        "never_lead": state.config.never_lead,
        "election_timeout_ms": state.config.raft_election_timeout(),
        "state": format!("{:?}", metrics.state),
        "leading": acting == Acting::Leads,
        "not_leading_reason": reason,
        "leader": leader,
        "term": metrics.current_term,
        "members": members,
        "replication": replication,
        "last_log_index": metrics.last_log_index,
        "commit_index": metrics.cluster_committed.as_ref().map(|id| id.index),
        "applied_index": metrics.last_applied.as_ref().map(|id| id.index),
        "snapshot_index": metrics.snapshot.as_ref().map(|id| id.index),
        "purged_index": metrics.purged.as_ref().map(|id| id.index),
    }))
}

/// The membership, the same on every node that applied it: each node's
/// id, peer address and whether it votes.
fn members(metrics: &openraft::RaftMetrics<TypeConfig>) -> Vec<Value> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| json!({ "id": id, "addr": node.addr, "voter": voters.contains(id) }))
        .collect()
}

/// On the leader (null elsewhere), each member's replication: how far it
/// has acknowledged the log (`matched_index`, null before its first
/// acknowledgement) and how long ago it last acknowledged a heartbeat's
/// send (`last_ack_ms`: an unreachable node's grows).
fn replication(metrics: &openraft::RaftMetrics<TypeConfig>) -> Value {
    let (Some(replication), heartbeat) = (&metrics.replication, &metrics.heartbeat) else {
        return Value::Null;
    };
    let members = metrics.membership_config.membership();
    members
        .nodes()
        .map(|(id, _)| {
            let matched = replication.get(id).cloned().flatten();
            let acked = heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten());
            json!({
                "id": id,
                "matched_index": matched.map(|log_id| log_id.index),
                "last_ack_ms": acked.map(|sent| sent.elapsed().as_millis() as u64),
            })
        })
        .collect()
}

/// `GET /v1/jwks`: the public keys — the signing one first, then rotated-out
/// ones until they are retired (none before the first leader installed one)
/// — and `applied_index`, the log index this node's key set is as of. Every
/// node applies the same log, so a set with a higher index is at least as
/// current: a client keeps the highest it has seen and never goes back to a
/// lower one (a lagging node's set may lack a new key, or still hold a
/// retired one).
#[utoipa::path(get, path = "/v1/jwks", tag = "cluster",
    responses((status = 200, body = Object, description = "A JWK set: Ed25519 keys by kid, the signing one first, and applied_index: how current the set is")))]
pub(super) async fn jwks(State(state): State<ApiState>) -> Json<Value> {
    let (keys, applied_index): (Vec<Value>, u64) = state.group_zero().applied.read(|s| {
        let keys = s
            .table
            .published_keys()
            .filter_map(Signer::from_record)
            .map(|signer| signer.jwk())
            .collect();
        (keys, s.last_applied.as_ref().map_or(0, |id| id.index))
    });
    Json(json!({ "keys": keys, "applied_index": applied_index }))
}

/// `POST /v1/cluster/rotate-key`: a new signing key through the log. New
/// grants and renewals are signed with it at once; the old key stays in the
/// JWKS until every token it signed has expired, then the leader retires it.
#[utoipa::path(post, path = "/v1/cluster/rotate-key", tag = "cluster",
    responses(ClusterChangeErrors, (status = 200, body = Object, description = "The new key's kid")))]
pub(super) async fn rotate_key(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let (kid, secret) = generate_key();
    let command = Command::RotateKey {
        kid: kid.clone(),
        secret: KeySecret(secret),
    };
    state.group_zero().proposer.propose(command).await?;
    tracing::info!(%kid, "rotated the cluster signing key");
    Ok(Json(json!({ "kid": kid })))
}

/// `GET /healthz` and `GET /livez`: the process answers.
#[utoipa::path(get, path = "/livez", tag = "health",
    responses((status = 200, body = Object, description = "The process answers")))]
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: 200 when this node can serve — it knows a leader, the
/// cluster has its signing key, it has applied everything it knows
/// committed, and (if it leads) a quorum acknowledged it within the leader
/// lease; else 503
/// naming what is missing.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Object, description = "ready"), (status = 503, body = Object, description = "not ready, with a reason")))]
pub(super) async fn readyz(State(state): State<ApiState>) -> Response {
    let metrics = state.group_zero().raft.metrics().borrow_watched().clone();
    let applied = metrics.last_applied.as_ref().map_or(0, |id| id.index);
    let committed = metrics.cluster_committed.as_ref().map_or(0, |id| id.index);
    let has_key = state
        .group_zero()
        .applied
        .read(|s| s.table.signing_key.is_some());
    let quorum_silent = matches!(
        crate::raft::acting(&metrics, state.group_zero().leader_lease()),
        Acting::Lapsed { .. }
    );
    let problem = if metrics.current_leader.is_none() {
        Some("no leader known".to_owned())
    } else if quorum_silent {
        Some("this node leads but no quorum acknowledged it within its leader lease".to_owned())
    } else if !has_key {
        Some("the cluster has no signing key yet".to_owned())
    } else if applied < committed {
        Some(format!(
            "applied {applied} of {committed} committed entries"
        ))
    } else {
        None
    };
    let body = json!({
        "ready": problem.is_none(),
        "reason": problem,
        "leader": metrics.current_leader,
        "applied_index": applied,
        "commit_index": committed,
    });
    let status = if problem.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics`: Prometheus text format. Under a policy it needs a known
/// principal (any): its admission counters are labelled by principal name.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, body = String, content_type = "application/openmetrics-text", description = "Prometheus text format"),
        (status = 401, body = crate::error::ErrorBody, description = "Under a policy: no key, or an unknown one"),
        (status = 429, body = crate::error::ErrorBody, description = "Over the caller's share of this node's seats")))]
pub(super) async fn metrics(State(state): State<ApiState>) -> Response {
    let raft = state.group_zero().raft.metrics().borrow_watched().clone();
    let (held, records) = state
        .group_zero()
        .applied
        .read(|s| (s.table.held(), s.table.leases.len() as u64));
    let now = crate::metrics::Snapshot {
        has_leader: raft.current_leader.is_some(),
        is_leader: raft.current_leader == Some(state.config.id),
        term: raft.current_term,
        commit_index: raft.cluster_committed.as_ref().map_or(0, |id| id.index),
        applied_index: raft.last_applied.as_ref().map_or(0, |id| id.index),
        leases_held: held,
        leases_in_table: records,
        waiters: state.waiting(),
        policy_generation: state.config.policy.as_ref().map_or(0, |p| p.generation()),
    };
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(now),
    )
        .into_response()
}

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

fn voters(state: &ApiState) -> Vec<NodeId> {
    state
        .group_zero()
        .raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
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
/// new incarnation is learned afresh.
#[utoipa::path(post, path = "/v1/cluster/members", tag = "cluster", request_body = AddMember,
    responses(ClusterChangeErrors, (status = 200, body = Object, description = "The node, now a voter")))]
pub(super) async fn add_member(
    State(state): State<ApiState>,
    CheckedJson(body): CheckedJson<AddMember>,
) -> Result<Json<Value>, ApiError> {
    if voters(&state).contains(&body.id) {
        return Err(ApiError::Conflict(format!(
            "node {} is already a voter; remove it first to replace it",
            body.id
        )));
    }
    let known = state
        .group_zero()
        .raft
        .metrics()
        .borrow_watched()
        .membership_config
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
    let learner = || {
        state
            .group_zero()
            .raft
            .add_learner(body.id, node.clone(), false)
    };
    learner_with_retries(&state, learner).await?;
    if let Err(why) = caught_up(&state, body.id, deadline).await {
        let removed = state
            .group_zero()
            .proposer
            .write(|| {
                state
                    .group_zero()
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
    state
        .group_zero()
        .proposer
        .write(|| {
            state
                .group_zero()
                .raft
                .change_membership(ChangeMembers::AddVoterIds(voter.clone()), false)
        })
        .await?;
    tracing::info!(id = body.id, addr = %body.addr, "added a voter");
    Ok(Json(
        json!({ "id": body.id, "addr": body.addr, "voter": true }),
    ))
}

/// Waits until learner `id` has acknowledged the leader's log up to its last
/// index as it is now (by the leader's replication metrics), or `deadline`:
/// then why not.
async fn caught_up(
    state: &ApiState,
    id: NodeId,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    let target = state
        .group_zero()
        .raft
        .metrics()
        .borrow_watched()
        .last_log_index;
    let matched = |m: &openraft::RaftMetrics<TypeConfig>| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned())
            .flatten()
            .map(|log_id| log_id.index)
    };
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    let done = state
        .group_zero()
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
    let now = state.group_zero().raft.metrics().borrow_watched().clone();
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
/// (a voter or a learner). The last voter is never removed.
#[utoipa::path(delete, path = "/v1/cluster/members/{id}", tag = "cluster",
    params(("id" = u64, Path, description = "The node id")),
    responses(ClusterChangeErrors, (status = 200, body = Object, description = "The node removed")))]
pub(super) async fn remove_member(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id: NodeId = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("{id:?} is not a node id")))?;
    let metrics = state.group_zero().raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    if !membership.nodes().any(|(member, _)| *member == id) {
        return Err(ApiError::NotFound(format!("node {id} is not a member")));
    }
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let change = if voters.contains(&id) {
        if voters.len() == 1 {
            return Err(ApiError::Conflict(format!(
                "node {id} is the last voter; the cluster would have none"
            )));
        }
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    };
    state
        .group_zero()
        .proposer
        .write(|| {
            state
                .group_zero()
                .raft
                .change_membership(change.clone(), false)
        })
        .await?;
    tracing::info!(id, "removed a member");
    Ok(Json(json!({ "id": id, "removed": true })))
}
