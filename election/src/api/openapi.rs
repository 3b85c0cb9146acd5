//! The election API's OpenAPI 3 document, generated from the handlers'
//! annotations and types (utoipa), served at `GET /openapi.json` and
//! checked into `docs/openapi/election.json` (a test fails when they
//! differ; `PALISADE_WRITE_OPENAPI=1 cargo test -p palisade-election
//! openapi` rewrites the file).

use axum::Json;
use utoipa::OpenApi;

use super::schema::{HolderParam, LeaseNameParam};
use crate::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade election API",
        description = "Leases with fencing tokens: acquire, renew, release, revoke, read, watch (one lease, or a prefix as a stream); cluster membership and keys; health and metrics. Under a policy every call but /v1/jwks, /livez, /readyz, /healthz, /metrics and /openapi.json needs an API key in x-palisade-key."
    ),
    paths(
        super::leases::acquire::acquire,
        super::leases::renew::renew,
        super::leases::batch::renew_batch,
        super::leases::release::release,
        super::leases::handover::handover,
        super::leases::revoke::revoke,
        super::reads::get_lease,
        super::history::history,
        super::reads::list_leases,
        super::reads::watch,
        super::prefix_watch::watch_prefix,
        super::cluster::cluster,
        super::cluster::jwks,
        super::cluster::rotate_key,
        super::members::add_member,
        super::members::remove_member,
        super::cluster::healthz,
        super::cluster::readyz,
        super::cluster::metrics,
        super::ui::page,
        super::ui::lease::page,
        super::ui::login::form,
        super::ui::login::login,
        super::ui::login::logout,
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
