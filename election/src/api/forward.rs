//! Writes and consistent reads are the leader's job: [`leader_only`] runs a
//! request here when this node leads, forwards it to the leader otherwise (at
//! most [`MAX_HOPS`] hops), and answers a fast 503 when there is no leader.

use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method};
use serde_json::Value;

use palisade_serve::admission::{Pool, Seat};
use palisade_serve::policy::Principal;

use super::admit::{seat, Admitted, Flow, CLIENT_ADDR_HEADER, OVER_SHARE_HEADER};
use super::extract::read_body;
use super::leases::acquire::{self, Forwarding};
use super::partitions::{partition_of, Caller, PartDeadline, PARTITION_PARAM};
use super::revocation::{unless_revoked, Revocation};
use super::state::ApiState;
use crate::error::ApiError;
use crate::group::Group;
use crate::peer::gate::PeerId;
use crate::raft::Acting;
use palisade_names::LeaseName;

/// Most forwards a request may take before a node answers 503.
pub const MAX_HOPS: u32 = 2;
const HOPS_HEADER: &str = "x-palisade-hops";
/// Names the leader that answered a forwarded request (the SDK follows it).
const LEADER_HEADER: &str = "x-palisade-leader";

/// What a leader-only route sends on: a call that answers within the
/// quorum timeout, or an acquire, which may wait (its body says how long)
/// and may be answered at once ([`acquire::forwarding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Any call but an acquire.
    Call,
    /// `POST /v1/leases/{name}/acquire`.
    Acquire,
    /// A call that spans partitions (the lease list, a batch renewal):
    /// with more than one partition, and none named, the node it reached
    /// serves it, asking each partition's leader for its part
    /// (`partitions.rs`; a batch renewal asks each leader node once for
    /// all the partitions it leads, `leases/renew.rs`); never through
    /// partition 0's leader, whose trouble must not stall the other
    /// partitions' parts.
    Spanning,
}

