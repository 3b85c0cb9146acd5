//! Who may read and write which leases' objects ([`palisade_serve::policy`],
//! the election nodes' policy file): reads need the `read` right on the
//! key's lease, writes and fence bumps the `acquire` right — on top of the
//! lease JWT, which only proves the write's token. A gateway without a
//! policy lets every request through to the JWT check.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::Method;
use palisade_serve::policy::{Denied, Policy, Right};
use std::sync::Arc;

use crate::key_path::{lease_name, object_key};
use crate::ApiError;

/// The middleware on `/v1/objects/...` and `/v1/fences/...`.
pub async fn authorize(
    State(policy): State<Option<Arc<Policy>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = policy else {
        return next.run(request).await;
    };
    match check(&policy, &request) {
        Ok(principal) => {
            let mut request = request;
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

/// The middleware on `GET /v1/fences` (every lease's refusals): the
/// `read` right on all leases.
pub async fn authorize_all(
    State(policy): State<Option<Arc<Policy>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = policy else {
        return next.run(request).await;
    };
    let verdict = policy
        .authenticate(request.headers())
        .and_then(|principal| policy.allow_prefix(&principal, Right::Read, ""));
    match verdict {
        Ok(()) => next.run(request).await,
        Err(denied) => ApiError::from(denied).into_response(),
    }
}

fn check(
    policy: &Policy,
    request: &Request,
) -> Result<palisade_serve::policy::Principal, ApiError> {
    let principal = policy.authenticate(request.headers())?;
    let path = request.uri().path();
    let lease = if path.starts_with(crate::objects::PREFIX) {
        object_key(path, crate::objects::PREFIX)?.lease().clone()
    } else {
        lease_name(path, crate::fences::PREFIX)?
    };
    let right = if request.method() == Method::GET || request.method() == Method::HEAD {
        Right::Read
    } else {
        Right::Acquire
    };
    policy.allow(&principal, right, lease.as_str())?;
    Ok(principal)
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Unauthenticated(m) => ApiError::Unauthorized(m),
            Denied::Forbidden(m) => ApiError::Forbidden(m),
        }
    }
}
