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
    // The common case, straight into the type; the detour through a
    // `Value` only when that fails (an integral float, or a real error).
    if let Ok(typed) = serde_json::from_slice(bytes) {
        return Ok(typed);
    }
    // A `Value` keeps the last of duplicate keys; the typed parse refuses
    // them, so this path must too.
    serde_json::from_slice::<NoDuplicateKeys>(bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    integral_floats_to_integers(&mut value);
    serde_json::from_value(value)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

/// Any JSON document in which no object repeats a key (deserializing one
/// that does is an error naming the key).
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NoDuplicateKeysVisitor)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(NoDuplicateKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
}

/// `7.0` is the integer 7 to JSON Schema (and to every JavaScript
/// client): numbers with no fraction become integers before typed
/// decoding, so a schema-valid body is never refused for writing one.
fn integral_floats_to_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if !n.is_u64() && !n.is_i64() => {
            if let Some(f) = n.as_f64() {
                // Exactly representable integers only (below 2^53).
                if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    *value = if f >= 0.0 {
                        serde_json::Value::from(f as u64)
                    } else {
                        serde_json::Value::from(f as i64)
                    };
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        serde_json::Value::Object(fields) => {
            fields.values_mut().for_each(integral_floats_to_integers)
        }
        _ => {}
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
    use crate::api::extract::NoDuplicateKeys;

    #[test]
    fn a_repeated_key_is_refused_at_any_depth() {
        let parse = |text: &str| serde_json::from_str::<NoDuplicateKeys>(text).is_ok();
        assert!(parse(
            r#"{"a":1,"b":[{"a":2},{"a":3}],"c":{"d":null,"e":7.0}}"#
        ));
        assert!(!parse(r#"{"holder":"a","holder":"b"}"#));
        assert!(!parse(r#"{"x":[{"k":1,"k":2}]}"#));
        assert!(!parse(r#"{"x":{"y":{"k":1,"k":2}}}"#));
    }
}
