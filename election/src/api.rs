//! The client API of an election node (see the contract and README).
//!
//! Writes and consistent reads are the leader's job: [`leader_only`] forwards
//! them from a follower to the leader (at most [`MAX_HOPS`] hops) and answers a
//! fast 503 when there is no leader. Watches, `/v1/cluster`, `/v1/jwks` and
//! `/healthz` are answered by any node from its own state.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use palisade_names::LeaseName;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::command::{Command, CommandResult};
use crate::error::ApiError;
use crate::lease_table::LeaseRecord;
use crate::lessor::{Lessor, RenewRefused};
use crate::read_batcher::ReadBatcher;
use crate::signing::Signer;
use crate::state_machine::SharedState;
use crate::{ElectionConfig, NodeId, Raft};

/// Most forwards a request may take before a node answers 503.
pub const MAX_HOPS: u32 = 2;
/// The largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The longest holder name, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
const HOPS_HEADER: &str = "x-palisade-hops";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// This node's Raft.
    pub raft: Arc<Raft>,
    /// The applied lease table.
    pub shared: SharedState,
    /// Deadlines (meaningful on the leader only).
    pub lessor: Arc<Lessor>,
    /// This node's settings.
    pub config: Arc<ElectionConfig>,
    /// Forwards requests to the leader.
    pub forwarder: reqwest::Client,
    /// The signer built from the replicated key, once there is one.
    pub signer: Arc<Mutex<Option<Signer>>>,
    /// Shares quorum confirmations between concurrent renewals and reads.
    pub reads: Arc<ReadBatcher>,
}

impl ApiState {
    fn signer(&self) -> Result<Signer, ApiError> {
        let mut cached = self
            .signer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(signer) = cached.as_ref() {
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
    fn leader(&self) -> Option<(NodeId, String)> {
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

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics().borrow_watched().clone();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.config.id)
    }
}

/// The client API routes.
pub fn router(state: ApiState) -> Router {
    let leader_routes = Router::new()
        .route("/v1/leases/{name}/acquire", post(acquire))
        .route("/v1/leases/{name}/renew", post(renew))
        .route("/v1/leases/{name}/release", post(release))
        .route("/v1/leases/{name}", get(get_lease))
        .route("/v1/leases", get(list_leases))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            leader_only,
        ));
    Router::new()
        .merge(leader_routes)
        .route("/v1/leases/{name}/watch", get(watch))
        .route("/v1/cluster", get(cluster))
        .route("/v1/jwks", get(jwks))
        .route("/healthz", get(healthz))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Runs the request here if this node leads; otherwise forwards it to the
/// leader, or answers 503 when there is none (or too many hops).
async fn leader_only(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if state.is_leader() {
        return next.run(request).await;
    }
    let hops: u32 = request
        .headers()
        .get(HOPS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let Some((leader, addr)) = state.leader().filter(|(id, _)| *id != state.config.id) else {
        return ApiError::NoQuorum("no leader is known; the cluster may lack a quorum".into())
            .into_response();
    };
    if hops >= MAX_HOPS {
        return ApiError::NoQuorum(format!(
            "request forwarded {hops} times without reaching the leader"
        ))
        .into_response();
    }
    match forward(&state, request, &addr, hops + 1).await {
        Ok(mut response) => {
            response
                .headers_mut()
                .insert("x-palisade-leader", HeaderValue::from(leader));
            response
        }
        Err(err) => err.into_response(),
    }
}

async fn forward(
    state: &ApiState,
    request: Request,
    addr: &str,
    hops: u32,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(body).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // A blocking acquire may legitimately take its `wait_ms` (bounded by the
    // leader to `max_wait`); everything else answers within the quorum timeout.
    let wait = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["wait_ms"].as_u64())
        .map_or(Duration::ZERO, Duration::from_millis)
        .min(state.config.max_wait);
    let mut outgoing = state
        .forwarder
        .request(parts.method.clone(), format!("http://{addr}{path}"))
        .header(HOPS_HEADER, hops.to_string())
        .timeout(state.config.quorum_timeout + wait)
        .body(body);
    if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE) {
        outgoing = outgoing.header(header::CONTENT_TYPE, content_type);
    }
    let answer = outgoing
        .send()
        .await
        .map_err(|e| ApiError::NoQuorum(format!("the leader at {addr} did not answer: {e}")))?;
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| ApiError::NoQuorum(format!("the leader at {addr} did not answer: {e}")))?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    Ok(response)
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "body is larger than {MAX_BODY_BYTES} bytes or unreadable"
            ))
        })
}

