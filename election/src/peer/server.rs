//! The incoming side of peer traffic: [`peer_router`], Raft RPC under
//! `/raft/` and client requests forwarded to the leader under `/forward/`,
//! all behind the gate (`gate.rs`). Never served on the client port.

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Json, Router};
use openraft::alias::VoteOf;
use openraft::error::RaftError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::vote::RaftLeaderId;
use openraft::Snapshot;

use super::beats::{Beat, BeatAnswer, BEATS_ROUTE, BEATS_WAIT_HEADER, MAX_BEATS};
use super::figures::FiguresSource;
use super::incarnation::Incarnations;
use super::settings::PeerSettings;
use super::standing::Standing;
use crate::error::ApiError;
use crate::group_id::GroupId;
use crate::raft::{Raft, TypeConfig};

use super::gate::{authenticate, PeerGate, PeerId};
use super::snapshot_frame::{parse_snapshot_frame, MAX_SNAPSHOT_BYTES};

/// What peers call on the peer listener: Raft RPC under `/raft/` (each
/// group's under its own routes, [`GroupId::names`]) and client requests
/// forwarded to the leader under `/forward/` (the client API), all behind
/// [`authenticate`] (which asks group 0's membership). `standing` is what
/// this node tells the leader of itself; a `never_lead` node refuses
/// leadership transfers to it; `figures`, what it tells a peer's status
/// page.
pub fn peer_router(
    groups: &[(GroupId, Arc<Raft>)],
    identity: (Arc<Incarnations>, Arc<PeerSettings>),
    api: Router,
    tls: bool,
    (standing, figures): (Standing, FiguresSource),
) -> Router {
    let zero = groups
        .iter()
        .find(|(id, _)| *id == GroupId::ZERO)
        .map(|(_, raft)| raft.clone())
        .expect("a node runs group 0");
    let gate = PeerGate::new(zero, identity, tls);
    let every_group: Arc<HashMap<u32, Arc<Raft>>> = Arc::new(
        groups
            .iter()
            .map(|(id, raft)| (id.0, raft.clone()))
            .collect(),
    );
    let carried = Router::new()
        .route(BEATS_ROUTE, post(beats))
        .with_state(every_group);
    groups
        .iter()
        .fold(node_routes(standing, figures), |router, (id, raft)| {
            router.merge(group_routes(*id, raft.clone(), standing.never_lead))
        })
        .merge(carried)
        .nest("/forward", api)
        .layer(axum::middleware::from_fn_with_state(gate, authenticate))
}

/// Refuses an RPC whose vote names another node than the one that sent it:
/// a member may speak only for itself.
fn speaks_for_itself(from: PeerId, vote: &VoteOf<TypeConfig>) -> Result<(), ApiError> {
    let claimed = *vote.leader_id().node_id();
    if claimed == from.0 {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "node {} sent an RPC in the name of node {claimed}",
            from.0
        )))
    }
}

/// One group's Raft RPCs:
/// `/raft/{append,vote,pre-vote,snapshot,transfer-leader}` for group 0,
/// `/raft/group/{n}/...` for group `n`.
fn group_routes(group: GroupId, raft: Arc<Raft>, never_lead: bool) -> Router {
    let transfer = if never_lead {
        post(refuse_transfer)
    } else {
        post(transfer_leader)
    };
    let names = group.names();
    Router::new()
        .route(&names.route("append"), post(append))
        .route(&names.route("vote"), post(vote))
        .route(&names.route("pre-vote"), post(pre_vote))
        .route(
            &names.route("snapshot"),
            post(snapshot).layer(axum::extract::DefaultBodyLimit::max(MAX_SNAPSHOT_BYTES)),
        )
        .route(&names.route("transfer-leader"), transfer)
        .with_state(raft)
}

/// The node's own routes: `/raft/standing` and `/raft/figures`.
fn node_routes(standing: Standing, figures: FiguresSource) -> Router {
    Router::new()
        .route(
            "/raft/standing",
            post(move || async move { Json(standing) }),
        )
        .route(
            "/raft/figures",
            post(move || async move { Json(figures()) }),
        )
}

type RpcResult<T> = Result<Json<Result<T, RaftError<TypeConfig>>>, ApiError>;

async fn append(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<AppendEntriesRequest<TypeConfig>>,
) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.append_entries(request).await))
}

/// `POST /raft/beats`: heartbeats of several groups at once (`beats.rs`),
/// each checked as [`append`] checks one; the answers in the same order.
/// A beat in the name of another node, or of a group this node does not
/// run, refuses the whole batch. A group that has not answered within the
/// sender's wait ([`BEATS_WAIT_HEADER`], at most 1 s; a group whose log is
/// busy on disk answers a heartbeat only after the write) is answered
/// `Err`, so it holds up no other group's answer.
async fn beats(
    State(groups): State<Arc<HashMap<u32, Arc<Raft>>>>,
    Extension(from): Extension<PeerId>,
    headers: http::HeaderMap,
    Json(beats): Json<Vec<Beat>>,
) -> Result<Json<Vec<BeatAnswer>>, ApiError> {
    if beats.len() > MAX_BEATS {
        return Err(ApiError::BadRequest(format!(
            "{} beats in one batch; at most {MAX_BEATS}",
            beats.len()
        )));
    }
    let wait = headers
        .get(BEATS_WAIT_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map_or(MAX_BEATS_WAIT, std::time::Duration::from_millis)
        .min(MAX_BEATS_WAIT);
    let mut calls = Vec::with_capacity(beats.len());
    for beat in beats {
        speaks_for_itself(from, &beat.rpc.vote)?;
        let raft = groups.get(&beat.group).cloned().ok_or_else(|| {
            ApiError::BadRequest(format!("this node runs no partition {}", beat.group))
        })?;
        calls.push(async move {
            match tokio::time::timeout(wait, raft.append_entries(beat.rpc)).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(err)) => Err(format!("partition {}: {err}", beat.group)),
                Err(_) => Err(format!(
                    "partition {} did not answer within {wait:?}",
                    beat.group
                )),
            }
        });
    }
    Ok(Json(futures::future::join_all(calls).await))
}

/// The longest a batch of heartbeats is given, whatever its sender says.
const MAX_BEATS_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

async fn vote(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.vote(request).await))
}

async fn pre_vote(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.pre_vote(request).await))
}

async fn snapshot(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    frame: axum::body::Bytes,
) -> RpcResult<SnapshotResponse<TypeConfig>> {
    let (vote, meta, data) = parse_snapshot_frame(frame.to_vec()).map_err(ApiError::BadRequest)?;
    speaks_for_itself(from, &vote)?;
    let snapshot = Snapshot {
        meta,
        snapshot: Cursor::new(data),
    };
    Ok(Json(
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::Fatal),
    ))
}

/// A `--never-lead` node does not take leadership, even when handed it.
async fn refuse_transfer() -> ApiError {
    ApiError::Forbidden("this node never leads (--never-lead)".into())
}

async fn transfer_leader(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<TransferLeaderRequest<TypeConfig>>,
) -> RpcResult<TransferLeaderResponse<TypeConfig>> {
    speaks_for_itself(from, request.from_leader())?;
    Ok(Json(
        raft.handle_transfer_leader(request)
            .await
            .map_err(RaftError::Fatal),
    ))
}
