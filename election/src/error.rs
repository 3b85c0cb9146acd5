//! [`ApiError`]: the one place the election API picks an HTTP status, and
//! [`ErrorBody`], the one shape of every error it answers — a response's
//! body, a batch entry's and a stream frame's fields, a watch's last line —
//! built here alone ([`ApiError::body`]).

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use palisade_names::FencingToken;
use serde::Serialize;

/// Every error answer: a code, a sentence, and for some codes more fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `bad_request`, `unauthorized`, `forbidden`, `not_found`, `held`,
    /// `lost`, `preempted`, `max_hold`, `lock_delay`, `conflict`,
    /// `not_caught_up`, `request_timeout`, `too_many_waiters`,
    /// `too_many_leases`, `over_quota`, `over_share`, `no_quorum`,
    /// `not_ready`, `internal`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    /// `held`: who holds the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// `held`: the holder's token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// `lock_delay`: how long the delay lasts yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Why a client request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed or out-of-range input; nothing changed.
    #[error("{0}")]
    BadRequest(String),
    /// 401 `unauthorized`: the node has a policy and the request carries no
    /// known API key.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: no record of the lease (never granted, or reclaimed), or no such
    /// route.
    #[error("{0}")]
    NotFound(String),
    /// 403 `forbidden`: the caller is authenticated but may not do this
    /// (a principal outside its rights; a peer that is not a member, or
    /// speaks for another node).
    #[error("{0}")]
    Forbidden(String),
    /// 405.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 408 `request_timeout`: the request body did not arrive within the
    /// body deadline (a slow or stalled sender holds no slot for longer).
    #[error("{0}")]
    RequestTimeout(String),
    /// 409 `held`: someone else holds the lease.
    #[error("lease is held by {holder:?}")]
    Held {
        /// The holder.
        holder: String,
        /// Its token.
        token: FencingToken,
    },
    /// 409 `conflict`: the cluster's state does not allow this change (a
    /// membership change in progress, the last voter).
    #[error("{0}")]
    Conflict(String),
    /// 409 `not_caught_up`: a node to add did not catch up as a learner in
    /// time (unreachable, or too slow); it was removed again and the voters
    /// are unchanged.
    #[error("{0}")]
    NotCaughtUp(String),
    /// 409 `lost`: the requester does not hold the lease with that token.
    #[error("{0}")]
    Lost(String),
    /// 409 `preempted`: a higher priority preempted the grant; it is not
    /// renewed and ends at its deadline (sooner if released).
    #[error("{0}")]
    Preempted(String),
    /// 409 `max_hold`: renewing would hold the grant past its max-hold; it
    /// ends at its deadline.
    #[error("{0}")]
    MaxHold(String),
    /// 409 `lock_delay`: the lease is free but held back after an expiry
    /// (with `retry_after_ms`).
    #[error("{message}")]
    LockDelay {
        /// What to say.
        message: String,
        /// How long the delay lasts yet.
        retry_after_ms: u64,
    },
    /// 429 `too_many_waiters`: this node's cap on blocking calls is reached.
    #[error("{0}")]
    TooManyWaiters(String),
    /// 429 `over_share`: the caller's principal (or address) holds its
    /// share of this node's request seats; `Retry-After` says when a seat
    /// of that pool is due to be free (`palisade_serve::admission`).
    #[error("{message}")]
    OverShare {
        /// What to say.
        message: String,
        /// When to ask again, in whole seconds (at least 1).
        retry_after_secs: u64,
    },
    /// 429 `too_many_leases`: the table is at the cluster's cap on leases
    /// and this acquire names a new one.
    #[error("{0}")]
    TooManyLeases(String),
    /// 429 `over_quota`: the caller's principal owns its quota of leases
    /// (held, or freed and not yet reclaimed) and this acquire would add one.
    #[error("{0}")]
    OverQuota(String),
    /// 503 `no_quorum`: no leader, or the leader cannot reach a quorum.
    #[error("{0}")]
    NoQuorum(String),
    /// 503 `not_ready`: the cluster has no signing key yet.
    #[error("the cluster is starting; no signing key yet")]
    NotReady,
    /// 500: logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// 429 `over_share` with the default `Retry-After` of 1 s.
    pub(crate) fn over_share(message: impl Into<String>) -> Self {
        ApiError::OverShare {
            message: message.into(),
            retry_after_secs: 1,
        }
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::Held { .. } => (StatusCode::CONFLICT, "held"),
            ApiError::Lost(_) => (StatusCode::CONFLICT, "lost"),
            ApiError::Preempted(_) => (StatusCode::CONFLICT, "preempted"),
            ApiError::MaxHold(_) => (StatusCode::CONFLICT, "max_hold"),
            ApiError::LockDelay { .. } => (StatusCode::CONFLICT, "lock_delay"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::NotCaughtUp(_) => (StatusCode::CONFLICT, "not_caught_up"),
            ApiError::TooManyWaiters(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_waiters"),
            ApiError::TooManyLeases(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_leases"),
            ApiError::OverQuota(_) => (StatusCode::TOO_MANY_REQUESTS, "over_quota"),
            ApiError::OverShare { .. } => (StatusCode::TOO_MANY_REQUESTS, "over_share"),
            ApiError::NoQuorum(_) => (StatusCode::SERVICE_UNAVAILABLE, "no_quorum"),
            ApiError::NotReady => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl ApiError {
    /// The status an answer carries.
    pub(crate) fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The body an answer carries (an internal error's detail is logged
    /// here, never sent).
    pub(crate) fn body(&self) -> ErrorBody {
        let (_, code) = self.parts();
        let mut body = ErrorBody {
            error: code.to_owned(),
            message: self.to_string(),
            holder: None,
            token: None,
            retry_after_ms: None,
        };
        match self {
            ApiError::Held { holder, token } => {
                body.holder = Some(holder.clone());
                body.token = Some(token.0);
            }
            ApiError::LockDelay { retry_after_ms, .. } => {
                body.retry_after_ms = Some(*retry_after_ms);
            }
            ApiError::Internal(detail) => tracing::error!(%detail, "request failed"),
            _ => {}
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = (self.status(), self.body());
        let retry_after = match &self {
            ApiError::OverShare {
                retry_after_secs, ..
            } => Some(http::HeaderValue::from((*retry_after_secs).max(1))),
            _ if matches!(
                status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) =>
            {
                Some(http::HeaderValue::from_static("1"))
            }
            _ => None,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(retry_after) = retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, retry_after);
        }
        response
    }
}

impl From<palisade_serve::policy::Denied> for ApiError {
    fn from(denied: palisade_serve::policy::Denied) -> Self {
        match denied {
            palisade_serve::policy::Denied::Unauthenticated(m) => ApiError::Unauthorized(m),
            palisade_serve::policy::Denied::Forbidden(m) => ApiError::Forbidden(m),
        }
    }
}

impl From<crate::raft::propose::ProposeError> for ApiError {
    fn from(err: crate::raft::propose::ProposeError) -> Self {
        match err {
            crate::raft::propose::ProposeError::NoQuorum(message) => ApiError::NoQuorum(message),
            crate::raft::propose::ProposeError::Refused(reason) => ApiError::Conflict(reason),
            crate::raft::propose::ProposeError::Fatal(detail) => ApiError::Internal(detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{ApiError, ErrorBody};
    use palisade_names::FencingToken;

    /// The fields a code adds are set here, once, for every answer that
    /// carries the body (a response, a batch entry, a stream frame).
    #[test]
    fn the_body_carries_what_its_code_adds() {
        let held = ApiError::Held {
            holder: "B".into(),
            token: FencingToken(7),
        };
        assert_eq!(
            held.body(),
            ErrorBody {
                error: "held".into(),
                message: "lease is held by \"B\"".into(),
                holder: Some("B".into()),
                token: Some(7),
                retry_after_ms: None,
            }
        );
        let delayed = ApiError::LockDelay {
            message: "wait".into(),
            retry_after_ms: 250,
        };
        assert_eq!(delayed.body().retry_after_ms, Some(250));
        assert_eq!(delayed.status().as_u16(), 409);
        let internal = ApiError::Internal("disk on fire".into()).body();
        assert_eq!(
            (internal.error.as_str(), internal.message.as_str()),
            ("internal", "internal error"),
            "the detail is logged, not sent"
        );
    }
}
