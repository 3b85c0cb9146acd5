//! [`ApiError`]: the one place where the gateway picks an HTTP status.
//!
//! Handlers return `Result<_, ApiError>`; every refusal is a JSON
//! [`ErrorBody`] `{"error": "<code>", "message": "..."}` (plus `token` and
//! `fence` for a stale write). Internal failures are logged here with their
//! detail and reach the client only as a generic message.

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use palisade_serve::policy::Denied;
use palisade_store::StoreError;

use crate::schema::ErrorBody;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the key, lease name or body breaks the rules; nothing was changed.
    #[error("{0}")]
    BadRequest(String),
    /// 400 `invalid_key`: the key or lease name is malformed.
    #[error("{0}")]
    InvalidKey(String),
    /// 400 `invalid_precondition`: a conditional header the gateway cannot
    /// honour (see `precondition.rs`).
    #[error("{0}")]
    InvalidPrecondition(String),
    /// 401: no usable lease token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the token is valid but for another lease.
    #[error("{0}")]
    Forbidden(String),
    /// 404: nothing at this key or route.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 408: the request did not arrive in time.
    #[error("request not received within {0} ms")]
    RequestTimeout(u128),
    /// 409 `stale_token`: the write's token is below the lease's fence.
    #[error("token {token} is below the fence {fence}")]
    StaleToken {
        /// The token the write carried.
        token: u64,
        /// The fence that refused it.
        fence: u64,
    },
    /// 412 `precondition_failed`: the token passed the fence, the object did
    /// not satisfy `If-Match`/`If-None-Match`; nothing changed.
    #[error("precondition failed: {}", match current {
        Some(version) => format!("the object is at version {version}"),
        None => "there is no object".to_owned(),
    })]
    PreconditionFailed {
        /// The key written (set by the handler, [`ApiError::at_key`]).
        key: Option<String>,
        /// The object's version now; `None`: no object.
        current: Option<u64>,
    },
    /// 413: the body is larger than the limit.
    #[error("body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// 503: the store refuses writes until restarted (a flush failed), or
    /// its database is unreachable, restarting, slow or fully busy.
    /// 429 `over_share`: the caller's principal (or address) holds its
    /// share of the gateway's request seats; retry shortly.
    #[error("{0}")]
    OverShare(String),
    #[error("storage is unavailable")]
    Unavailable(String),
    /// 500: anything else; the detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid_key"),
            ApiError::InvalidPrecondition(_) => (StatusCode::BAD_REQUEST, "invalid_precondition"),
            ApiError::PreconditionFailed { .. } => {
                (StatusCode::PRECONDITION_FAILED, "precondition_failed")
            }
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::StaleToken { .. } => (StatusCode::CONFLICT, "stale_token"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::OverShare(_) => (StatusCode::TOO_MANY_REQUESTS, "over_share"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl ApiError {
    /// Names `key` in a failed precondition's answer.
    pub fn at_key(self, key: &str) -> Self {
        match self {
            ApiError::PreconditionFailed { current, .. } => ApiError::PreconditionFailed {
                key: Some(key.to_owned()),
                current,
            },
            other => other,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Stale { token, fence } => ApiError::StaleToken {
                token: token.0,
                fence: fence.0,
            },
            StoreError::PreconditionFailed { current } => {
                ApiError::PreconditionFailed { key: None, current }
            }
            StoreError::InvalidKey(message) => ApiError::InvalidKey(message),
            StoreError::InvalidToken(token) => {
                ApiError::Unauthorized(format!("token {token} is out of range (1..=2^63-1)"))
            }
            StoreError::ValueTooLarge { max, .. } => ApiError::PayloadTooLarge(max),
            StoreError::Engine(detail) | StoreError::Unavailable(detail) => {
                ApiError::Unavailable(detail)
            }
        }
    }
}

impl From<palisade_store::NameError> for ApiError {
    fn from(err: palisade_store::NameError) -> Self {
        StoreError::from(err).into()
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Unauthenticated(m) => ApiError::Unauthorized(m),
            Denied::Forbidden(m) => ApiError::Forbidden(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let (token, fence) = match &self {
            ApiError::StaleToken { token, fence } => (Some(*token), Some(*fence)),
            ApiError::Unavailable(detail) | ApiError::Internal(detail) => {
                tracing::error!(%detail, %code, "request failed");
                (None, None)
            }
            _ => (None, None),
        };
        let (key, current_version) = match &self {
            ApiError::PreconditionFailed { key, current } => (key.clone(), Some(*current)),
            _ => (None, None),
        };
        let body = ErrorBody {
            error: code.to_owned(),
            message: self.to_string(),
            token,
            fence,
            key,
            current_version,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(Some(version)) = current_version {
            response
                .headers_mut()
                .insert(http::header::ETAG, http::HeaderValue::from(version));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            // Worth retrying: the store or the election cluster may be back.
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}
