//! Building answers shared by the lease calls: a grant with its JWT, and
//! the errors several calls give.

use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use palisade_names::{FencingToken, GrantSecret, Holder, LeaseName};
use rand::RngCore;

use super::super::state::ApiState;
use super::bodies::*;
use crate::error::ApiError;

/// A fresh grant secret: 256 bits from the OS RNG, base64url.
pub(in crate::api) fn generate_secret() -> Result<GrantSecret, ApiError> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    GrantSecret::new(&URL_SAFE_NO_PAD.encode(bytes))
        .map_err(|e| ApiError::Internal(format!("generated secret refused: {e}")))
}

/// Builds the answer for `lease`'s grant to `holder`, with a JWT that
/// covers its deadline (signed, or reused: [`crate::signing::TokenCache`]),
/// and `secret` for an acquire.
pub(in crate::api) fn answer_grant(
    state: &ApiState,
    lease: LeaseName,
    holder: Holder,
    token: FencingToken,
    ttl_ms: u64,
    grant_index: u64,
    secret: Option<GrantSecret>,
) -> Result<Json<Grant>, ApiError> {
    let group = state.group(&lease);
    let signer = group.signer()?;
    let (jwt, signed) = group
        .tokens
        .jwt(&signer, &lease, &holder, token, ttl_ms)
        .map_err(|e| ApiError::Internal(format!("signing failed: {e}")))?;
    if signed {
        state.metrics.jwt_signatures.inc();
    }
    Ok(Json(Grant {
        lease,
        holder,
        token,
        ttl_ms,
        jwt: jwt.to_string(),
        kid: signer.kid().to_owned(),
        grant_index,
        secret,
    }))
}

/// 409 `lost`: `request` does not name the current grant of `lease`.
pub(in crate::api) fn not_held(request: &HolderToken, lease: &LeaseName) -> ApiError {
    ApiError::Lost(format!(
        "{} does not hold {} with token {}",
        request.holder, lease, request.token
    ))
}

/// The lessor found this node no longer leading between the commit and the
/// answer.
pub(in crate::api) fn stopped_leading() -> ApiError {
    ApiError::NoQuorum("this node stopped leading; retry".into())
}
