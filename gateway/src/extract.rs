//! The [`LeaseToken`] extractor: `Authorization: Bearer <lease JWT>`,
//! verified by the state's [`Verifier`](crate::verify::Verifier).

use axum::extract::FromRequestParts;
use http::request::Parts;
use palisade_store::FencedStore;

use crate::error::ApiError;
use crate::state::AppState;
use crate::verify::LeaseToken;

impl<S: FencedStore> FromRequestParts<AppState<S>> for LeaseToken {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState<S>,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| ApiError::Unauthorized("missing Authorization header".into()))?;
        let jwt = header
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|jwt| !jwt.is_empty())
            .ok_or_else(|| {
                ApiError::Unauthorized("Authorization must be `Bearer <lease JWT>`".into())
            })?;
        state.verifier.verify(jwt).await
    }
}