/// Parses a JSON body: `Content-Type: application/json`, bounded, no unknown
/// fields.
async fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return Err(ApiError::BadRequest(
            "Content-Type must be application/json".into(),
        ));
    }
    let bytes = read_body(body).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

fn lease_name(path: Result<Path<String>, PathRejection>) -> Result<LeaseName, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::BadRequest(format!("bad lease name: {e}")))?;
    LeaseName::new(&name).map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn check_holder(holder: &str) -> Result<(), ApiError> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN {
        return Err(ApiError::BadRequest(format!(
            "holder must be 1..={MAX_HOLDER_LEN} bytes"
        )));
    }
    if holder.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(
            "holder must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// Proposes `command` and waits for it to apply. A fresh leader may refuse
/// writes for a moment (`ForwardToLeader` without a leader, while its leader
/// lease is not yet established): that is retried until `quorum_timeout`.
async fn propose(state: &ApiState, command: Command) -> Result<CommandResult, ApiError> {
    let deadline = tokio::time::Instant::now() + state.config.quorum_timeout;
    loop {
        let attempt =
            tokio::time::timeout_at(deadline, state.raft.client_write(command.clone())).await;
        match attempt {
            Err(_) => {
                return Err(ApiError::NoQuorum(format!(
                    "not committed within {} ms: no quorum",
                    state.config.quorum_timeout.as_millis()
                )))
            }
            Ok(Ok(response)) => return Ok(response.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))))
                if forward.leader_id.is_none() || forward.leader_id == Some(state.config.id) =>
            {
                if tokio::time::Instant::now() + Duration::from_millis(10) >= deadline {
                    return Err(ApiError::NoQuorum(
                        "this node cannot confirm its leadership".into(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
                return Err(ApiError::NoQuorum(format!(
                    "leadership moved to node {:?}; retry there",
                    forward.leader_id
                )))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)))) => {
                return Err(ApiError::NoQuorum(
                    "leadership changed while proposing; retry".into(),
                ))
            }
            Ok(Err(err)) => return Err(ApiError::Internal(err.to_string())),
        }
    }
}

/// Confirms with a quorum that this node still leads and that its state
/// machine has applied everything committed before now. Concurrent callers
/// share rounds ([`ReadBatcher`]).
async fn confirm_leadership(state: &ApiState) -> Result<(), ApiError> {
    state.reads.confirm().await.map_err(ApiError::NoQuorum)
}

