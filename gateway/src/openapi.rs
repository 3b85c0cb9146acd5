//! The gateway's OpenAPI 3 document, generated from the handlers'
//! annotations (utoipa), served at `GET /openapi.json` and checked into
//! `docs/openapi/gateway.json` (a test fails when they differ;
//! `PALISADE_WRITE_OPENAPI=1 cargo test -p palisade-gateway openapi`
//! rewrites it).

use serde::Serialize;
use utoipa::OpenApi;

/// Every error answer: a code and a sentence; `stale_token` adds the
/// token and the fence it was below.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `bad_request`, `invalid_key`, `unauthorized`, `forbidden`,
    /// `not_found`, `request_timeout`, `stale_token`, `payload_too_large`,
    /// `unavailable`.
    error: String,
    /// What went wrong, for people.
    message: String,
    /// `stale_token`: the token the write carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    /// `stale_token`: the fence it was below.
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
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
    key: String,
    /// Unique for the store's life; increases in commit order per lease.
    version: u64,
    token: u64,
}

/// A deleted object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Deleted {
    key: String,
    /// Whether there was an object.
    deleted: bool,
    token: u64,
}

/// A lease's fence, and the writes refused below it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Fence {
    lease: String,
    fence: u64,
    /// Only in `GET`: writes refused for a stale token since the gateway
    /// started, and the last one (`token`, `fence`, `holder`, `key`,
    /// `peer`, `at_unix_ms`).
    #[schema(value_type = Option<Object>)]
    refused: Option<serde_json::Value>,
}

/// The document's routes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade storage gateway",
        description = "Fenced object storage: a write needs a lease JWT (Authorization: Bearer) whose token is at least the lease's fence. Under a policy, /v1/objects and /v1/fences also need an API key in x-palisade-key."
    ),
    paths(
        crate::objects::put,
        crate::objects::get,
        crate::objects::delete,
        crate::fences::get,
        crate::fences::list,
        crate::fences::bump,
        crate::livez,
        crate::readyz,
        crate::metrics,
    ),
    components(schemas(ErrorBody, ObjectKeyParam, LeaseNameParam, Written, Deleted, Fence))
)]
#[derive(Debug)]
pub struct ApiDoc;

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

#[cfg(test)]
mod tests {
    /// The checked-in document is the generated one.
    #[test]
    fn the_checked_in_openapi_document_is_current() {
        let generated = super::document().to_pretty_json().expect("serialize") + "\n";
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/gateway.json");
        if let Err(stale) =
            palisade_serve::checked_in::matches(&generated, &path, "palisade-gateway")
        {
            panic!("{stale}");
        }
    }
}
