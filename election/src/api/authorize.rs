//! Who may call what ([`palisade_serve::policy`]): a middleware per kind of
//! route, run before a request is forwarded to the leader and again on the
//! leader (the key travels with the forwarded request; a principal known by
//! its client certificate is named in [`PRINCIPAL_HEADER`]). A node without
//! a policy lets every call through.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use palisade_serve::policy::{Principal, Right};
use palisade_serve::PeerCertificate;
use serde::Deserialize;

use super::state::ApiState;
use super::ui::sessions::SessionPrincipal;
use crate::error::ApiError;
use crate::peer::gate::PeerId;

/// The header a follower names the principal it identified by client
/// certificate in, when it forwards a keyless request (trusted only from
/// an authenticated peer: the leader cannot see the client's certificate).
pub const PRINCIPAL_HEADER: &str = "x-palisade-principal";

/// What a route needs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Need {
    /// `right` on the lease in the path's `{name}`.
    Lease(Right),
    /// `right` on every lease under the query's `prefix`.
    Prefix(Right),
    /// Cluster changes.
    Cluster,
    /// Any known principal.
    Known,
}

/// The middleware (`from_fn_with_state((state, need), authorize)`): lets a
/// request through only if its principal has `need`; 401 or 403 otherwise.
pub(super) async fn authorize(
    State((state, need)): State<(ApiState, Need)>,
    request: Request,
    next: Next,
) -> Response {
    let Some(policy) = state.config.policy.as_ref().map(|p| p.current()) else {
        return next.run(request).await;
    };
    let (mut parts, body) = request.into_parts();
    let verdict = match identify(&policy, &parts) {
        Ok(principal) => allowed(&policy, &principal, need, &mut parts)
            .await
            .map(|()| principal),
        Err(denied) => Err(denied),
    };
    match verdict {
        Ok(principal) => {
            parts.extensions.insert(principal);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(err) => err.into_response(),
    }
}

/// The caller: by API key; else, on a request a peer forwarded, the
/// principal that peer identified (by certificate; the peer's own
/// certificate is not the caller's); else, on a status page, by its
/// session ([`SessionPrincipal`]); else by the client certificate the
/// connection verified. A cookie is never read here.
fn identify(
    policy: &palisade_serve::policy::Policy,
    parts: &http::request::Parts,
) -> Result<Principal, ApiError> {
    let keyless = !parts
        .headers
        .contains_key(palisade_serve::policy::KEY_HEADER);
    if parts.extensions.get::<PeerId>().is_some() {
        let named = parts
            .headers
            .get(PRINCIPAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|_| keyless)
            .and_then(|name| policy.principal(name));
        return match named {
            Some(principal) => Ok(principal),
            None => Ok(policy.authenticate(&parts.headers)?),
        };
    }
    // A status-page session (only the status pages' middleware sets it;
    // a key, when sent, wins).
    if let Some(SessionPrincipal(principal)) = parts.extensions.get::<SessionPrincipal>() {
        if keyless && policy.principal(&principal.0).is_some() {
            return Ok(principal.clone());
        }
    }
    let certificate = parts.extensions.get::<PeerCertificate>();
    Ok(policy.identify(&parts.headers, certificate.map(|c| c.0.as_ref()))?)
}

#[derive(Debug, Deserialize)]
struct PrefixQuery {
    #[serde(default)]
    prefix: String,
}

async fn allowed(
    policy: &palisade_serve::policy::Policy,
    principal: &Principal,
    need: Need,
    parts: &mut http::request::Parts,
) -> Result<(), ApiError> {
    match need {
        Need::Lease(right) => {
            let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, &())
                .await
                .map_err(|e| ApiError::BadRequest(format!("bad lease name: {e}")))?;
            let name = params
                .get("name")
                .ok_or_else(|| ApiError::Internal("an authorized route without {name}".into()))?;
            Ok(policy.allow(principal, right, name)?)
        }
        Need::Prefix(right) => {
            // An unparsable query is the handler's 400 to give; here it can
            // only ask for everything, which needs the right on "".
            let prefix = Query::<PrefixQuery>::try_from_uri(&parts.uri)
                .map(|Query(q)| q.prefix)
                .unwrap_or_default();
            Ok(policy.allow_prefix(principal, right, &prefix)?)
        }
        Need::Cluster => Ok(policy.allow_cluster(principal)?),
        Need::Known => Ok(()),
    }
}
