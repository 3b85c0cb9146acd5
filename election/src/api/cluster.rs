//! What any node answers from its own state: the cluster view, the JWKS and
//! the health check.

use axum::extract::State;
use axum::Json;
use openraft::async_runtime::WatchReceiver;
use serde_json::{json, Value};

use super::state::ApiState;

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

/// `GET /v1/jwks`: the public signing keys (none before the first leader
/// installed one).
pub(super) async fn jwks(State(state): State<ApiState>) -> Json<Value> {
    let keys: Vec<Value> = state.signer().map(|s| vec![s.jwk()]).unwrap_or_default();
    Json(json!({ "keys": keys }))
}

/// `GET /healthz`: the process answers.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}
