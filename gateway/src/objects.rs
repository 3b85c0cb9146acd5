//! `/v1/objects/{key}`: fenced PUT and DELETE, plain GET.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, HeaderValue, Uri};
use palisade_store::{FencedStore, ObjectKey};
use serde_json::json;

use crate::auth::LeaseToken;
use crate::key_path::object_key;
use crate::{ApiError, AppState};

/// The route prefix its paths start with.
pub(crate) const PREFIX: &str = "/v1/objects/";

fn key_of(uri: &Uri) -> Result<ObjectKey, ApiError> {
    object_key(uri.path(), PREFIX)
}

/// Reads a body of at most `limit` bytes, refusing early on a larger
/// `Content-Length`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let too_large = std::error::Error::source(&err)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(format!("cannot read the body: {err}"))
        }
    })
}

/// The caller's address, when the server knows it (not in process tests).
pub(crate) type Peer = Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>;

/// Passes a store answer through; a refusal for a stale token is first
/// recorded in the fencing audit (and logged), with the JWT's holder and
/// the caller's address.
pub(crate) fn audited<S, T>(
    state: &AppState<S>,
    lease: &palisade_store::LeaseName,
    key: &str,
    token: &LeaseToken,
    peer: &Peer,
    answer: Result<T, palisade_store::StoreError>,
) -> Result<T, ApiError> {
    if let Err(palisade_store::StoreError::Stale {
        token: stale,
        fence,
    }) = &answer
    {
        state.observer.refused(
            lease.as_str(),
            crate::observe::Refused {
                token: stale.0,
                fence: fence.0,
                holder: token.claims.sub.clone(),
                key: key.to_owned(),
                peer: peer.as_ref().map(|p| p.0 .0.to_string()),
                at_unix_ms: crate::observe::now_unix_ms(),
            },
        );
    }
    Ok(answer?)
}

/// `PUT /v1/objects/{key}`: stores the body if the token passes the fence.
#[utoipa::path(put, path = "/v1/objects/{key}", tag = "objects", params(("key" = crate::openapi::ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = crate::openapi::Written), (status = 400, body = crate::openapi::ErrorBody), (status = 401, body = crate::openapi::ErrorBody), (status = 403, body = crate::openapi::ErrorBody), (status = 408, body = crate::openapi::ErrorBody), (status = 409, body = crate::openapi::ErrorBody), (status = 413, body = crate::openapi::ErrorBody)))]
pub async fn put<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = key_of(&uri)?;
    let token = token?;
    token.require_lease(key.lease())?;
    let value = read_body(&headers, body, state.config.max_value_bytes).await?;
    let written = state.store.put(&key, value.to_vec(), token.token).await;
    let written = audited(&state, key.lease(), key.as_str(), &token, &peer, written)?;
    Ok(Json(json!({
        "key": key.as_str(),
        "version": written.version,
        "token": token.token.0,
    }))
    .into_response())
}

/// `GET /v1/objects/{key}`: the bytes, with `ETag` and `Fencing-Token`.
#[utoipa::path(get, path = "/v1/objects/{key}", tag = "objects", params(("key" = crate::openapi::ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    responses((status = 200, body = Vec<u8>, content_type = "application/octet-stream",
        headers(("etag" = u64, description = "The version"), ("fencing-token" = u64, description = "The token that wrote it"))),
        (status = 400, body = crate::openapi::ErrorBody), (status = 401, body = crate::openapi::ErrorBody), (status = 403, body = crate::openapi::ErrorBody), (status = 404, body = crate::openapi::ErrorBody)))]
pub async fn get<S: FencedStore>(
    State(state): State<AppState<S>>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let key = key_of(&uri)?;
    let object = state
        .store
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no object at {:?}", key.as_str())))?;
    let mut response = object.value.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::ETAG, HeaderValue::from(object.version));
    headers.insert("fencing-token", HeaderValue::from(object.token.0));
    Ok(response)
}

#[utoipa::path(delete, path = "/v1/objects/{key}", tag = "objects", params(("key" = crate::openapi::ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    responses((status = 200, body = crate::openapi::Deleted), (status = 400, body = crate::openapi::ErrorBody), (status = 401, body = crate::openapi::ErrorBody), (status = 403, body = crate::openapi::ErrorBody), (status = 408, body = crate::openapi::ErrorBody), (status = 409, body = crate::openapi::ErrorBody), (status = 413, body = crate::openapi::ErrorBody)))]
/// `DELETE /v1/objects/{key}`: removes the object if the token passes the
/// fence, and raises the fence even when there was nothing to remove.
pub async fn delete<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
) -> Result<Response, ApiError> {
    let key = key_of(&uri)?;
    let token = token?;
    token.require_lease(key.lease())?;
    let deleted = state.store.delete(&key, token.token).await;
    let deleted = audited(&state, key.lease(), key.as_str(), &token, &peer, deleted)?;
    Ok(Json(json!({
        "key": key.as_str(),
        "deleted": deleted.existed,
        "token": token.token.0,
    }))
    .into_response())
}
