//! The storage gateway: HTTP in front of a [`FencedStore`].
//!
//! A request flows: request id and tracing ([`router`]) → deadline
//! ([`request_deadline`]) → the caller's rights under the policy, if any
//! ([`authorize`]) → the handler of its resource ([`objects`],
//! [`fences`]) → lease-token check ([`auth::LeaseToken`], keys from [`keys`]) →
//! the store, which checks the fence and writes in one atomic, durable step.
//! [`ApiError`] is the only place a status is chosen.
//!
//! The gateway never calls the election cluster except to fetch its public
//! keys: it trusts the signed token and nothing else.

pub mod auth;
mod authorize;
mod error;
pub mod fences;
pub mod key_path;
pub mod keys;
pub mod objects;
pub mod observe;
pub mod openapi;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http::HeaderValue;
use palisade_store::FencedStore;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

pub use auth::{LeaseClaims, LeaseToken, Verifier};
pub use error::ApiError;
pub use keys::{JwksCache, KeySource};

/// Limits and timeouts of the HTTP layer.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The largest object body, in bytes. Default 1 MiB.
    pub max_value_bytes: usize,
    /// A request must be received and answered within this. Default 10 s.
    /// It is what stops a client that sends its body too slowly.
    pub request_timeout: Duration,
    /// On shutdown, in-flight requests get this long to finish. Default 10 s.
    pub drain_timeout: Duration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_value_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

impl GatewayConfig {
    /// Checks the relations between settings.
    ///
    /// # Errors
    /// A sentence naming the broken relation.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_value_bytes == 0 {
            return Err("max value size must be at least 1 byte".into());
        }
        if self.max_value_bytes > 64 * 1024 * 1024 {
            return Err("max value size must be at most 64 MiB".into());
        }
        if self.request_timeout < Duration::from_millis(10) {
            return Err("request timeout must be at least 10 ms".into());
        }
        Ok(())
    }
}

/// What every handler shares.
#[derive(Debug)]
pub struct AppState<S> {
    /// The fenced store.
    pub store: Arc<S>,
    /// Checks lease JWTs.
    pub verifier: Arc<Verifier>,
    /// Limits.
    pub config: Arc<GatewayConfig>,
    /// Who may read and write which leases' objects; `None`: everyone.
    pub policy: Option<Arc<palisade_serve::policy::Policy>>,
    /// Metrics and the fencing audit.
    pub observer: Arc<observe::Observer>,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            verifier: self.verifier.clone(),
            config: self.config.clone(),
            policy: self.policy.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// Request ids: a per-process counter, in hex.
#[derive(Debug, Clone, Default)]
struct CountingRequestId(Arc<AtomicU64>);

impl MakeRequestId for CountingRequestId {
    fn make_request_id<B>(&mut self, _request: &http::Request<B>) -> Option<RequestId> {
        let id = self.0.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("{id:x}"))
            .ok()
            .map(RequestId::new)
    }
}

/// The gateway's routes, with its middleware.
pub fn router<S: FencedStore>(state: AppState<S>) -> Router {
    let timeout = state.config.request_timeout;
    let authorize =
        axum::middleware::from_fn_with_state(state.policy.clone(), authorize::authorize);
    let routes = Router::new()
        .route(
            "/v1/objects/{*key}",
            get(objects::get::<S>)
                .put(objects::put::<S>)
                .delete(objects::delete::<S>)
                .route_layer(authorize.clone()),
        )
        .route(
            "/v1/objects/",
            get(empty_key).put(empty_key).delete(empty_key),
        )
        .route(
            "/v1/fences",
            get(fences::list::<S>).route_layer(axum::middleware::from_fn_with_state(
                state.policy.clone(),
                authorize::authorize_all,
            )),
        )
        .route(
            "/v1/fences/{*lease}",
            get(fences::get::<S>)
                .post(fences::bump::<S>)
                .route_layer(authorize),
        )
        .route("/healthz", get(livez))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state.clone())
        .layer(axum::middleware::from_fn_with_state(
            timeout,
            request_deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.observer.clone(),
            observe::measure,
        ));
    routes.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::x_request_id(CountingRequestId::default()))
            .layer(
                TraceLayer::new_for_http().make_span_with(|request: &Request| {
                    let id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("request", %id, method = %request.method(), path = %request.uri().path())
                }),
            )
            .layer(PropagateRequestIdLayer::x_request_id()),
    )
}

/// `GET /livez` (and `/healthz`): the process answers.
#[utoipa::path(get, path = "/livez", tag = "health",
    responses((status = 200, body = Object, description = "The process answers")))]
async fn livez() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Object, description = "ready"), (status = 503, body = Object, description = "not ready, with a reason")))]
/// `GET /readyz`: 200 once the store answers and the keys tokens are
/// checked with are loaded (a JWKS fetched at least once); else 503 saying
/// which.
async fn readyz<S: FencedStore>(State(state): State<AppState<S>>) -> Response {
    let probe = palisade_store::LeaseName::new("palisade-readyz").ok();
    let store_ok = match probe {
        Some(lease) => state.store.fence(&lease).await.is_ok(),
        None => false,
    };
    let keys_ok = match state.verifier.keys() {
        KeySource::Pem(_) => true,
        KeySource::Jwks(cache) => !cache.is_empty(),
    };
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
    let body = serde_json::json!({ "ready": reason.is_none(), "reason": reason });
    (status, Json(body)).into_response()
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, body = String, content_type = "application/openmetrics-text", description = "Prometheus text format")))]
async fn metrics<S: FencedStore>(State(state): State<AppState<S>>) -> Response {
    observe::metrics(State(state.observer.clone())).await
}

async fn empty_key() -> ApiError {
    ApiError::InvalidKey("key is empty".into())
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Answers 408 when a request (its body included) takes longer than `limit`.
pub async fn request_deadline(
    State(limit): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::RequestTimeout(limit.as_millis()).into_response(),
    }
}

/// Serves `app` on `listener` (over `tls` when given) until `shutdown`
/// resolves, then drains in-flight requests for at most `drain`. The
/// connection loop is `palisade_serve`'s: a connection cap, slow-header and
/// handshake timeouts, refusals logged once.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<palisade_serve::rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let mut config = palisade_serve::ServeConfig::new("gateway");
    config.drain = drain;
    config.tls = tls;
    palisade_serve::serve(listener, app, config, shutdown).await
}