fn grant_body(
    state: &ApiState,
    lease: &LeaseName,
    holder: &str,
    token: u64,
    ttl_ms: u64,
    grant_index: u64,
) -> Result<Json<Value>, ApiError> {
    let signer = state.signer()?;
    let jwt = signer
        .sign(lease.as_str(), holder, token, ttl_ms)
        .map_err(|e| ApiError::Internal(format!("signing failed: {e}")))?;
    Ok(Json(json!({
        "lease": lease.as_str(),
        "holder": holder,
        "token": token,
        "ttl_ms": ttl_ms,
        "jwt": jwt,
        "kid": signer.kid(),
        "grant_index": grant_index,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    holder: String,
    ttl_ms: u64,
    wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HolderToken {
    holder: String,
    token: u64,
    /// The grant's `grant_index` as the holder's handle knows it (release
    /// only; see `LeaseRecord::grant_index`).
    #[serde(default)]
    grant_index: Option<u64>,
}

/// 409 `lost`: `request` does not name the current grant of `lease`.
fn not_held(request: &HolderToken, lease: &LeaseName) -> ApiError {
    ApiError::Lost(format!(
        "{} does not hold {} with token {}",
        request.holder, lease, request.token
    ))
}

async fn acquire(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let lease = lease_name(path)?;
    let request: AcquireRequest = json_body(&headers, body).await?;
    check_holder(&request.holder)?;
    let (min, max) = state.config.ttl_range;
    if request.ttl_ms < min.as_millis() as u64 || request.ttl_ms > max.as_millis() as u64 {
        return Err(ApiError::BadRequest(format!(
            "ttl_ms must be in {}..={}",
            min.as_millis(),
            max.as_millis()
        )));
    }
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
    if wait > state.config.max_wait {
        return Err(ApiError::BadRequest(format!(
            "wait_ms must be at most {}",
            state.config.max_wait.as_millis()
        )));
    }
    // Refuse before proposing anything when the cluster cannot sign yet.
    state.signer()?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let command = Command::Acquire {
            lease: lease.as_str().to_owned(),
            holder: request.holder.clone(),
            ttl_ms: request.ttl_ms,
        };
        match propose(&state, command).await? {
            CommandResult::Granted {
                token,
                ttl_ms,
                new_grant,
                grant_index,
            } => {
                let ttl = Duration::from_millis(ttl_ms);
                if new_grant {
                    state.lessor.granted(lease.as_str(), token, ttl);
                    let holder = &request.holder;
                    return grant_body(&state, &lease, holder, token, ttl_ms, grant_index);
                }
                // The holder asked again for the grant it has: that extends
                // it like a renewal, and like a renewal it must not revive a
                // grant whose deadline has passed, for the `Expire` of that
                // same token may already be on its way through the log, or
                // have applied since this acquire did (found by the fault
                // suite: the holder was told it held a lease that was freed
                // and granted to another 15 ms later).
                match extend(&state, &lease, &request.holder, token) {
                    Extended::Yes {
                        ttl_ms,
                        grant_index,
                    } => {
                        let holder = &request.holder;
                        return grant_body(&state, &lease, holder, token, ttl_ms, grant_index);
                    }
                    Extended::No(RenewRefused::NotLeader) => return Err(stopped_leading()),
                    Extended::NotHeld | Extended::No(RenewRefused::Expired) => {
                        // Wait for the Expire to free the lease, then ask
                        // for a fresh grant (with a new token).
                        let settle = tokio::time::Instant::now() + state.config.quorum_timeout;
                        if !wait_until_free(&state, &lease, settle.max(deadline)).await {
                            return Err(ApiError::NoQuorum(format!(
                                "the previous grant of {lease} is expiring; retry"
                            )));
                        }
                    }
                }
            }
            CommandResult::Held { holder, token } => {
                if !wait_until_free(&state, &lease, deadline).await {
                    return Err(ApiError::Held { holder, token });
                }
            }
            other => return Err(ApiError::Internal(format!("acquire answered {other:?}"))),
        }
    }
}

/// The lessor found this node no longer leading between the commit and the
/// answer.
fn stopped_leading() -> ApiError {
    ApiError::NoQuorum("this node stopped leading; retry".into())
}

/// Waits until the table shows `lease` free, or `deadline`. True if free.
async fn wait_until_free(
    state: &ApiState,
    lease: &LeaseName,
    deadline: tokio::time::Instant,
) -> bool {
    let mut changes = state.shared.changes.subscribe();
    loop {
        let free = state.shared.read(|s| {
            s.table
                .leases
                .get(lease.as_str())
                .is_none_or(|r| r.holder.is_none())
        });
        if free {
            return true;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            _ => return false,
        }
    }
}

async fn renew(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let lease = lease_name(path)?;
    let request: HolderToken = json_body(&headers, body).await?;
    check_holder(&request.holder)?;
    // A renewal writes nothing, but only a confirmed leader may answer it.
    confirm_leadership(&state).await?;
    match extend(&state, &lease, &request.holder, request.token) {
        Extended::Yes {
            ttl_ms,
            grant_index,
        } => grant_body(
            &state,
            &lease,
            &request.holder,
            request.token,
            ttl_ms,
            grant_index,
        ),
        Extended::NotHeld => Err(not_held(&request, &lease)),
        Extended::No(RenewRefused::Expired) => Err(ApiError::Lost(format!(
            "the lease {lease} expired before this renewal"
        ))),
        Extended::No(RenewRefused::NotLeader) => Err(stopped_leading()),
    }
}

/// How [`extend`] went.
enum Extended {
    Yes { ttl_ms: u64, grant_index: u64 },
    NotHeld,
    No(RenewRefused),
}

/// Extends `holder`'s grant `token` of `lease` by its ttl (a renewal, or a
/// repeated acquire). The table check and the lessor's decision happen in
/// one step under the applied state's read lock, so no `Expire` can apply
/// in between: otherwise the lessor, which stops tracking a grant once the
/// table shows it freed, would start that freed grant afresh and the holder
/// would be told it holds a lease another may be granted next (found by a
/// targeted test under CPU load).
fn extend(state: &ApiState, lease: &LeaseName, holder: &str, token: u64) -> Extended {
    state
        .shared
        .read(|s| match s.table.leases.get(lease.as_str()) {
            Some(r) if r.holder.as_deref() == Some(holder) && r.token == token => {
                let ttl = Duration::from_millis(r.ttl_ms);
                match state.lessor.renew(lease.as_str(), token, ttl) {
                    Ok(()) => Extended::Yes {
                        ttl_ms: r.ttl_ms,
                        grant_index: r.grant_index,
                    },
                    Err(refused) => Extended::No(refused),
                }
            }
            _ => Extended::NotHeld,
        })
}

async fn release(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let lease = lease_name(path)?;
    let request: HolderToken = json_body(&headers, body).await?;
    check_holder(&request.holder)?;
    let command = Command::Release {
        lease: lease.as_str().to_owned(),
        holder: request.holder.clone(),
        token: request.token,
        grant_index: request.grant_index,
    };
    match propose(&state, command).await? {
        CommandResult::Freed => Ok(Json(
            json!({ "lease": lease.as_str(), "released": true, "token": request.token }),
        )),
        CommandResult::Lost => Err(not_held(&request, &lease)),
        other => Err(ApiError::Internal(format!("release answered {other:?}"))),
    }
}

fn lease_json(state: &ApiState, name: &str, record: &LeaseRecord) -> Value {
    let mut body = json!({
        "lease": name,
        "holder": record.holder,
        "token": record.token,
        "ttl_ms": record.ttl_ms,
        "transitions": record.transitions,
        "modify_index": record.modify_index,
    });
    if record.holder.is_some() {
        if let Some(remaining) = state.lessor.remaining_ms(name, record.token) {
            body["expires_in_ms"] = json!(remaining);
        }
    }
    body
}

async fn get_lease(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let lease = lease_name(path)?;
    confirm_leadership(&state).await?;
    let record = state
        .shared
        .read(|s| s.table.leases.get(lease.as_str()).cloned());
    let record =
        record.ok_or_else(|| ApiError::NotFound(format!("lease {lease} was never granted")))?;
    Ok(Json(lease_json(&state, lease.as_str(), &record)))
}

async fn list_leases(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    confirm_leadership(&state).await?;
    let leases: Vec<Value> = state.shared.read(|s| {
        s.table
            .leases
            .iter()
            .map(|(name, record)| lease_json(&state, name, record))
            .collect()
    });
    Ok(Json(json!({ "leases": leases })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    index: Option<u64>,
    wait_ms: Option<u64>,
}

/// A blocking query: answers as soon as the lease's `modify_index` exceeds
/// `index` (at once if it already does), or after `wait_ms` with the current
/// state. Served from this node's applied state. The answer's
/// `X-Palisade-Index` header is the `index` for the next call.
async fn watch(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<WatchQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let lease = lease_name(path)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(30_000));
    if wait > state.config.max_wait {
        return Err(ApiError::BadRequest(format!(
            "wait_ms must be at most {}",
            state.config.max_wait.as_millis()
        )));
    }
    let after = query.index.unwrap_or(0);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = state.shared.changes.subscribe();
    loop {
        let record = state
            .shared
            .read(|s| s.table.leases.get(lease.as_str()).cloned());
        let index = record.as_ref().map_or(0, |r| r.modify_index);
        let timed_out = tokio::time::Instant::now() >= deadline;
        if index > after || timed_out {
            let record = record
                .ok_or_else(|| ApiError::NotFound(format!("lease {lease} was never granted")))?;
            let mut response = Json(lease_json(&state, lease.as_str(), &record)).into_response();
            response
                .headers_mut()
                .insert("x-palisade-index", HeaderValue::from(index));
            return Ok(response);
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_ok_and(|r| r.is_err())
        {
            return Err(ApiError::Internal("state machine stopped".into()));
        }
    }
}

async fn cluster(State(state): State<ApiState>) -> Json<Value> {
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

async fn jwks(State(state): State<ApiState>) -> Json<Value> {
    let keys: Vec<Value> = state.signer().map(|s| vec![s.jwk()]).unwrap_or_default();
    Json(json!({ "keys": keys }))
}

async fn healthz() -> (StatusCode, Json<Value>) {
    (StatusCode::OK, Json(json!({ "status": "ok" })))
}
