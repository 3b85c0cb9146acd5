//! Who a caller is and what its call needs, as two rules the policy is
//! asked: [`identify`] (the caller's API key, or its status-page session,
//! or its client certificate; a forwarding peer's principal is believed
//! without asking, [`authorized_upstream`]) and
//! [`Check::allows`] (its right
//! on the call's lease, prefix or the cluster). `authorize.rs` asks them of
//! every call; `revocation.rs` asks them again, with what the call
//! presented ([`Credential`]), of a call that stays open whenever a reload
//! puts a new policy in force.

use http::HeaderMap;
use palisade_serve::policy::{Policy, Principal, Right, KEY_HEADER};
use palisade_serve::PeerCertificate;

use super::ui::sessions::SessionPrincipal;
use crate::error::ApiError;
use crate::peer::gate::PeerId;

/// The header a node names the principal it identified and authorized in,
/// when it forwards a call (believed only from an authenticated peer).
pub const PRINCIPAL_HEADER: &str = "x-palisade-principal";

/// What a request presents to be identified.
#[derive(Debug, Clone, Copy)]
pub(super) struct Presented<'a> {
    /// Its headers (the key, a forwarding peer's named principal).
    pub(super) headers: &'a HeaderMap,
    /// Whether an authenticated peer forwarded it.
    pub(super) from_peer: bool,
    /// The principal of its status-page session, if the status pages'
    /// middleware found one.
    pub(super) session: Option<&'a Principal>,
    /// The client certificate its connection verified.
    pub(super) certificate: Option<&'a PeerCertificate>,
}

/// The principal a forwarding peer names: a forwarded call is authorized
/// once, on the node it came in at (under that node's policy, which also
/// ends it if a reload there takes its right away), and every node after
/// believes it. Only an authenticated peer's header counts (a client
/// sending it is never a peer; `tests/cert_principals.rs`).
pub(super) fn authorized_upstream<B>(request: &http::Request<B>) -> Option<Principal> {
    request.extensions().get::<PeerId>()?;
    let name = request.headers().get(PRINCIPAL_HEADER)?.to_str().ok()?;
    Some(Principal(name.to_owned()))
}

/// The caller: by API key (the only thing a peer that names no principal
/// can forward: it has no policy); else, on a status page, by its session
/// ([`SessionPrincipal`]); else by the client certificate the connection
/// verified. A cookie is never read here.
pub(super) fn identify(policy: &Policy, presented: &Presented) -> Result<Principal, ApiError> {
    let headers = presented.headers;
    let keyless = !headers.contains_key(KEY_HEADER);
    if presented.from_peer {
        // The peer's own certificate is not the caller's.
        return Ok(policy.authenticate(headers)?);
    }
    // A status-page session (only the status pages' middleware sets it;
    // a key, when sent, wins).
    if let Some(principal) = presented.session {
        if keyless && policy.principal(&principal.0).is_some() {
            return Ok(principal.clone());
        }
    }
    let certificate = presented.certificate.map(|c| c.0.as_ref());
    Ok(policy.identify(headers, certificate)?)
}

/// What a call presented to be identified ([`Presented`]), kept for as
/// long as it stays open: the header [`identify`] reads (not the rest
/// of the request), whether a peer forwarded it, its session's principal,
/// and the client certificate.
#[derive(Debug, Clone)]
pub(super) struct Credential {
    headers: HeaderMap,
    from_peer: bool,
    session: Option<Principal>,
    certificate: Option<PeerCertificate>,
}

impl Credential {
    /// What `parts` presented.
    pub(super) fn of(parts: &http::request::Parts) -> Self {
        let mut headers = HeaderMap::new();
        if let Some(value) = parts.headers.get(KEY_HEADER) {
            headers.insert(KEY_HEADER, value.clone());
        }
        Self {
            headers,
            from_peer: parts.extensions.get::<PeerId>().is_some(),
            session: parts
                .extensions
                .get::<SessionPrincipal>()
                .map(|SessionPrincipal(p)| p.clone()),
            certificate: parts.extensions.get::<PeerCertificate>().cloned(),
        }
    }

    /// The caller this credential is under `policy`.
    pub(super) fn identify(&self, policy: &Policy) -> Result<Principal, ApiError> {
        let presented = Presented {
            headers: &self.headers,
            from_peer: self.from_peer,
            session: self.session.as_ref(),
            certificate: self.certificate.as_ref(),
        };
        identify(policy, &presented)
    }
}

/// What one call needs of its principal, its lease or prefix resolved from
/// the request.
#[derive(Debug, Clone)]
pub(super) enum Check {
    /// `right` on the lease named.
    Lease(Right, String),
    /// `right` on every lease starting with the prefix.
    Prefix(Right, String),
    /// Cluster changes.
    Cluster,
    /// Any known principal.
    Known,
}

impl Check {
    /// Whether `policy` lets `principal` make a call that needs this.
    pub(super) fn allows(&self, policy: &Policy, principal: &Principal) -> Result<(), ApiError> {
        match self {
            Check::Lease(right, lease) => Ok(policy.allow(principal, *right, lease)?),
            Check::Prefix(right, prefix) => Ok(policy.allow_prefix(principal, *right, prefix)?),
            Check::Cluster => Ok(policy.allow_cluster(principal)?),
            // Identified under `policy`, it is known there.
            Check::Known => Ok(()),
        }
    }
}
