//! Every type the gateway's OpenAPI document names: the bodies its handlers
//! answer (and build: the document shows what is sent), the path
//! parameters, and the error answers its routes share, written once.
//!
//! A doc comment on a field here is its description in the document
//! (`docs/openapi/gateway.json`, checked by a test).

use serde::Serialize;

use palisade_store::{LeaseRefusals, Refusal};

/// Every error answer: a code and a sentence; `stale_token` adds the
/// token and the fence it was below, `precondition_failed` the key and
/// the object's current version.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `bad_request`, `invalid_key`, `invalid_precondition`,
    /// `unauthorized`, `forbidden`, `not_found`, `request_timeout`,
    /// `stale_token`, `precondition_failed`, `payload_too_large`,
    /// `over_share`, `unavailable`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// `stale_token`: the token the write carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// `stale_token`: the fence it was below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// `precondition_failed`: the key written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `precondition_failed`: the object's version now (`null`: there is
    /// no object).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub current_version: Option<Option<u64>>,
}

/// An object key: `{lease}/{rest}` (percent-encode the `/` in a path
/// parameter), at most 1 024 bytes; the lease part as for lease names.
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}){1,8}$", example = "orders/state")]
pub struct ObjectKeyParam(#[allow(dead_code)] String);

/// A lease name: 1..=128 of `A-Z a-z 0-9 . _ -`, not `.` or `..` (the
/// schema also keeps a leading `.` out, which the servers accept).
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$", example = "orders")]
pub struct LeaseNameParam(#[allow(dead_code)] String);

/// A written object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Written {
    pub key: String,
    /// Unique for the store's life; increases in commit order per lease.
    pub version: u64,
    pub token: u64,
}

/// A deleted object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Deleted {
    pub key: String,
    /// Whether there was an object.
    pub deleted: bool,
    pub token: u64,
}

/// One object of a listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ObjectInfo {
    pub key: String,
    /// Its version (the `ETag` of a `GET`).
    pub version: u64,
    /// The token of the write that stored it.
    pub token: u64,
    /// The value's length in bytes.
    pub size: u64,
}

/// One page of `GET /v1/objects`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ObjectList {
    /// In key order (bytes, as UTF-8 compares); under a policy, only keys
    /// whose lease the caller may read.
    pub objects: Vec<ObjectInfo>,
    /// Pass as `after` for the next page; `null` when no key under the
    /// prefix follows.
    pub next: Option<String>,
}

/// A lease's refused writes, as `GET /v1/fences` shows them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Refusals {
    /// Writes refused for a stale token (since the gateway started, or,
    /// shared, since the database's record of the lease was made).
    pub count: u64,
    /// The latest.
    pub last: Option<Refusal>,
}

impl From<LeaseRefusals> for Refusals {
    fn from(kept: LeaseRefusals) -> Self {
        Self {
            count: kept.count,
            last: Some(kept.last),
        }
    }
}

/// A lease's fence, and the writes refused below it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Fence {
    pub lease: String,
    pub fence: u64,
    /// Only in `GET`: writes refused for a stale token since the gateway
    /// started, and the last one (`token`, `fence`, `holder`, `key`,
    /// `peer`, `at_unix_ms`).
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusals>,
}

// The error answers the routes share. A variant's doc comment would be its
// description in the document, which has none: hence plain comments.

/// The refusals of a fenced write (`PUT`/`DELETE /v1/objects/{key}`,
/// `POST /v1/fences/{lease}`): a bad key or body, no key or JWT, no right,
/// too slow, a stale token, too large, over the caller's share of seats.
#[derive(Debug, utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum WriteErrors {
    #[response(status = 400)]
    BadRequest(ErrorBody),
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    #[response(status = 403)]
    Forbidden(ErrorBody),
    #[response(status = 408)]
    RequestTimeout(ErrorBody),
    #[response(status = 409)]
    StaleToken(ErrorBody),
    #[response(status = 412)]
    PreconditionFailed(ErrorBody),
    #[response(status = 413)]
    PayloadTooLarge(ErrorBody),
    #[response(status = 429)]
    OverShare(ErrorBody),
}

/// The refusals of a read of one lease's data (`GET /v1/objects/{key}`,
/// `GET /v1/fences/{lease}`): a bad key, no API key, no right, over the
/// caller's share of seats.
#[derive(Debug, utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum ReadErrors {
    #[response(status = 400)]
    BadRequest(ErrorBody),
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    #[response(status = 403)]
    Forbidden(ErrorBody),
    #[response(status = 429)]
    OverShare(ErrorBody),
}
