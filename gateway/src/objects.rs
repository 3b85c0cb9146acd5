//! `/v1/objects/{key}`: fenced PUT and DELETE, conditional on the object's
//! version when asked (`precondition.rs`); plain GET and HEAD.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, HeaderValue, Uri};
use palisade_store::{FencedStore, ObjectKey};

use crate::audit::{audited, Peer};
use crate::body::read_body;
use crate::error::ApiError;
use crate::paths::object_key;
use crate::precondition::precondition;
use crate::schema::{Deleted, ErrorBody, ObjectKeyParam, ReadErrors, WriteErrors, Written};
use crate::state::AppState;
use crate::verify::LeaseToken;

/// The route prefix its paths start with.
pub(crate) const PREFIX: &str = "/v1/objects/";

fn key_of(uri: &Uri) -> Result<ObjectKey, ApiError> {
    object_key(uri.path(), PREFIX)
}

/// `PUT /v1/objects/{key}`: stores the body if the token passes the fence.
#[utoipa::path(put, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded"),
        ("if-match" = Option<String>, Header, description = "Write only if the object is at this version (`12` or `\"12\"`), or exists (`*`)"),
        ("if-none-match" = Option<String>, Header, description = "`*`: write only if there is no object")),
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
    let when = precondition(&headers, false)?;
    let value = read_body(&headers, body, state.config.max_value_bytes).await?;
    let written = state
        .store
        .put_if(&key, value.to_vec(), token.token, when)
        .await;
    let written = audited(&state, key.lease(), key.as_str(), &token, &peer, written)
        .await
        .map_err(|e| e.at_key(key.as_str()))?;
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
    let object = stored(&state, &uri).await?;
    let version = object.version;
    let token = object.token;
    let mut response = object.value.into_response();
    describe(response.headers_mut(), version, token);
    Ok(response)
}

/// `HEAD /v1/objects/{key}`: what `GET` answers, without the bytes (their
/// length in `Content-Length`).
#[utoipa::path(head, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded")),
    responses((status = 200, description = "The object exists; no body",
        headers(("etag" = u64, description = "The version"), ("fencing-token" = u64, description = "The token that wrote it"), ("content-length" = u64, description = "The value's length"))),
        ReadErrors, (status = 404, description = "No object; no body")))]
pub async fn head<S: FencedStore>(
    State(state): State<AppState<S>>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let object = stored(&state, &uri).await?;
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    describe(headers, object.version, object.token);
    headers.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(object.value.len()),
    );
    Ok(response)
}

async fn stored<S: FencedStore>(
    state: &AppState<S>,
    uri: &Uri,
) -> Result<palisade_store::StoredObject, ApiError> {
    let key = key_of(uri)?;
    state
        .store
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no object at {:?}", key.as_str())))
}

/// The headers that describe an object: its type, version and token.
fn describe(headers: &mut HeaderMap, version: u64, token: palisade_store::FencingToken) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::ETAG, HeaderValue::from(version));
    headers.insert("fencing-token", HeaderValue::from(token.0));
}

#[utoipa::path(delete, path = "/v1/objects/{key}", tag = "objects", params(("key" = ObjectKeyParam, Path, description = "The object key, `/` percent-encoded"),
        ("if-match" = Option<String>, Header, description = "Delete only if the object is at this version (`12` or `\"12\"`), or exists (`*`)")),
    responses((status = 200, body = Deleted), WriteErrors))]
/// `DELETE /v1/objects/{key}`: removes the object if the token passes the
/// fence, and raises the fence even when there was nothing to remove.
pub async fn delete<S: FencedStore>(
    State(state): State<AppState<S>>,
    peer: Peer,
    uri: Uri,
    token: Result<LeaseToken, ApiError>,
    headers: HeaderMap,
) -> Result<Json<Deleted>, ApiError> {
    let key = key_of(&uri)?;
    let token = token?;
    token.require_lease(key.lease())?;
    let when = precondition(&headers, true)?;
    let deleted = state.store.delete_if(&key, token.token, when).await;
    let deleted = audited(&state, key.lease(), key.as_str(), &token, &peer, deleted)
        .await
        .map_err(|e| e.at_key(key.as_str()))?;
    Ok(Json(Deleted {
        key: key.as_str().to_owned(),
        deleted: deleted.existed,
        token: token.token.0,
    }))
}
