//! [`audited`]: a fenced write's store answer, with a refusal for a stale
//! token first recorded in the fencing audit ([`Observer::refused`](crate::observe::Observer::refused)).

use palisade_store::{LeaseName, Refusal, StoreError};

use crate::error::ApiError;
use crate::observe::now_unix_ms;
use crate::state::AppState;
use crate::verify::LeaseToken;

/// The caller's address, when the server knows it (not in process tests).
pub(crate) type Peer = Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>;

/// Passes a store answer through; a refusal for a stale token is first
/// recorded in the fencing audit (and logged), with the JWT's holder and
/// the caller's address.
pub(crate) async fn audited<S, T>(
    state: &AppState<S>,
    lease: &LeaseName,
    key: &str,
    token: &LeaseToken,
    peer: &Peer,
    answer: Result<T, StoreError>,
) -> Result<T, ApiError> {
    if let Err(StoreError::Stale {
        token: stale,
        fence,
    }) = &answer
    {
        state
            .observer
            .refused(
                lease.as_str(),
                Refusal {
                    token: stale.0,
                    fence: fence.0,
                    holder: token.claims.sub.clone(),
                    key: key.to_owned(),
                    peer: peer.as_ref().map(|p| p.0 .0.to_string()),
                    at_unix_ms: now_unix_ms(),
                },
            )
            .await;
    }
    Ok(answer?)
}
