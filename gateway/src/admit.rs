//! Admission per flow on the gateway (`palisade_serve::admission`): a
//! principal — or, without a key, a remote address — holds at most its
//! share of the gateway's request seats; over it, a fast 429 `over_share`
//! with `Retry-After`. So one principal's slow PUTs cannot take the seats
//! another principal's writes need. Every gateway call answers at once
//! (there is nothing to wait for), so all take seats of one pool.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use palisade_serve::admission::{Admission, Pool, Seats};
use palisade_serve::policy::Principal;

use crate::error::ApiError;

/// The gateway's admission, sized from the request cap its server enforces
/// (`max_requests`): half of it in one pool for its calls, the other half
/// for requests on their way to a refusal and for health and metrics.
pub fn admission(max_requests: usize) -> Admission {
    Admission::new(Seats {
        renew: 1,
        short: (max_requests / 2).max(1),
        long: 1,
        stream: 1,
    })
}

/// The middleware, after the policy's (which names the principal): takes a
/// seat for the request's flow until its answer is ready, or answers 429.
pub async fn admit(State(admission): State<Admission>, request: Request, next: Next) -> Response {
    let flow = match request.extensions().get::<Principal>() {
        Some(Principal(name)) => format!("principal:{name}"),
        None => match request.extensions().get::<ConnectInfo<SocketAddr>>() {
            Some(ConnectInfo(addr)) => format!("addr:{}", addr.ip()),
            None => "addr:unknown".to_owned(),
        },
    };
    match admission.admit(&flow, Pool::Short) {
        Ok(seat) => {
            let response = next.run(request).await;
            drop(seat);
            response
        }
        Err(over) => ApiError::OverShare(over.to_string()).into_response(),
    }
}
