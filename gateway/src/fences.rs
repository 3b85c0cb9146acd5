//! `/v1/fences/{lease}`: read a fence, or raise it without writing an object.

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use http::{HeaderMap, Uri};
use palisade_store::FencedStore;
use serde::{Deserialize, Serialize};

use crate::audit::{audited, Peer};
use crate::body::read_body;
use crate::error::ApiError;
use crate::paths::lease_name;
use crate::schema::{ErrorBody, Fence, LeaseNameParam, ReadErrors, Refusals, WriteErrors};
use crate::state::AppState;
use crate::verify::LeaseToken;

/// The route prefix its paths start with.
pub(crate) const PREFIX: &str = "/v1/fences/";

/// Largest body `POST /v1/fences/{lease}` reads.
const MAX_FENCE_BODY: usize = 4096;

/// The optional body of a fence bump: if `token` is given, it must equal the
/// JWT's, so a client that means a specific token gets told when it holds
/// another one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BumpRequest {
    token: Option<u64>,
}

/// The answer of `GET /v1/fences` (the document shows it as an object).
#[derive(Debug, Serialize)]
pub struct FenceList {
    fences: Vec<LeaseRefusals>,
}

/// One lease of a [`FenceList`].
#[derive(Debug, Serialize)]
struct LeaseRefusals {
    lease: String,
    refused: Refusals,
}

#[utoipa::path(get, path = "/v1/fences/{lease}", tag = "fences", params(("lease" = LeaseNameParam, Path, description = "The lease")),
    responses((status = 200, body = Fence), ReadErrors))]
/// `GET /v1/fences/{lease}`: the fence, and the writes refused below it
/// (`refused`: count and the last, with its holder and address).
pub async fn get<S: FencedStore>(
    State(state): State<AppState<S>>,
    uri: Uri,
) -> Result<Json<Fence>, ApiError> {
    let lease = lease_name(uri.path(), PREFIX)?;
    let fence = state.store.fence(&lease).await?;
    let refused = state.observer.refusals(lease.as_str()).await?;
    Ok(Json(Fence {
        lease: lease.as_str().to_owned(),
        fence: fence.0,
        refused: Some(refused),
    }))
}

/// `GET /v1/fences`: the leases with writes refused for a stale token, the
/// most recently refused first (at most 1 000), with their refusals. Under
/// a policy it needs the `read` right on every lease.
#[utoipa::path(get, path = "/v1/fences", tag = "fences",
    responses((status = 200, body = Object, description = "{\"fences\":[{\"lease\",\"refused\":{\"count\",\"last\"}}]}"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list<S: FencedStore>(
    State(state): State<AppState<S>>,
) -> Result<Json<FenceList>, ApiError> {
    let fences = state
        .observer
        .all_refusals(1000)
        .await?
        .into_iter()
        .map(|(lease, refused)| LeaseRefusals { lease, refused })
        .collect();
    Ok(Json(FenceList { fences }))
}

/// `POST /v1/fences/{lease}`: raises the fence to the JWT's token.
#[utoipa::path(post, path = "/v1/fences/{lease}", tag = "fences", params(("lease" = LeaseNameParam, Path, description = "The lease")),
    responses((status = 200, body = Fence), WriteErrors))]
pub async fn bump<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Fence>, ApiError> {
    let lease = lease_name(uri.path(), PREFIX)?;
    let token = token?;
    token.require_lease(&lease)?;
    let body = read_body(&headers, body, MAX_FENCE_BODY).await?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let request: BumpRequest = serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("body is not a fence request: {e}")))?;
        if let Some(wanted) = request.token.filter(|&t| t != token.token.0) {
            return Err(ApiError::BadRequest(format!(
                "body asks for token {wanted} but the JWT carries {}",
                token.token.0
            )));
        }
    }
    let fence = state.store.bump_fence(&lease, token.token).await;
    let fence = audited(&state, &lease, lease.as_str(), &token, &peer, fence).await?;
    Ok(Json(Fence {
        lease: lease.as_str().to_owned(),
        fence: fence.0,
        refused: None,
    }))
}
