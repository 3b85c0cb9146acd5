//! The routes an orchestrator and a scraper call: `/livez` (and
//! `/healthz`), `/readyz`, `/metrics`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use palisade_store::FencedStore;
use serde::Serialize;

use crate::jwks::KeySource;
use crate::observe;
use crate::state::AppState;

/// The answer of `/livez` (the document shows it as an object).
#[derive(Debug, Serialize)]
pub(crate) struct Live {
    status: &'static str,
}

/// The answer of `/readyz` (the document shows it as an object).
#[derive(Debug, Serialize)]
struct Ready {
    ready: bool,
    /// Why not, when not.
    reason: Option<&'static str>,
    /// The signing keys this gateway trusts now (absent with `--public-key`,
    /// which trusts its one key under any `kid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<Trusted>,
}

/// The key set a JWKS-fed gateway trusts: what an operator compares with
/// the cluster's `/v1/jwks` when a token is refused as `unknown signing key`.
#[derive(Debug, Serialize)]
struct Trusted {
    /// The trusted key ids, sorted.
    kids: Vec<String>,
    /// The election log index the set is as of (a fetch never replaces it
    /// with an older one).
    applied_index: u64,
}

/// `GET /livez` (and `/healthz`): the process answers.
#[utoipa::path(get, path = "/livez", tag = "health",
    responses((status = 200, body = Object, description = "The process answers")))]
pub(crate) async fn livez() -> Json<Live> {
    Json(Live { status: "ok" })
}

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Object, description = "ready"), (status = 503, body = Object, description = "not ready, with a reason")))]
/// `GET /readyz`: 200 once the store answers and the keys tokens are
/// checked with are loaded (a JWKS fetched at least once); else 503 saying
/// which. Either way it shows the key ids trusted now.
pub(crate) async fn readyz<S: FencedStore>(State(state): State<AppState<S>>) -> Response {
    let probe = palisade_store::LeaseName::new("palisade-readyz").ok();
    let store_ok = match probe {
        Some(lease) => state.store.fence(&lease).await.is_ok(),
        None => false,
    };
    let keys = match state.verifier.keys() {
        KeySource::Pem(_) => None,
        KeySource::Jwks(cache) => {
            let (kids, applied_index) = cache.trusted();
            Some(Trusted {
                kids,
                applied_index,
            })
        }
    };
    let keys_ok = keys.as_ref().is_none_or(|trusted| !trusted.kids.is_empty());
    let reason = match (store_ok, keys_ok) {
        (false, _) => Some("the store does not answer"),
        (true, false) => Some("no signing keys fetched from the cluster yet"),
        (true, true) => None,
    };
    let status = if reason.is_none() {
        http::StatusCode::OK
    } else {
        http::StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Ready {
        ready: reason.is_none(),
        reason,
        keys,
    };
    (status, Json(body)).into_response()
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, body = String, content_type = "application/openmetrics-text", description = "Prometheus text format")))]
pub(crate) async fn metrics<S: FencedStore>(State(state): State<AppState<S>>) -> Response {
    observe::metrics(State(state.observer.clone())).await
}
