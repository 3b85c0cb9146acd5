//! Extractors: the preamble every lease handler shares (a valid lease name
//! from the path, a bounded JSON body checked against the node's limits), so
//! a handler starts from typed, validated input.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use http::request::Parts;
use http::{header, HeaderMap};
use palisade_names::{FencingToken, LeaseName};
use serde::de::DeserializeOwned;

use super::state::ApiState;
use crate::config::ElectionConfig;
use crate::error::ApiError;

/// The largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The `{name}` path segment, checked against the lease-name grammar.
#[derive(Debug)]
pub(super) struct LeasePath(pub LeaseName);

impl FromRequestParts<ApiState> for LeasePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("bad lease name: {e}")))?;
        LeaseName::new(&name)
            .map(Self)
            .map_err(|e| ApiError::BadRequest(e.to_string()))
    }
}

/// A request body that knows its own limits.
pub(super) trait Checked {
    /// Refuses values outside what `config` allows.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] naming the field.
    fn check(&self, config: &ElectionConfig) -> Result<(), ApiError>;
}

/// A call on one lease: its name and its checked JSON body.
#[derive(Debug)]
pub(super) struct LeaseCall<T> {
    pub lease: LeaseName,
    pub body: T,
}

impl<T: DeserializeOwned + Checked> FromRequest<ApiState> for LeaseCall<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &ApiState) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let LeasePath(lease) = LeasePath::from_request_parts(&mut parts, state).await?;
        let body: T = json_body(&parts.headers, body, state.config.body_deadline).await?;
        body.check(&state.config)?;
        Ok(Self { lease, body })
    }
}

/// A checked JSON body, for calls that name no lease.
#[derive(Debug)]
pub(super) struct CheckedJson<T>(pub T);

impl<T: DeserializeOwned + Checked> FromRequest<ApiState> for CheckedJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &ApiState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let body: T = json_body(&parts.headers, body, state.config.body_deadline).await?;
        body.check(&state.config)?;
        Ok(Self(body))
    }
}

/// Reads a whole body, at most [`MAX_BODY_BYTES`], within `deadline`
/// (`ElectionConfig::body_deadline`): a sender that stalls mid-body is
/// answered 408 and its slot freed.
pub(super) async fn read_body(body: Body, deadline: Duration) -> Result<Bytes, ApiError> {
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::BadRequest(format!(
            "body is larger than {MAX_BODY_BYTES} bytes or unreadable"
        ))),
        Err(_) => Err(ApiError::RequestTimeout(format!(
            "the request body did not arrive within {} ms",
            deadline.as_millis()
        ))),
    }
}

/// Parses a JSON body: `Content-Type: application/json`, bounded; unknown
/// fields are refused by the target types (`deny_unknown_fields`).
async fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    deadline: Duration,
) -> Result<T, ApiError> {
    if !has_media_type(headers, "application/json") {
        return Err(ApiError::BadRequest(
            "Content-Type must be application/json".into(),
        ));
    }
    let bytes = read_body(body, deadline).await?;
    parse_json(&bytes)
}

/// Whether `headers` name `media` as the body's type (parameters aside).
pub(super) fn has_media_type(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(media))
}

/// Parses one JSON document into `T` (the rules of every body: unknown
/// fields and duplicate keys refused, integral floats read as integers).
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // The common case, straight into the type (serde's derive refuses
    // unknown fields and repeated keys); the detour only when that fails.
    if let Ok(typed) = serde_json::from_slice(bytes) {
        return Ok(typed);
    }
    // The text the typed parse refused, with whole numbers written as
    // integers (`5000.0`, exactly; `whole_numbers.rs`); parsed again only
    // if that changed anything, so a real error keeps its own message.
    let refused = |e: serde_json::Error| ApiError::BadRequest(format!("invalid JSON body: {e}"));
    match crate::api::whole_numbers::rewrite(bytes) {
        Some(rewritten) => serde_json::from_slice(&rewritten).map_err(refused),
        None => serde_json::from_slice(bytes).map_err(refused),
    }
}

/// A fencing token a client names: at most `i64::MAX`, as the schema's
/// `int64` says (tokens are Raft log indexes; a larger one names no grant).
pub(super) fn check_token(token: FencingToken) -> Result<(), ApiError> {
    if i64::try_from(token.0).is_err() {
        return Err(ApiError::BadRequest(format!(
            "token must be at most {}",
            i64::MAX
        )));
    }
    Ok(())
}

/// The longest `wait_ms` the API takes (a node waits at most its own
/// `max_wait`, which may be shorter: longer waits are cut to it, as
/// Consul's blocking queries cut theirs).
pub const MAX_WAIT_MS: u64 = 60_000;

/// A `wait_ms` within the API's bound; the wait this node grants for it.
pub(super) fn check_wait(wait_ms: u64, config: &ElectionConfig) -> Result<Duration, ApiError> {
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::BadRequest(format!(
            "wait_ms must be at most {MAX_WAIT_MS}"
        )));
    }
    Ok(Duration::from_millis(wait_ms).min(config.max_wait))
}

#[cfg(test)]
mod tests {
    use crate::api::extract::parse_json;

    /// The shape of a batch renewal: a list of objects in an object.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only by the parse
    struct RenewBatch {
        renewals: Vec<Renewal>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Renewal {
        lease: String,
        holder: String,
        token: u64,
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_on_both_paths() {
        let parse = |text: &str| parse_json::<RenewBatch>(text.as_bytes()).is_ok();
        for token in ["7", "7.0"] {
            let one = format!(r#"{{"lease":"a","holder":"h","token":{token}}}"#);
            assert!(parse(&format!(r#"{{"renewals":[{one}]}}"#)), "{token}");
            let repeated = format!(r#"{{"lease":"a","holder":"h","token":{token},"lease":"b"}}"#);
            assert!(
                !parse(&format!(r#"{{"renewals":[{one},{repeated}]}}"#)),
                "{token}"
            );
            assert!(
                !parse(&format!(r#"{{"renewals":[{one}],"renewals":[{one}]}}"#)),
                "{token}"
            );
        }
    }
}
