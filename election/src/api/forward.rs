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

use palisade_serve::admission::{Kind, Seat};
use palisade_serve::policy::Principal;

use super::admit::{seat, Admitted, Flow, CLIENT_ADDR_HEADER, OVER_SHARE_HEADER};
use super::extract::read_body;
use super::leases::acquire::answerable_at_once;
use super::revocation::{unless_revoked, Revocation};
use super::state::ApiState;
use crate::error::ApiError;
use crate::lease_table::command::SecretHash;
use crate::peer::gate::PeerId;
use crate::raft::Acting;
use palisade_names::{GrantSecret, LeaseName};

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
    match state.group_zero().acting_now().await {
        Acting::Leads => return next.run(request).await,
        Acting::Lapsed { since } => return crate::group::lapsed(since).into_response(),
        Acting::Follows => {}
    }
    let hops: u32 = request
        .headers()
        .get(HOPS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let Some((leader, addr)) = state
        .group_zero()
        .leader()
        .filter(|(id, _)| *id != state.config.id)
    else {
        return ApiError::NoQuorum("no leader is known; the cluster may lack a quorum".into())
            .into_response();
    };
    if hops >= MAX_HOPS {
        return ApiError::NoQuorum(format!(
            "request forwarded {hops} times without reaching the leader"
        ))
        .into_response();
    }
    // A waiting call forwarded ends when a reload here revokes what let it
    // through (the leader checks it against its own policy too).
    let mut revocation = request.extensions().get::<Revocation>().cloned();
    let forwarded = forward(&state, request, leader, &addr, hops + 1);
    match unless_revoked(revocation.as_mut(), forwarded)
        .await
        .and_then(|r| r)
    {
        Ok(mut response) => {
            response
                .headers_mut()
                .insert(LEADER_HEADER, HeaderValue::from(leader));
            response
        }
        Err(err) => err.into_response(),
    }
}

/// How long a forwarded call may legitimately take beyond the quorum
/// timeout: a blocking acquire its `wait_ms` (the caller bounds it by the
/// leader's `max_wait`); everything else nothing. (`7000.0` counts: the
/// handler reads integral floats as integers.)
fn wait_of(body: &[u8]) -> Duration {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            let wait = &v["wait_ms"];
            wait.as_u64()
                .or_else(|| wait.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        })
        .map_or(Duration::ZERO, Duration::from_millis)
}

/// A seat on the forwarding connection, whose streams every caller of this
/// node shares: each flow takes at most its share of them. A waiting call
/// over its flow's share of the waiting seats goes on in a short seat if
/// it may be answered at once (a holder asking again for a grant whose
/// answer it lost must get it), to be answered so or refused by the
/// leader, and so does one that an earlier hop found over its share: then
/// `true`, for [`OVER_SHARE_HEADER`].
fn forwarding_seat(
    state: &ApiState,
    parts: &http::request::Parts,
    body: &[u8],
    wait: Duration,
) -> Result<(Seat, bool), ApiError> {
    let flow = parts
        .extensions
        .get::<Flow>()
        .cloned()
        .unwrap_or_else(|| Flow("unknown".into()));
    let short = || seat(state, &state.forwarding, &flow, Kind::Short);
    let upstream =
        parts.extensions.get::<PeerId>().is_some() && parts.headers.contains_key(OVER_SHARE_HEADER);
    if upstream {
        return Ok((short()?, true));
    }
    let kind = match parts.extensions.get::<Admitted>() {
        _ if !wait.is_zero() => Kind::Long,
        Some(Admitted(kind)) => *kind,
        None => Kind::Short,
    };
    match seat(state, &state.forwarding, &flow, kind) {
        Err(ApiError::OverShare { .. })
            if kind == Kind::Long && acquire_at_once(state, parts, body) =>
        {
            Ok((short()?, true))
        }
        taken => Ok((taken?, false)),
    }
}

/// Whether `parts` and `body` are an acquire that this node's table says
/// may be answered at once (the lease free, or the caller's own grant):
/// only those go on without a waiting seat, so a flood of waiting calls
/// over their share is refused here, at no cost to the leader or to the
/// flow's short seats.
fn acquire_at_once(state: &ApiState, parts: &http::request::Parts, body: &[u8]) -> bool {
    let name = parts
        .uri
        .path()
        .strip_prefix("/v1/leases/")
        .and_then(|rest| rest.strip_suffix("/acquire"));
    let Some(Ok(lease)) = name.map(LeaseName::new) else {
        return false;
    };
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let Some(holder) = body["holder"].as_str() else {
        return false;
    };
    let hash = body["secret"]
        .as_str()
        .and_then(|secret| GrantSecret::new(secret).ok())
        .map(|secret| SecretHash::of(&secret));
    answerable_at_once(state, &lease, holder, hash.as_ref())
}

/// Sends `request` to the leader's peer listener (`/forward/...`).
async fn forward(
    state: &ApiState,
    request: Request,
    leader: crate::raft::NodeId,
    addr: &str,
    hops: u32,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(body, state.config.body_deadline).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let wait = wait_of(&body).min(state.config.max_wait);
    let (_seat, over_share) = forwarding_seat(state, &parts, &body, wait)?;
    let mut outgoing = state
        .forwarder
        .forward(
            parts.method.clone(),
            leader,
            addr,
            &format!("/forward{path}"),
        )
        .header(HOPS_HEADER, hops.to_string())
        .header(CLIENT_ADDR_HEADER, client_addr(&parts))
        .timeout(state.config.quorum_timeout + wait)
        .body(body);
    // The leader checks the caller's rights again (its own policy): by the
    // key, or by the principal this node identified from a client
    // certificate the leader cannot see.
    if over_share {
        outgoing = outgoing.header(OVER_SHARE_HEADER, "1");
    }
    for name in [
        header::CONTENT_TYPE.as_str(),
        palisade_serve::policy::KEY_HEADER,
    ] {
        if let Some(value) = parts.headers.get(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    if !parts
        .headers
        .contains_key(palisade_serve::policy::KEY_HEADER)
    {
        if let Some(Principal(name)) = parts.extensions.get::<Principal>() {
            outgoing = outgoing.header(super::credential::PRINCIPAL_HEADER, name);
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

/// The address of the client a request came from: the one a forwarding
/// peer named (a request may take two hops), else the connection's.
fn client_addr(parts: &http::request::Parts) -> String {
    let named = parts
        .extensions
        .get::<crate::peer::gate::PeerId>()
        .and_then(|_| parts.headers.get(CLIENT_ADDR_HEADER))
        .and_then(|v| v.to_str().ok());
    match named {
        Some(addr) => addr.to_owned(),
        None => parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map_or_else(|| "unknown".into(), |info| info.0.ip().to_string()),
    }
}
