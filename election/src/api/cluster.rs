//! What any node answers from its own state: the cluster view, the JWKS and
//! the health check.

use axum::extract::State;
use axum::Json;
use openraft::async_runtime::WatchReceiver;
use serde_json::{json, Value};

use super::state::ApiState;
use crate::command::{Command, KeySecret};
use crate::error::ApiError;
use crate::signing::{generate_key, Signer};

/// `GET /v1/cluster`: this node's view of the cluster (Raft metrics).
pub(super) async fn cluster(State(state): State<ApiState>) -> Json<Value> {
    let metrics = state.raft.metrics().borrow_watched().clone();
    let members: Vec<Value> = metrics
        .membership_config
        .membership()
        .nodes()
        .map(|(id, node)| json!({ "id": id, "addr": node.addr }))
        .collect();
    Json(json!({
        "node_id": state.config.id,
        "state": format!("{:?}", metrics.state),
        "leader": metrics.current_leader,
        "term": metrics.current_term,
        "members": members,
        "last_log_index": metrics.last_log_index,
        "commit_index": metrics.cluster_committed.as_ref().map(|id| id.index),
        "applied_index": metrics.last_applied.as_ref().map(|id| id.index),
        "snapshot_index": metrics.snapshot.as_ref().map(|id| id.index),
        "purged_index": metrics.purged.as_ref().map(|id| id.index),
    }))
}

/// `GET /v1/jwks`: the public keys — the signing one first, then rotated-out
/// ones until they are retired (none before the first leader installed one).
pub(super) async fn jwks(State(state): State<ApiState>) -> Json<Value> {
    let keys: Vec<Value> = state.shared.read(|s| {
        s.table
            .published_keys()
            .filter_map(Signer::from_record)
            .map(|signer| signer.jwk())
            .collect()
    });
    Json(json!({ "keys": keys }))
}

/// `POST /v1/cluster/rotate-key`: a new signing key through the log. New
/// grants and renewals are signed with it at once; the old key stays in the
/// JWKS until every token it signed has expired, then the leader retires it.
pub(super) async fn rotate_key(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let (kid, secret) = generate_key();
    let command = Command::RotateKey {
        kid: kid.clone(),
        secret: KeySecret(secret),
    };
    state.proposer.propose(command).await?;
    tracing::info!(%kid, "rotated the cluster signing key");
    Ok(Json(json!({ "kid": kid })))
}

/// `GET /healthz`: the process answers.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}
