//! Who may read and write which leases' objects ([`palisade_serve::policy`],
//! the election nodes' policy file): reads need the `read` right on the
//! key's lease, writes and fence bumps the `acquire` right — on top of the
//! lease JWT, which only proves the write's token. A gateway without a
//! policy lets every request through to the JWT check.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::Method;
use palisade_serve::policy::{Denied, LivePolicy, Policy, Principal, Right};
use palisade_serve::PeerCertificate;
use std::sync::Arc;

use crate::error::ApiError;
use crate::paths::{lease_name, object_key};
use crate::{fences, objects};

/// The middleware on `/v1/objects/...` and `/v1/fences/...`.
pub async fn authorize(
    State(policy): State<Option<Arc<LivePolicy>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = policy.map(|p| p.current()) else {
        return next.run(request).await;
    };
    let verdict = check(&policy, &request);
    proceed_as(verdict, request, next).await
}

/// Runs the request as the principal found, or answers why there is none.
async fn proceed_as(
    verdict: Result<Principal, ApiError>,
    mut request: Request,
    next: Next,
) -> Response {
    match verdict {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

/// The middleware on `GET /v1/fences` (every lease's refusals): the
/// `read` right on all leases.
pub async fn authorize_all(
    State(policy): State<Option<Arc<LivePolicy>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = policy.map(|p| p.current()) else {
        return next.run(request).await;
    };
    let verdict = identify(&policy, &request)
        .and_then(|principal| policy.allow_prefix(&principal, Right::Read, ""));
    match verdict {
        Ok(()) => next.run(request).await,
        Err(denied) => ApiError::from(denied).into_response(),
    }
}

/// The middleware on `GET /v1/objects` (a listing): the caller must be
/// known; which keys it sees is the handler's (`listing.rs`), per lease.
pub async fn identify_only(
    State(policy): State<Option<Arc<LivePolicy>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = policy.map(|p| p.current()) else {
        return next.run(request).await;
    };
    let verdict = identify(&policy, &request).map_err(ApiError::from);
    proceed_as(verdict, request, next).await
}

/// The caller: by API key, else by the client certificate its TLS
/// connection verified.
fn identify(policy: &Policy, request: &Request) -> Result<Principal, Denied> {
    let certificate = request.extensions().get::<PeerCertificate>();
    policy.identify(request.headers(), certificate.map(|c| c.0.as_ref()))
}

fn check(policy: &Policy, request: &Request) -> Result<Principal, ApiError> {
    let principal = identify(policy, request)?;
    let path = request.uri().path();
    let lease = if path.starts_with(objects::PREFIX) {
        object_key(path, objects::PREFIX)?.lease().clone()
    } else {
        lease_name(path, fences::PREFIX)?
    };
    let right = if request.method() == Method::GET || request.method() == Method::HEAD {
        Right::Read
    } else {
        Right::Acquire
    };
    policy.allow(&principal, right, lease.as_str())?;
    Ok(principal)
}
