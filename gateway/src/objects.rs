//! `/v1/objects/{key}`: fenced PUT and DELETE, plain GET.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, HeaderValue, Uri};
use palisade_store::{FencedStore, ObjectKey};

use crate::audit::{audited, Peer};
use crate::auth::LeaseToken;
use crate::body::read_body;
use crate::error::ApiError;
use crate::key_path::object_key;
use crate::schema::{Deleted, ErrorBody, ObjectKeyParam, ReadErrors, WriteErrors, Written};
use crate::state::AppState;

/// The route prefix its paths start with.
pub(crate) const PREFIX: &str = "/v1/objects/";

fn key_of(uri: &Uri) -> Result<ObjectKey, ApiError> {
    object_key(uri.path(), PREFIX)
}

/// `PUT /v1/objects/{key}`: stores the body if the token passes the fence.
#[utoipa::path(put, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = Written), WriteErrors))]
pub async fn put<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Written>, ApiError> {
    let key = key_of(&uri)?;
    let token = token?;
    token.require_lease(key.lease())?;
    let value = read_body(&headers, body, state.config.max_value_bytes).await?;
    let written = state.store.put(&key, value.to_vec(), token.token).await;
    let written = audited(&state, key.lease(), key.as_str(), &token, &peer, written).await?;
    Ok(Json(Written {
        key: key.as_str().to_owned(),
        version: written.version,
        token: token.token.0,
    }))
}

/// `GET /v1/objects/{key}`: the bytes, with `ETag` and `Fencing-Token`.
#[utoipa::path(get, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    responses((status = 200, body = Vec<u8>, content_type = "application/octet-stream",
        headers(("etag" = u64, description = "The version"), ("fencing-token" = u64, description = "The token that wrote it"))),
        ReadErrors, (status = 404, body = ErrorBody)))]
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

#[utoipa::path(delete, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    responses((status = 200, body = Deleted), WriteErrors))]
/// `DELETE /v1/objects/{key}`: removes the object if the token passes the
/// fence, and raises the fence even when there was nothing to remove.
pub async fn delete<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
) -> Result<Json<Deleted>, ApiError> {
    let key = key_of(&uri)?;
    let token = token?;
    token.require_lease(key.lease())?;
    let deleted = state.store.delete(&key, token.token).await;
    let deleted = audited(&state, key.lease(), key.as_str(), &token, &peer, deleted).await?;
    Ok(Json(Deleted {
        key: key.as_str().to_owned(),
        deleted: deleted.existed,
        token: token.token.0,
    }))
}
