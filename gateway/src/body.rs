//! [`read_body`]: a request body read under a size limit.

use axum::body::{Body, Bytes};
use http::{header, HeaderMap};

use crate::error::ApiError;

/// Reads a body of at most `limit` bytes, refusing early on a larger
/// `Content-Length`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let too_large = std::error::Error::source(&err)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(format!("cannot read the body: {err}"))
        }
    })
}
