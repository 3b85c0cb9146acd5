//! Writes and consistent reads are the leader's job: [`leader_only`] runs a
//! request here when this node leads, forwards it to the leader otherwise (at
//! most [`MAX_HOPS`] hops), and answers a fast 503 when there is no leader.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue};
use serde_json::Value;

use super::extract::read_body;
use super::state::ApiState;
use crate::error::ApiError;

/// Most forwards a request may take before a node answers 503.
pub const MAX_HOPS: u32 = 2;
const HOPS_HEADER: &str = "x-palisade-hops";
/// Names the leader that answered a forwarded request (the SDK follows it).
const LEADER_HEADER: &str = "x-palisade-leader";

/// Runs the request here if this node leads; otherwise forwards it to the
/// leader, or answers 503 when there is none (or too many hops).
pub(super) async fn leader_only(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if state.is_leader() {
        return next.run(request).await;
    }
    let hops: u32 = request
        .headers()
        .get(HOPS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let Some((leader, addr)) = state.leader().filter(|(id, _)| *id != state.config.id) else {
        return ApiError::NoQuorum("no leader is known; the cluster may lack a quorum".into())
            .into_response();
    };
    if hops >= MAX_HOPS {
        return ApiError::NoQuorum(format!(
            "request forwarded {hops} times without reaching the leader"
        ))
        .into_response();
    }
    match forward(&state, request, leader, &addr, hops + 1).await {
        Ok(mut response) => {
            response
                .headers_mut()
                .insert(LEADER_HEADER, HeaderValue::from(leader));
            response
        }
        Err(err) => err.into_response(),
    }
}

/// Sends `request` to the leader's peer listener (`/forward/...`).
async fn forward(
    state: &ApiState,
    request: Request,
    leader: crate::NodeId,
    addr: &str,
    hops: u32,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(body).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // A blocking acquire may legitimately take its `wait_ms` (bounded by the
    // leader to `max_wait`); everything else answers within the quorum timeout.
    // (`7000.0` counts: the handler reads integral floats as integers.)
    let wait = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| {
            let wait = &v["wait_ms"];
            wait.as_u64()
                .or_else(|| wait.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        })
        .map_or(Duration::ZERO, Duration::from_millis)
        .min(state.config.max_wait);
    let mut outgoing = state
        .forwarder
        .forward(
            parts.method.clone(),
            leader,
            addr,
            &format!("/forward{path}"),
        )
        .header(HOPS_HEADER, hops.to_string())
        .timeout(state.config.quorum_timeout + wait)
        .body(body);
    // The leader checks the caller's rights again (its own policy).
    for name in [
        header::CONTENT_TYPE.as_str(),
        palisade_serve::policy::KEY_HEADER,
    ] {
        if let Some(value) = parts.headers.get(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let unreachable =
        |e: reqwest::Error| ApiError::NoQuorum(format!("the leader at {addr} did not answer: {e}"));
    let answer = outgoing.send().await.map_err(unreachable)?;
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = answer.bytes().await.map_err(unreachable)?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    Ok(response)
}
