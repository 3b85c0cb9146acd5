//! The election API's OpenAPI 3 document, generated from the handlers'
//! annotations and types (utoipa), served at `GET /openapi.json` and
//! checked into `docs/openapi/election.json` (a test fails when they
//! differ; `PALISADE_WRITE_OPENAPI=1 cargo test -p palisade-election
//! openapi` rewrites the file).

use axum::Json;
use serde::Serialize;
use utoipa::OpenApi;

/// Every error answer: a code, a sentence, and for some codes more fields.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ErrorBody {
    /// `bad_request`, `unauthorized`, `forbidden`, `not_found`, `held`,
    /// `lost`, `conflict`, `too_many_waiters`, `too_many_leases`,
    /// `no_quorum`, `not_ready`, ...
    error: String,
    /// What went wrong, for people.
    message: String,
    /// `held`: who holds the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    /// `held`: the holder's token.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
}

/// A lease name: 1..=128 of `A-Z a-z 0-9 . _ -`, not `.` or `..` (the
/// schema also keeps a leading `.` out, which the servers accept).
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$", example = "orders")]
pub(super) struct LeaseNameParam(#[allow(dead_code)] String);

/// A holder name: 1..=256 characters, no control characters (what
/// `extract::check_holder` enforces; derive cannot state lengths on a
/// newtype, so the schema is written out).
#[derive(Debug)]
pub(super) struct HolderParam;

impl utoipa::PartialSchema for HolderParam {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(1))
            .max_length(Some(super::extract::MAX_HOLDER_LEN))
            .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]+$"))
            .examples(["worker-1"])
            .into()
    }
}

impl utoipa::ToSchema for HolderParam {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade election API",
        description = "Leases with fencing tokens: acquire, renew, release, revoke, read, watch; cluster membership and keys; health and metrics. Under a policy every call but /v1/jwks, /livez, /readyz, /healthz, /metrics and /openapi.json needs an API key in x-palisade-key."
    ),
    paths(
        super::leases::acquire,
        super::leases::renew,
        super::leases::renew_batch,
        super::leases::release,
        super::leases::handover,
        super::leases::revoke,
        super::reads::get_lease,
        super::reads::list_leases,
        super::reads::watch,
        super::cluster::cluster,
        super::cluster::jwks,
        super::cluster::rotate_key,
        super::cluster::add_member,
        super::cluster::remove_member,
        super::cluster::healthz,
        super::cluster::readyz,
        super::cluster::metrics,
        super::ui::page,
    ),
    components(schemas(ErrorBody, LeaseNameParam, HolderParam))
)]
#[derive(Debug)]
pub(super) struct ApiDoc;

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /openapi.json`.
pub(super) async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

#[cfg(test)]
mod tests {
    /// The checked-in document is the generated one.
    #[test]
    fn the_checked_in_openapi_document_is_current() {
        let generated = super::document().to_pretty_json().expect("serialize") + "\n";
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/election.json");
        if let Err(stale) =
            palisade_serve::checked_in::matches(&generated, &path, "palisade-election")
        {
            panic!("{stale}");
        }
    }
}
