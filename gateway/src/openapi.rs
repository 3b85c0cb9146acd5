//! The gateway's OpenAPI 3 document, generated from the handlers'
//! annotations (utoipa), served at `GET /openapi.json` and checked into
//! `docs/openapi/gateway.json` (a test fails when they differ;
//! `PALISADE_WRITE_OPENAPI=1 cargo test -p palisade-gateway openapi`
//! rewrites it).

use utoipa::OpenApi;

use crate::schema::{
    Deleted, ErrorBody, Fence, LeaseNameParam, ObjectInfo, ObjectKeyParam, ObjectList, Written,
};

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
        crate::objects::head,
        crate::listing::list,
        crate::objects::delete,
        crate::fences::get,
        crate::fences::list,
        crate::fences::bump,
        crate::health::livez,
        crate::health::readyz,
        crate::health::metrics,
    ),
    components(schemas(
        ErrorBody,
        ObjectKeyParam,
        LeaseNameParam,
        Written,
        Deleted,
        Fence,
        ObjectInfo,
        ObjectList
    ))
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
        let generated = crate::openapi::document()
            .to_pretty_json()
            .expect("serialize")
            + "\n";
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/gateway.json");
        if let Err(stale) =
            palisade_serve::checked_in::matches(&generated, &path, "palisade-gateway")
        {
            panic!("{stale}");
        }
    }
}
