//! Who may call what ([`palisade_serve::policy`]): a middleware per kind of
//! route, run on the node a call comes in at, before it is forwarded to
//! the leader. A forwarded call is authorized once: the leader believes
//! the principal the forwarding peer names (`credential.rs`'s
//! `PRINCIPAL_HEADER`). A node without a policy lets every call through.
//! A call that may stay open ([`Lasting::Open`]) carries a
//! [`Revocation`], so a reload that takes away what let it through ends
//! it (`revocation.rs`).

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use palisade_serve::policy::Right;
use palisade_serve::PeerCertificate;
use serde::Deserialize;

use super::credential::{authorized_upstream, identify, Check, Credential, Presented};
use super::revocation::Revocation;
use super::state::ApiState;
use super::ui::sessions::SessionPrincipal;
use crate::error::ApiError;
use crate::peer::gate::PeerId;

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

/// Whether a route's calls answer at once or may stay open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lasting {
    /// Answered at once: a call keeps the policy it started with.
    Brief,
    /// May stay open (a watch, a waiting acquire, the renewal stream): a
    /// reload that would refuse the call ends it.
    Open,
}

/// The middleware (`from_fn_with_state((state, need, lasting), authorize)`):
/// lets a request through only if its principal has `need`; 401 or 403
/// otherwise.
pub(super) async fn authorize(
    State((state, need, lasting)): State<(ApiState, Need, Lasting)>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(live) = state.config.policy.as_ref() else {
        return next.run(request).await;
    };
    if let Some(principal) = authorized_upstream(&request) {
        request.extensions_mut().insert(principal);
        return next.run(request).await;
    }
    // A call that may stay open subscribes before it is decided, so that
    // no reload falls between the decision and the subscription.
    let changes = (lasting == Lasting::Open).then(|| live.subscribe());
    let policy = match &changes {
        Some(changes) => changes.borrow().clone(),
        None => live.current(),
    };
    let (mut parts, body) = request.into_parts();
    let presented = Presented {
        headers: &parts.headers,
        from_peer: parts.extensions.get::<PeerId>().is_some(),
        session: parts
            .extensions
            .get::<SessionPrincipal>()
            .map(|SessionPrincipal(p)| p),
        certificate: parts.extensions.get::<PeerCertificate>(),
    };
    let verdict = match identify(&policy, &presented) {
        Ok(principal) => match check(need, &mut parts).await {
            Ok(check) => check
                .allows(&policy, &principal)
                .map(|()| (principal, check)),
            Err(err) => Err(err),
        },
        Err(denied) => Err(denied),
    };
    match verdict {
        Ok((principal, check)) => {
            if let Some(changes) = changes {
                let credential = Credential::of(&parts);
                let revocation = Revocation::new(principal.clone(), credential, check, changes);
                parts.extensions.insert(revocation);
            }
            parts.extensions.insert(principal);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(err) => err.into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct PrefixQuery {
    #[serde(default)]
    prefix: String,
}

/// What `need` asks of this request: its lease or prefix read from it.
async fn check(need: Need, parts: &mut http::request::Parts) -> Result<Check, ApiError> {
    match need {
        Need::Lease(right) => {
            let Path(mut params) = Path::<HashMap<String, String>>::from_request_parts(parts, &())
                .await
                .map_err(|e| ApiError::BadRequest(format!("bad lease name: {e}")))?;
            let name = params
                .remove("name")
                .ok_or_else(|| ApiError::Internal("an authorized route without {name}".into()))?;
            Ok(Check::Lease(right, name))
        }
        Need::Prefix(right) => {
            // An unparsable query is the handler's 400 to give; here it can
            // only ask for everything, which needs the right on "".
            let prefix = Query::<PrefixQuery>::try_from_uri(&parts.uri)
                .map(|Query(q)| q.prefix)
                .unwrap_or_default();
            Ok(Check::Prefix(right, prefix))
        }
        Need::Cluster => Ok(Check::Cluster),
        Need::Known => Ok(Check::Known),
    }
}