/// Runs the request here if this node leads the group it belongs to (its
/// lease's, [`ApiState::group`]; the one its `?partition=` names; else
/// group 0's);
/// otherwise forwards it to that group's leader, or answers 503 when there
/// is none (or too many hops).
pub(super) async fn leader_only(
    State((state, route)): State<(ApiState, Route)>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let lease = lease_of(&mut parts).await;
    let partition = match partition_of(&state, &parts.uri) {
        Ok(partition) => partition,
        Err(err) => return err.into_response(),
    };
    let request = Request::from_parts(parts, body);
    if route == Route::Spanning && lease.is_none() && partition.is_none() && state.partitions() > 1
    {
        return next.run(request).await;
    }
    let group = match (&lease, partition) {
        (Some(lease), _) => state.group(lease),
        (None, Some(id)) => state.group_of(id),
        (None, None) => state.group_zero(),
    };
    match group.acting_now().await {
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
    let Some((leader, addr)) = group.leader().filter(|(id, _)| *id != state.config.id) else {
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
    // through: it was authorized here, and the leader believes that.
    let mut revocation = request.extensions().get::<Revocation>().cloned();
    let ask = match (route, &lease) {
        (Route::Acquire, Some(lease)) => Some(lease),
        _ => None,
    };
    let forwarded = forward(&state, request, ask, (leader, &addr), hops + 1);
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
    ask: Forwarding,
) -> Result<(Seat, bool), ApiError> {
    let flow = parts
        .extensions
        .get::<Flow>()
        .cloned()
        .unwrap_or_else(|| Flow("unknown".into()));
    let short = || seat(state, &state.forwarding, &flow, Pool::Short);
    let upstream =
        parts.extensions.get::<PeerId>().is_some() && parts.headers.contains_key(OVER_SHARE_HEADER);
    if upstream {
        return Ok((short()?, true));
    }
    let kind = match parts.extensions.get::<Admitted>() {
        _ if !ask.wait.is_zero() => Pool::Long,
        Some(Admitted(kind)) => *kind,
        None => Pool::Short,
    };
    match seat(state, &state.forwarding, &flow, kind) {
        Err(ApiError::OverShare { .. }) if kind == Pool::Long && ask.at_once => {
            Ok((short()?, true))
        }
        taken => Ok((taken?, false)),
    }
}

/// How much longer than the leader's own deadline a forwarding node waits
/// for its answer (network and queueing on the way back).
const FORWARD_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Sends `request` to the leader's peer listener (`/forward/...`).
/// `acquire`: the lease, when the call is an acquire.
pub(super) async fn forward(
    state: &ApiState,
    request: Request,
    acquire: Option<&LeaseName>,
    (leader, addr): (crate::raft::NodeId, &str),
    hops: u32,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(body, state.config.body_deadline).await?;
    let ask = match acquire {
        Some(lease) => acquire::forwarding(state, lease, &body),
        None => Forwarding::default(),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let (_seat, over_share) = forwarding_seat(state, &parts, ask)?;
    // The leader gives up on a quorum after `quorum_timeout` and says so
    // itself; waiting a little longer lets its own answer arrive.
    let leaders_own = state.config.quorum_timeout + ask.wait + FORWARD_GRACE;
    let timeout = match parts.extensions.get::<PartDeadline>() {
        Some(PartDeadline(limit)) => (*limit).min(leaders_own),
        None => leaders_own,
    };
    let mut outgoing = state
        .dialer
        .forward(
            parts.method.clone(),
            leader,
            addr,
            &format!("/forward{path}"),
        )
        .header(HOPS_HEADER, hops.to_string())
        .header(CLIENT_ADDR_HEADER, client_addr(&parts))
        .timeout(timeout)
        .body(body);
    if over_share {
        outgoing = outgoing.header(OVER_SHARE_HEADER, "1");
    }
    if let Some(value) = parts.headers.get(header::CONTENT_TYPE) {
        outgoing = outgoing.header(header::CONTENT_TYPE, value);
    }
    // Authorized once: the principal this node identified and let through
    // goes on in its own header, and the leader believes it (it comes from
    // an authenticated peer; `credential.rs`). Only a node without a
    // policy (no principal) sends the caller's key on, for a leader that
    // has one to check.
    match parts.extensions.get::<Principal>() {
        Some(Principal(name)) => {
            outgoing = outgoing.header(super::credential::PRINCIPAL_HEADER, name);
        }
        None => {
            if let Some(key) = parts.headers.get(palisade_serve::policy::KEY_HEADER) {
                outgoing = outgoing.header(palisade_serve::policy::KEY_HEADER, key);
            }
        }
    }
    let unreachable = |e: reqwest::Error| {
        let why = crate::peer::dialer::explain(&e);
        tracing::warn!(leader, %addr, %path, %why, "a forwarded call failed");
        ApiError::NoQuorum(format!("the leader at {addr} did not answer: {why}"))
    };
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

/// Asks `group`'s leader (another node) for `path_and_query` with
/// `partition=<group>` added, as `caller`; its JSON answer. Any answer but
/// 200, or none, is a 503 naming the partition: the parts a spanning call
/// joins were checked here first, so only the partition's availability
/// can differ.
pub(super) async fn ask_leader(
    state: &ApiState,
    group: &Group,
    caller: &Caller,
    (method, path_and_query): (Method, &str),
    (body, deadline): (Option<Vec<u8>>, Option<PartDeadline>),
) -> Result<Value, ApiError> {
    let id = group.id;
    let Some((leader, addr)) = group.leader().filter(|(l, _)| *l != state.config.id) else {
        return Err(ApiError::NoQuorum(format!(
            "partition {id} has no leader known here"
        )));
    };
    let joiner = if path_and_query.contains('?') {
        '&'
    } else {
        '?'
    };
    let uri = format!("{path_and_query}{joiner}{PARTITION_PARAM}={id}");
    let asked = Asked {
        node: (leader, &addr),
        what: &format!("partition {id}'s leader"),
    };
    ask_node(state, caller, asked, (method, &uri), (body, deadline)).await
}

/// Which node [`ask_node`] asks, and what it is called in errors.
pub(super) struct Asked<'a> {
    pub(super) node: (crate::raft::NodeId, &'a str),
    pub(super) what: &'a str,
}

/// Asks another node for `uri` as `caller`, through its peer listener (one
/// hop); its JSON answer. Any answer but 200, or none, is a 503 naming
/// `asked.what`.
pub(super) async fn ask_node(
    state: &ApiState,
    caller: &Caller,
    asked: Asked<'_>,
    (method, uri): (Method, &str),
    (body, deadline): (Option<Vec<u8>>, Option<PartDeadline>),
) -> Result<Value, ApiError> {
    let what = asked.what;
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, Body::from))
        .map_err(|e| ApiError::Internal(format!("a request of {what}: {e}")))?;
    if let Some(principal) = &caller.principal {
        request.extensions_mut().insert(principal.clone());
    }
    if let Some(flow) = &caller.flow {
        request.extensions_mut().insert(flow.clone());
    }
    if let Some(deadline) = deadline {
        request.extensions_mut().insert(deadline);
    }
    let answer = forward(state, request, None, asked.node, 1).await?;
    let status = answer.status();
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::NoQuorum(format!("{what}: {e}")))?;
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status != http::StatusCode::OK {
        let message = value["message"].as_str().unwrap_or("no message");
        return Err(ApiError::NoQuorum(format!(
            "{what} answered {status}: {message}"
        )));
    }
    Ok(value)
}

/// The lease a call names in its path's `{name}`, if it names a valid one
/// (an invalid name is the handler's 400 to give, wherever it runs).
async fn lease_of(parts: &mut http::request::Parts) -> Option<LeaseName> {
    let params = RawPathParams::from_request_parts(parts, &()).await.ok()?;
    let name = params.iter().find(|(key, _)| *key == "name")?.1;
    LeaseName::new(name).ok()
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
