//! [`router`]: the gateway's routes and the middleware around them —
//! request ids and tracing, the metrics, the request deadline, the policy
//! on the resource routes — and the answers to routes that do not exist.

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
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::health::{livez, metrics, readyz};
use crate::state::AppState;
use crate::{admit, fences, listing, objects, observe, openapi, policy};

/// The gateway's routes, with its middleware.
pub fn router<S: FencedStore>(state: AppState<S>) -> Router {
    let timeout = state.config.request_timeout;
    let authorize = axum::middleware::from_fn_with_state(state.policy.clone(), policy::authorize);
    // After the policy (a layer added later runs first), so the flow is the
    // principal it found.
    let admit = axum::middleware::from_fn_with_state(
        admit::admission(state.config.max_requests),
        admit::admit,
    );
    let routes = Router::new()
        .route(
            "/v1/objects/{*key}",
            get(objects::get::<S>)
                .head(objects::head::<S>)
                .put(objects::put::<S>)
                .delete(objects::delete::<S>)
                .route_layer(admit.clone())
                .route_layer(authorize.clone()),
        )
        .route(
            "/v1/objects",
            get(listing::list::<S>)
                .route_layer(admit.clone())
                .route_layer(axum::middleware::from_fn_with_state(
                    state.policy.clone(),
                    policy::identify_only,
                )),
        )
        .route(
            "/v1/objects/",
            get(empty_key).put(empty_key).delete(empty_key),
        )
        .route(
            "/v1/fences",
            get(fences::list::<S>).route_layer(axum::middleware::from_fn_with_state(
                state.policy.clone(),
                policy::authorize_all,
            )),
        )
        .route(
            "/v1/fences/{*lease}",
            get(fences::get::<S>)
                .post(fences::bump::<S>)
                .route_layer(admit)
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
