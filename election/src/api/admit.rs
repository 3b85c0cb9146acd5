//! Admission per flow on the client API (`palisade_serve::admission`): a
//! principal — or, without a key, a remote address — takes at most its share
//! of this node's request seats; over it, a fast 429 `over_share` with
//! `Retry-After`. Renewals have seats of their own, and calls that wait are
//! counted apart from calls that answer at once.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use palisade_serve::admission::{Admission, Pool, Seat};
use palisade_serve::policy::Principal;

use super::state::ApiState;
use crate::error::ApiError;
use crate::peer::gate::PeerId;

/// The header a follower names its client's address in when it forwards a
/// request (trusted only from an authenticated peer).
pub const CLIENT_ADDR_HEADER: &str = "x-palisade-client-addr";

/// The header a follower sets on a waiting call it had no waiting seat for
/// (any value): the leader answers it at once, or with 429
/// `over_share` if it would have to wait (trusted only from a peer).
pub const OVER_SHARE_HEADER: &str = "x-palisade-over-share";

/// Whose request this is, for admission: `principal:NAME` under a policy,
/// `addr:IP` without a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow(pub String);

/// The pool a request was admitted in.
#[derive(Debug, Clone, Copy)]
pub struct Admitted(pub Pool);

impl Flow {
    /// The flow of `request`: its principal, else the client address (the
    /// one a forwarding peer names, else the connection's).
    fn of(request: &Request) -> Self {
        if let Some(Principal(name)) = request.extensions().get::<Principal>() {
            return Self(format!("principal:{name}"));
        }
        let forwarded = request
            .extensions()
            .get::<PeerId>()
            .and_then(|_| request.headers().get(CLIENT_ADDR_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let addr = forwarded.or_else(|| {
            request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip().to_string())
        });
        Self(format!("addr:{}", addr.unwrap_or_else(|| "unknown".into())))
    }

    /// The metric label: the principal's name, or `anonymous` (addresses
    /// would make the label set unbounded).
    pub(super) fn label(&self) -> &str {
        self.0.strip_prefix("principal:").unwrap_or("anonymous")
    }
}

/// Takes a seat of `kind` for `flow` in `admission`, or says why not (and
/// counts the refusal).
pub(super) fn seat(
    state: &ApiState,
    admission: &Admission,
    flow: &Flow,
    kind: Pool,
) -> Result<Seat, ApiError> {
    admission.admit(&flow.0, kind).map_err(|over| {
        let labels = vec![
            ("principal".to_owned(), flow.label().to_owned()),
            ("kind".to_owned(), over.kind.to_owned()),
        ];
        state
            .metrics
            .admission_refusals
            .get_or_create(&labels)
            .inc();
        ApiError::OverShare {
            message: over.to_string(),
            retry_after_secs: over.retry_after.as_secs(),
        }
    })
}

/// The middleware: admits the request in `kind`'s pool for its flow, holds
/// the seat until the answer is ready, and tells the handler the flow.
pub(super) async fn admit(
    State((state, kind)): State<(ApiState, Pool)>,
    mut request: Request,
    next: Next,
) -> Response {
    let flow = Flow::of(&request);
    let seat = match seat(&state, &state.admission, &flow, kind) {
        Ok(seat) => seat,
        Err(refused) => return refused.into_response(),
    };
    request.extensions_mut().insert(flow);
    request.extensions_mut().insert(Admitted(kind));
    let response = next.run(request).await;
    drop(seat);
    response
}
