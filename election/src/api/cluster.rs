//! What any node answers from its own state: the cluster view, the JWKS and
//! the health check.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use openraft::async_runtime::WatchReceiver;
use openraft::Instant as _;
use serde_json::{json, Value};

use super::schema::ClusterChangeErrors;
use super::state::ApiState;
use crate::error::ApiError;
use crate::error::ErrorBody;
use crate::lease_table::command::{Command, KeySecret};
use crate::raft::{Acting, NodeId, TypeConfig};
use crate::signing::{generate_key, Signer};

/// `GET /v1/cluster`: this node's view of the cluster (Raft metrics).
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses((status = 200, body = Object, description = "This node's view: node_id, priority, never_lead, election_timeout_ms (the range openraft draws from; one value with --timing-seed), state (openraft's), leading (this node acts as leader: it leads and a quorum acknowledged it within the leader lease), not_leading_reason (set when state is Leader but leading is false), leader (null on a leader whose lease lapsed), term, members (id, addr, voter), replication (on the leader, per member: id, matched_index, last_ack_ms; null elsewhere), last_log_index, commit_index, applied_index, snapshot_index, purged_index, partitions (every partition: id, leader, leading, term, last_log_index, commit_index, applied_index, snapshot_index, election_timeout_ms; the top-level fields are partition 0's)"),
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
        "partitions": partitions(&state),
        "settings": settings(&state),
    }))
}

/// This node's settings that must agree across nodes, the renewal lease
/// it answers under (bounded by every voter's timing), and what its peers
/// disagree on (`peer/settings.rs`).
fn settings(state: &ApiState) -> Value {
    let mine = state.settings.mine();
    let rule = state.group_zero().renew_lease();
    let differences = state.settings.differences();
    json!({
        "partitions": mine.partitions,
        "election_timeout_min_ms": mine.lease_ms,
        "lease_margin_ms": mine.margin_ms,
        "renewal_lease_ms": rule.usable().as_millis() as u64,
        "disagreements": differences.refused,
        "timing_differences": differences.timing,
    })
}

/// Every partition as this node sees it: its leader (null when none is
/// known, or on a leader whose lease lapsed), term, indexes and whether
/// this node acts as its leader. The top-level fields are partition 0's.
fn partitions(state: &ApiState) -> Vec<Value> {
    state
        .groups()
        .iter()
        .map(|group| {
            let metrics = group.raft.metrics().borrow_watched().clone();
            let acting = crate::raft::acting(&metrics, group.leader_lease());
            let leader = match acting {
                Acting::Lapsed { .. } => None,
                _ => metrics.current_leader,
            };
            json!({
                "id": group.id.0,
                "leader": leader,
                "leading": acting == Acting::Leads,
                "term": metrics.current_term,
                "last_log_index": metrics.last_log_index,
                "commit_index": metrics.cluster_committed.as_ref().map(|id| id.index),
                "applied_index": metrics.last_applied.as_ref().map(|id| id.index),
                "snapshot_index": metrics.snapshot.as_ref().map(|id| id.index),
                "election_timeout_ms": state.config.group_election_timeout(group.id),
            })
        })
        .collect()
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
/// committed, (if it leads) a quorum acknowledged it within the leader
/// lease, and no peer disagrees on a setting that must agree; else 503
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
    let refused = state.settings.differences().refused;
    let problem = (!refused.is_empty())
        .then(|| refused.join("; "))
        .or_else(|| {
            state.groups().iter().find_map(|group| {
                let problem = unready(group)?;
                Some(match state.partitions() {
                    1 => problem,
                    _ => format!("partition {}: {problem}", group.id),
                })
            })
        })
        .or_else(|| (!has_key).then(|| "the cluster has no signing key yet".to_owned()));
    let body = json!({
        "ready": problem.is_none(),
        "reason": problem,
        // A leader whose lease lapsed names no leader (as `/v1/cluster`).
        "leader": match crate::raft::acting(&metrics, state.group_zero().leader_lease()) {
            Acting::Lapsed { .. } => None,
            _ => metrics.current_leader,
        },
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

/// Every partition's gauges as this node sees them now.
fn partition_snapshots(state: &ApiState) -> Vec<crate::metrics::PartitionSnapshot> {
    state
        .groups()
        .iter()
        .map(|group| {
            let metrics = group.raft.metrics().borrow_watched().clone();
            crate::metrics::PartitionSnapshot {
                id: group.id.0,
                leading: crate::raft::acting(&metrics, group.leader_lease()) == Acting::Leads,
                term: metrics.current_term,
                commit_index: metrics.cluster_committed.as_ref().map_or(0, |id| id.index),
                applied_index: metrics.last_applied.as_ref().map_or(0, |id| id.index),
                leases_held: group.applied.read(|s| s.table.held()),
            }
        })
        .collect()
}

/// What keeps this node from serving `group`, if anything: no leader
/// known, leading without a quorum's acknowledgement, or applying behind
/// what it knows committed.
fn unready(group: &crate::group::Group) -> Option<String> {
    let metrics = group.raft.metrics().borrow_watched().clone();
    let applied = metrics.last_applied.as_ref().map_or(0, |id| id.index);
    let committed = metrics.cluster_committed.as_ref().map_or(0, |id| id.index);
    let quorum_silent = matches!(
        crate::raft::acting(&metrics, group.leader_lease()),
        Acting::Lapsed { .. }
    );
    if metrics.current_leader.is_none() {
        Some("no leader known".to_owned())
    } else if quorum_silent {
        Some("this node leads but no quorum acknowledged it within its leader lease".to_owned())
    } else if applied < committed {
        Some(format!(
            "applied {applied} of {committed} committed entries"
        ))
    } else {
        None
    }
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
        .groups()
        .iter()
        .fold((0, 0), |(held, records), group| {
            group
                .applied
                .read(|s| (held + s.table.held(), records + s.table.leases.len() as u64))
        });
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
        state.metrics.render(now, &partition_snapshots(&state)),
    )
        .into_response()
}
